// Megatron's assignment of decoder layers to pipeline stages and their model chunks. Pure
// arithmetic, shared by the planner (memory per stage, `tandem plan --rank R`) and the production
// trainer's stages.
//
// A pipeline rank p of PP holds v model chunks (v = 1 without interleaving); the run's virtual
// stages are ordered chunk-major, (chunk 0: ranks 0..PP-1), (chunk 1: ranks 0..PP-1), ..., and
// each takes the next run of consecutive layers. How many layers each virtual stage takes is
// Megatron Core's get_num_layers_to_build (transformer_block.py):
//   - even split: L / (PP v) each;
//   - --decoder-first/last-pipeline-num-layers F / E: rank 0 (PP-1) takes F / v (E / v) per chunk,
//     the other ranks share the rest evenly, (L - F - E) / (PP - 2 or - 1) / v per chunk;
//   - --account-for-embedding/loss-in-pipeline-split: the embedding (the loss) counts as one
//     layer of the first (last) virtual stage: (L + 1 or 2) / (PP v) per virtual stage, one fewer
//     decoder layer in that stage.
// The offset of each virtual stage, the sum of the layers before it, is Megatron's
// get_transformer_layer_offset (transformer_layer.py); tests/pipeline_layout_test.cpp holds the
// two against each other. The embedding lives in chunk 0 of rank 0, the final norm, output layer
// and loss in chunk v-1 of rank PP-1 (with tied embeddings that rank keeps its own copy of the
// embedding matrix: production/pipeline and SPEC 6).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace tandem {

// The options that decide the split (ParallelConfig's pipeline fields, ModelConfig's L).
struct PipelineSplit {
  std::int64_t num_layers = 1;            // L
  std::int64_t pipeline = 1;              // PP
  std::int64_t virtual_stages = 1;        // v: model chunks per pipeline rank (1 = not interleaved)
  std::int64_t first_stage_layers = 0;    // --decoder-first-pipeline-num-layers; 0 = not set
  std::int64_t last_stage_layers = 0;     // --decoder-last-pipeline-num-layers; 0 = not set
  bool account_for_embedding = false;     // --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;          // --account-for-loss-in-pipeline-split
  bool operator==(const PipelineSplit&) const = default;
};

PipelineSplit pipeline_split(const ModelConfig& model, const ParallelConfig& parallel);

// Layers [begin, end) of the decoder stack.
struct LayerRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  bool operator==(const LayerRange&) const = default;
};

class PipelineStages {
 public:
  // Throws ConfigError (core/config_issue.hpp) with every broken rule of Megatron's (arguments.py,
  // TransformerConfig.__post_init__), each naming the option, its value, the rule and the fix.
  explicit PipelineStages(const PipelineSplit& split);

  std::int64_t pipeline_size() const { return split_.pipeline; }
  std::int64_t virtual_stages() const { return split_.virtual_stages; }
  const PipelineSplit& split() const { return split_; }

  // The layers of model chunk `chunk` on pipeline rank `stage`; may be empty (a stage that holds
  // only the embedding or the loss). Throws std::out_of_range outside [0, PP) x [0, v).
  LayerRange layers(std::int64_t stage, std::int64_t chunk) const;
  // Every layer rank `stage` holds, over its chunks.
  std::int64_t layers_on(std::int64_t stage) const;
  // The pipeline rank and chunk that hold decoder layer `layer`.
  std::int64_t stage_of_layer(std::int64_t layer) const { return virtual_stage_of_layer(layer) % split_.pipeline; }
  std::int64_t chunk_of_layer(std::int64_t layer) const { return virtual_stage_of_layer(layer) / split_.pipeline; }

  // The embedding is the input of chunk 0 on rank 0; the final norm, output layer and loss end
  // chunk v-1 on rank PP-1.
  static bool holds_embedding(std::int64_t stage, std::int64_t chunk) { return stage == 0 && chunk == 0; }
  bool holds_output(std::int64_t stage, std::int64_t chunk) const {
    return stage == split_.pipeline - 1 && chunk == split_.virtual_stages - 1;
  }

  // "layers 0-11" / "layers 0-5 and 48-53" / "no layer" for `tandem plan --rank R`.
  std::string describe(std::int64_t stage) const;

 private:
  std::int64_t virtual_stage_of_layer(std::int64_t layer) const;  // its index in ranges_; throws outside

  PipelineSplit split_;
  std::vector<LayerRange> ranges_;  // [v * PP], chunk-major: index chunk * PP + stage
};

// Why Megatron would refuse its interleaved schedule for `microbatches` per replica on `stages`
// pipeline stages, or "" when it runs: its microbatch_group_size_per_vp_stage (here always its
// default, the stages) must lie in [stages, microbatches], and the last group be whole or hold
// at least `stages` (schedules.py forward_backward_pipelining_with_interleaving).
std::string interleaved_schedule_problem(std::int64_t stages, std::int64_t microbatches);

}  // namespace tandem
