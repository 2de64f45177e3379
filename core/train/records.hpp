// What every trainer reports: the cumulative counters (SPEC 1), one record per iteration and the
// audit entries (SPEC 12), and the JSON Lines log they are written to. Shared by both twins so
// their logs are comparable field by field.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem {

// SPEC 1: cumulative counters, logged every iteration and saved in checkpoints.
struct Counters {
  std::int64_t iteration = 0;           // iterations run, skipped ones included
  std::int64_t consumed_samples = 0;    // samples read, skipped iterations included
  std::int64_t successful_updates = 0;  // = AdamW step count t
  std::int64_t skipped_updates = 0;     // non-finite loss or norm (SPEC 8)
  std::int64_t consecutive_skips = 0;   // skips since the last successful update
  std::int64_t input_tokens = 0;        // non-PAD input positions
  std::int64_t loss_tokens = 0;         // positions with loss mask 1
  std::int64_t pad_tokens = 0;          // PAD input positions
  // Samples seen by the lr scheduler: advances by GBS only after a successful update (SPEC 8).
  std::int64_t scheduler_samples = 0;
  // Validation samples evaluated so far (Megatron's consumed_valid_samples): the next evaluation
  // batch starts here. Grows by GBS per evaluation batch; 0 in checkpoints written before it.
  std::int64_t consumed_valid_samples = 0;

  bool operator==(const Counters&) const = default;
};
void to_json(nlohmann::json& out, const Counters& counters);
void from_json(const nlohmann::json& in, Counters& counters);

// One audited parameter element's update (--audit-params): enough to recompute it (SPEC 7).
struct AuditEntry {
  std::string tensor;        // Hugging Face name
  std::int64_t element = 0;  // index within the tensor
  std::string group;         // "decay" or "no_decay"
  double old_value = 0;      // main weight before the update
  double grad = 0;           // main gradient after reduction and clipping
  double old_m = 0, old_v = 0;  // moments before the update
  double m = 0, v = 0;          // moments after the update
  double lr = 0, wd = 0;        // wd is 0 for the no-decay group
  std::int64_t step = 0;        // t of this update (>= 1)
  double new_value = 0;         // main weight after the update
};
void to_json(nlohmann::json& out, const AuditEntry& entry);
void from_json(const nlohmann::json& in, AuditEntry& entry);

// SPEC 12: one record per iteration.
struct IterationRecord {
  std::int64_t iteration = 0;         // 1-based
  std::int64_t consumed_samples = 0;  // after this iteration
  double lr = 0;                      // used by this update (held by the scheduler if skipped)
  double wd = 0;
  double loss = 0;                    // global token-weighted mean masked CE (SPEC 5)
  double grad_norm = 0;               // pre-clip global norm (SPEC 6)
  double clip_coeff = 1;              // factor applied: min(1, coeff); 1 when clipping is off
  bool clipped = false;
  bool update_successful = true;
  std::int64_t step = 0;              // AdamW step count after this iteration
  std::int64_t input_tokens = 0;      // this iteration
  std::int64_t loss_tokens = 0;
  std::int64_t pad_tokens = 0;
  Counters totals;                    // cumulative after this iteration
  double seconds = 0;                 // wall time of the iteration
  double tokens_per_second = 0;       // input tokens / seconds
  // Production only (docs/PRODUCTION.md "Throughput"): model FLOPs of this iteration (6N per
  // position plus attention over unmasked pairs) and MFU = FLOPs / seconds / the device's dense
  // peak; mfu is absent where the peak is unknown (the cpu backend). Absent in reference logs.
  std::optional<double> model_flops;
  std::optional<double> mfu;
  std::vector<AuditEntry> audit;      // --audit-params entries of this update
};
void to_json(nlohmann::json& out, const IterationRecord& record);

// Megatron's PPL: exp of the loss, the exponent capped at 20 so a diverged run prints a number.
double evaluation_perplexity(double loss);

// {"type":"evaluation", ...}: one evaluation of the validation split (docs/DATA.md section 12):
// `eval_iters` forward-only global batches, loss = their masked CE sum / their loss tokens.
struct EvaluationRecord {
  std::int64_t iteration = 0;               // training iterations done when it ran
  bool at_end = false;                      // the evaluation after the last iteration
  double loss = 0;                          // total masked CE / total loss tokens; 0 without any
  double ppl = 1;                           // evaluation_perplexity(loss)
  std::int64_t samples = 0;                 // validation samples read: eval_iters x GBS
  std::int64_t loss_tokens = 0;             // positions with loss mask 1 among them
  std::int64_t consumed_valid_samples = 0;  // after this evaluation
  double seconds = 0;                       // wall time of the evaluation
};
void to_json(nlohmann::json& out, const EvaluationRecord& record);

// Appends JSON Lines records to a file and flushes after each one, so a crash loses at most the
// record being written.
class JsonlLog {
 public:
  JsonlLog() = default;
  // Opens `path` for appending (a resumed run continues its log); throws naming the path.
  explicit JsonlLog(const std::string& path, bool append);
  bool is_open() const { return file_.is_open(); }
  void write(const nlohmann::json& record);

 private:
  std::ofstream file_;
  std::string path_;
};

}  // namespace tandem
