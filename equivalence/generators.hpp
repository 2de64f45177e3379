// RapidCheck generators of the harness's cases, by domain rather than by filtering: every value
// drawn is a valid case (STYLE). Small on purpose (a tiny model's double update takes ~5 ms) so
// hundreds of cases run in seconds; each case prints as one line naming its parameters.
//
//   model      layers 1-2, heads 1-4 with head dim 2 or 4, groups dividing heads, ffn, padded
//              vocab 258 or 384, biases, tied or untied;
//   documents  lengths 0 (empty) and 1 (a lone EOD) up to longer than two windows, lengths that
//              put EODs on window edges, runs of lone EODs (windows without loss tokens), concat
//              or unit packing (padding), sequential or shuffled order, each SPEC 3 flag on/off,
//              a single loss token in the global batch;
//   batches    mbs, microbatches and DP size of the twin under test and of the reference; the
//              test's TP (1, 2 or 4 where heads, F and the padded vocabulary divide, and groups
//              divide or are divided: G < TP shares each group) and
//              sequence parallelism;
//   optimizer  betas, eps, weight decay, clipping off / inactive / active / just above and just
//              below its threshold;
//   schedule   style, warmup, decay, and the position of the first update: the very first, the
//              end of warmup, the end of decay, beyond the decay;
//   precision  fp32 or bf16 compute (what production runs; the reference ignores it);
//   injection  a non-finite (or huge, or ordinary) value written into one gradient element.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <rapidcheck.h>

#include "core/config.hpp"
#include "reference/trainer.hpp"

namespace tandem::equivalence {

struct DocumentLayout {
  std::vector<std::int64_t> lengths;  // tokens per document, EOD included; 0 = empty document
  std::int32_t alphabet = 16;         // token ids in [0, alphabet) before the EOD
  std::uint64_t token_seed = 1;       // the tokens' counter-based stream
  // A boundary case (SPEC 5's per-token denominator at 1): every loss position of a global batch
  // cleared but one, the first loss token of the batch's first sample that has any (a batch
  // without loss tokens keeps none). The samples' masks are edited after SPEC 3 made them.
  bool single_loss_token = false;
};

struct BatchLayout {
  std::int64_t micro_batch_size = 1;
  std::int64_t microbatches = 1;  // per replica
  std::int64_t data_parallel = 1;
  // The twin under test's tensor parallelism (production; the reference has none: SPEC 13).
  std::int64_t tensor_parallel = 1;
  bool sequence_parallel = false;
  // ... and its pipeline parallelism: stages and model chunks per stage (core/pipeline_layout.hpp).
  std::int64_t pipeline_parallel = 1;
  std::int64_t virtual_stages = 1;
  std::int64_t global_batch_size() const { return micro_batch_size * microbatches * data_parallel; }
};

enum class ClipMode { off, inactive, active, just_above_threshold, just_below_threshold };
enum class SchedulePosition { first_update, end_of_warmup, end_of_decay, beyond_decay };
std::string to_string(ClipMode mode);
std::string to_string(SchedulePosition position);

struct Injection {
  std::int64_t iteration = 0;  // 1-based iteration of the case; 0 = none
  std::int64_t element = 0;    // flat element (taken modulo P)
  double value = 0;            // from our IEEE generator
  bool on_loss = false;        // the global loss becomes `value` instead of a gradient element
};

// One case: a run (model, optimizer, schedule, data rules), its documents, the two layouts, the
// clip mode and schedule position (resolved against the run when it starts), an injection and
// the number of updates.
struct UpdateCase {
  RunConfig config;           // batch/parallel sections: the reference's layout
  DocumentLayout documents;
  BatchLayout reference_layout;
  BatchLayout test_layout;    // same global batch size
  ClipMode clip = ClipMode::off;
  SchedulePosition position = SchedulePosition::first_update;
  Injection injection;
  std::int64_t updates = 1;
};

// A one-line name built from the parameters, e.g.
// "L2 d8 H2 G1 F8 V258 bias tied | seq 8 docs[3,1,17] units seq-order | ref 1x8x1 test 2x2x2 |
//  b1 0.9 b2 0.95 eps 1e-08 wd 0.1 clip active | cosine W16 D48 @end_of_warmup | bf16 | nan@2 | k 2"
std::string case_name(const UpdateCase& c);
void showValue(const UpdateCase& c, std::ostream& os);

// What each property needs varied.
struct CaseLimits {
  std::int64_t max_updates = 3;
  bool injections = false;       // draw an injection (always, at some iteration)
  bool require_injection = false;
};
rc::Gen<UpdateCase> update_case(const CaseLimits& limits = {});

// Every (mbs, microbatches, DP) whose product is `gbs`, the direct global batch (gbs, 1, 1) first.
std::vector<BatchLayout> all_layouts(std::int64_t gbs);

// The layout's data-parallel part: the same replicas, microbatches and mbs, TP 1 (the reference's
// layout for a twin's: the reference has no model parallelism, SPEC 13).
// The layout without its model chunks when Megatron's interleaved schedule would refuse its
// microbatches per replica (core/pipeline_layout.hpp interleaved_schedule_problem).
BatchLayout interleaving_kept_valid(BatchLayout layout);
BatchLayout without_model_parallelism(BatchLayout layout);

// The TP sizes a model can be split over (1 always): H, F and the padded vocabulary divisible, G a
// multiple or a divisor (G < TP: each key/value group shared by TP/G ranks), at most `largest`.
std::vector<std::int64_t> tensor_parallel_sizes(const ModelConfig& model, std::int64_t largest = 4);
// The (stages, chunks a stage) pipeline layouts of PP 1, 2, 4 whose virtual stages divide the
// layers (Megatron's even split), (1, 1) first.
std::vector<std::pair<std::int64_t, std::int64_t>> pipeline_layouts(const ModelConfig& model);

// The run config of `c` laid out as `layout` (batch and parallel sections).
RunConfig with_layout(RunConfig config, const BatchLayout& layout);

// Scheduler samples at the case's starting position (a multiple of GBS).
std::int64_t starting_samples(const UpdateCase& c);

// The shipped samples of the case's documents: an indexed dataset written once to a temporary
// directory (/dev/shm when present), read by data::SampleSource with the run's data section
// (SPEC 2, 3); with `single_loss_token`, the masks then edited per global batch of the run's GBS.
// The provider owns the dataset; its files are removed once mapped.
reference::SampleProvider shipped_samples(const RunConfig& config, const DocumentLayout& documents);

}  // namespace tandem::equivalence
