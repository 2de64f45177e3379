// Megatron's layers per pipeline stage and model chunk (pipeline_layout.hpp).
#include "core/pipeline_layout.hpp"

#include <stdexcept>

#include "core/config_issue.hpp"

namespace tandem {
namespace {

std::string text(std::int64_t value) { return std::to_string(value); }

// Layers per virtual stage, [v * PP] chunk-major, before the offsets; Megatron's
// get_num_layers_to_build. Only called on a split that passed check_split.
std::vector<std::int64_t> layers_per_virtual_stage(const PipelineSplit& s) {
  const std::int64_t pp = s.pipeline;
  const std::int64_t v = s.virtual_stages;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(pp * v), 0);
  const bool uneven = s.first_stage_layers > 0 || s.last_stage_layers > 0;
  std::int64_t per_rank_middle = 0;
  if (uneven) {
    const std::int64_t middle_layers = s.num_layers - s.first_stage_layers - s.last_stage_layers;
    const std::int64_t middle_stages = pp - (s.first_stage_layers > 0) - (s.last_stage_layers > 0);
    per_rank_middle = middle_stages > 0 ? middle_layers / middle_stages : 0;
  }
  const std::int64_t accounted = s.num_layers + s.account_for_embedding + s.account_for_loss;
  for (std::int64_t chunk = 0; chunk < v; ++chunk) {
    for (std::int64_t stage = 0; stage < pp; ++stage) {
      std::int64_t per_rank = uneven ? per_rank_middle : accounted / pp;
      if (uneven && stage == 0 && s.first_stage_layers > 0) per_rank = s.first_stage_layers;
      if (uneven && stage == pp - 1 && s.last_stage_layers > 0) per_rank = s.last_stage_layers;
      std::int64_t count = per_rank / v;
      // The embedding (loss) stands in for a layer of the first (last) virtual stage.
      if (!uneven && s.account_for_embedding && stage == 0 && chunk == 0) --count;
      if (!uneven && s.account_for_loss && stage == pp - 1 && chunk == v - 1) --count;
      counts[static_cast<std::size_t>(chunk * pp + stage)] = count;
    }
  }
  return counts;
}

// Megatron's rules (arguments.py validate_args, TransformerConfig.__post_init__), all at once.
void check_split(const PipelineSplit& s) {
  std::vector<ConfigIssue> issues;
  const auto check = [&issues](bool ok, std::string field, std::string value, std::string rule, std::string fix) {
    if (!ok) issues.push_back({std::move(field), std::move(value), std::move(rule), std::move(fix)});
  };
  const std::int64_t pp = s.pipeline;
  const std::int64_t v = s.virtual_stages;
  if (s.num_layers < 1 || pp < 1 || v < 1 || s.first_stage_layers < 0 || s.last_stage_layers < 0) {
    check(false, "--num-layers / --pipeline-model-parallel-size",
          text(s.num_layers) + " / " + text(pp) + " (" + text(v) + " chunks)",
          "layer and stage counts must be positive", "give positive sizes");
    throw ConfigError(issues);
  }
  const bool uneven = s.first_stage_layers > 0 || s.last_stage_layers > 0;
  check(v == 1 || pp > 1, "--num-virtual-stages-per-pipeline-rank", text(v),
        "interleaving needs --pipeline-model-parallel-size > 1 (Megatron)", "drop it or raise PP");
  check(!uneven || pp > 1, uneven && s.first_stage_layers > 0 ? "--decoder-first-pipeline-num-layers"
                                                               : "--decoder-last-pipeline-num-layers",
        text(s.first_stage_layers > 0 ? s.first_stage_layers : s.last_stage_layers),
        "an uneven first or last stage needs --pipeline-model-parallel-size > 1", "drop it or raise PP");
  check(!(uneven && (s.account_for_embedding || s.account_for_loss)),
        s.account_for_embedding ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split",
        "true",
        "cannot be set together with --decoder-first/last-pipeline-num-layers (Megatron)",
        "use one way of balancing the stages");
  if (!issues.empty()) throw ConfigError(issues);

  if (uneven) {
    std::int64_t middle_layers = s.num_layers;
    std::int64_t middle_stages = pp;
    for (const auto& [field, layers] : {std::pair{"--decoder-first-pipeline-num-layers", s.first_stage_layers},
                                        std::pair{"--decoder-last-pipeline-num-layers", s.last_stage_layers}}) {
      if (layers == 0) continue;
      check(layers % v == 0, field, text(layers),
            "must be divisible by the model chunks per pipeline rank (" + text(v) + ") (Megatron)",
            "give a multiple of " + text(v));
      middle_layers -= layers;
      --middle_stages;
    }
    check(middle_layers >= 0, "--decoder-first-pipeline-num-layers + --decoder-last-pipeline-num-layers",
          text(s.first_stage_layers + s.last_stage_layers),
          "exceeds --num-layers (" + text(s.num_layers) + ")", "give the first and last stages fewer layers");
    if (middle_layers >= 0) {
      check((middle_layers > 0) == (middle_stages > 0), "--num-layers", text(s.num_layers),
            text(middle_layers) + " layers are left for " + text(middle_stages) +
                " middle stages; both must be zero or neither (Megatron)",
            "change the first and last stages' layers so the middle stages get some, or none");
      if (middle_stages > 0 && middle_layers > 0) {
        check(middle_layers % middle_stages == 0, "--num-layers", text(s.num_layers),
              "the " + text(middle_layers) + " layers between the first and last stage must divide evenly over the " +
                  text(middle_stages) + " middle stages (Megatron)",
              "change --num-layers or the first and last stages' layers");
        check(middle_layers % middle_stages != 0 || (middle_layers / middle_stages) % v == 0, "--num-layers",
              text(s.num_layers),
              "each middle stage's " + text(middle_layers / middle_stages) +
                  " layers must divide into the model chunks per rank (" + text(v) + ") (Megatron)",
              "change the layer counts or the chunks per rank");
      }
    }
  } else {
    const std::int64_t accounted = s.num_layers + s.account_for_embedding + s.account_for_loss;
    const std::string counted = s.account_for_embedding || s.account_for_loss
                                    ? " (" + text(accounted) + " with the embedding/loss counted as layers)"
                                    : "";
    check(accounted % pp == 0, "--num-layers", text(s.num_layers) + counted,
          "must be divisible by --pipeline-model-parallel-size (" + text(pp) + ")",
          "choose L a multiple of PP, or give the first and last stages their own counts "
          "(--decoder-first/last-pipeline-num-layers)");
    if (accounted % pp == 0) {
      check((accounted / pp) % v == 0, "--num-layers", text(s.num_layers) + counted,
            "each pipeline rank's " + text(accounted / pp) + " layers must divide into its model chunks (" +
                text(v) + ") (Megatron)",
            "choose the chunks per rank a divisor of L / PP");
      const std::int64_t per_chunk = accounted / pp / v;
      check(per_chunk >= (s.account_for_embedding ? 1 : 0) && per_chunk >= (s.account_for_loss ? 1 : 0),
            "--num-layers", text(s.num_layers) + counted,
            "a virtual stage holds " + text(per_chunk) + " layers, fewer than the embedding or loss it must count",
            "use more layers or fewer stages");
    }
  }
  if (!issues.empty()) throw ConfigError(issues);
}

}  // namespace

PipelineSplit pipeline_split(const ModelConfig& model, const ParallelConfig& parallel) {
  PipelineSplit split;
  split.num_layers = model.num_layers;
  split.pipeline = parallel.pipeline_parallel;
  split.virtual_stages = parallel.virtual_pipeline_stages;
  split.first_stage_layers = parallel.first_pipeline_stage_layers;
  split.last_stage_layers = parallel.last_pipeline_stage_layers;
  split.account_for_embedding = parallel.account_for_embedding_in_pipeline_split;
  split.account_for_loss = parallel.account_for_loss_in_pipeline_split;
  return split;
}

PipelineStages::PipelineStages(const PipelineSplit& split) : split_(split) {
  check_split(split_);
  const std::vector<std::int64_t> counts = layers_per_virtual_stage(split_);
  std::int64_t next = 0;
  ranges_.reserve(counts.size());
  for (const std::int64_t count : counts) {
    ranges_.push_back({next, next + count});
    next += count;
  }
  if (next != split_.num_layers) {  // the rules above make this impossible; say so if not
    throw std::logic_error("pipeline layout: the stages hold " + text(next) + " layers, not " +
                           text(split_.num_layers));
  }
}

LayerRange PipelineStages::layers(std::int64_t stage, std::int64_t chunk) const {
  if (stage < 0 || stage >= split_.pipeline || chunk < 0 || chunk >= split_.virtual_stages) {
    throw std::out_of_range("pipeline layout: stage " + text(stage) + ", chunk " + text(chunk) + " outside " +
                            text(split_.pipeline) + " stages x " + text(split_.virtual_stages) + " chunks");
  }
  return ranges_[static_cast<std::size_t>(chunk * split_.pipeline + stage)];
}

std::int64_t PipelineStages::layers_on(std::int64_t stage) const {
  std::int64_t total = 0;
  for (std::int64_t chunk = 0; chunk < split_.virtual_stages; ++chunk) total += layers(stage, chunk).size();
  return total;
}

std::int64_t PipelineStages::virtual_stage_of_layer(std::int64_t layer) const {
  for (std::size_t i = 0; i < ranges_.size(); ++i) {
    if (layer >= ranges_[i].begin && layer < ranges_[i].end) return static_cast<std::int64_t>(i);
  }
  throw std::out_of_range("pipeline layout: layer " + text(layer) + " outside [0, " + text(split_.num_layers) + ")");
}

std::string PipelineStages::describe(std::int64_t stage) const {
  std::string out;
  std::int64_t pieces = 0;
  for (std::int64_t chunk = 0; chunk < split_.virtual_stages; ++chunk) {
    const LayerRange range = layers(stage, chunk);
    if (range.size() == 0) continue;
    out += (pieces == 0 ? "" : ", ") +
           (range.size() == 1 ? text(range.begin) : text(range.begin) + "-" + text(range.end - 1));
    ++pieces;
  }
  if (pieces == 0) return "no decoder layer";
  return (layers_on(stage) == 1 ? "layer " : "layers ") + out;
}

std::string interleaved_schedule_problem(std::int64_t stages, std::int64_t microbatches) {
  const std::int64_t group = stages;  // Megatron's default microbatch_group_size_per_vp_stage
  if (microbatches < group) {
    return "the interleaved schedule runs groups of --pipeline-model-parallel-size (" + std::to_string(stages) +
           ") microbatches; a replica has " + std::to_string(microbatches) + " (Megatron)";
  }
  const std::int64_t last_group = microbatches % group;
  if (last_group > 0 && last_group < stages) {
    return "the interleaved schedule's microbatches per replica (" + std::to_string(microbatches) +
           ") must be a multiple of --pipeline-model-parallel-size (" + std::to_string(stages) +
           "): the last group would hold " + std::to_string(last_group) + " (Megatron)";
  }
  return "";
}

}  // namespace tandem
