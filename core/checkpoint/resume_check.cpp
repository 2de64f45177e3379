// Comparing a resumed run's settings with its checkpoint's (core/checkpoint/resume_check.hpp).
#include "core/checkpoint/resume_check.hpp"

#include <array>
#include <optional>
#include <utility>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/config_issue.hpp"

namespace tandem::checkpoint {
namespace {

enum class Rule { needs_override, never, reported };

struct ComparedSetting {
  std::string_view pointer;   // into to_json(RunConfig)
  std::string_view argument;  // how the user sets it
  Rule rule;
};

constexpr Rule kOverride = Rule::needs_override;
constexpr Rule kNever = Rule::never;
constexpr Rule kReported = Rule::reported;

constexpr std::array kComparedSettings{
    ComparedSetting{"/schedule/lr", "--lr", kOverride},
    ComparedSetting{"/schedule/min_lr", "--min-lr", kOverride},
    ComparedSetting{"/schedule/lr_warmup_init", "--lr-warmup-init", kOverride},
    ComparedSetting{"/schedule/lr_decay_style", "--lr-decay-style", kOverride},
    ComparedSetting{"/schedule/lr_warmup_samples", "--lr-warmup-samples", kOverride},
    ComparedSetting{"/schedule/lr_decay_samples", "--lr-decay-samples", kOverride},
    ComparedSetting{"/schedule/weight_decay", "--weight-decay", kOverride},
    ComparedSetting{"/schedule/weight_decay_incr_style", "--weight-decay-incr-style", kOverride},
    ComparedSetting{"/schedule/start_weight_decay", "--start-weight-decay", kOverride},
    ComparedSetting{"/schedule/end_weight_decay", "--end-weight-decay", kOverride},
    // The weight-decay increment span is the training length (Megatron's wd_incr_steps).
    ComparedSetting{"/schedule/wd_incr_samples", "--train-samples", kOverride},
    ComparedSetting{"/optimizer/adam_beta1", "--adam-beta1", kOverride},
    ComparedSetting{"/optimizer/adam_beta2", "--adam-beta2", kOverride},
    ComparedSetting{"/optimizer/adam_eps", "--adam-eps", kOverride},
    ComparedSetting{"/optimizer/clip_grad", "--clip-grad", kOverride},
    ComparedSetting{"/batch/global_batch_size", "--global-batch-size", kOverride},
    ComparedSetting{"/model/seq_length", "--seq-length", kOverride},
    ComparedSetting{"/model/num_layers", "--num-layers", kNever},
    ComparedSetting{"/model/hidden_size", "--hidden-size", kNever},
    ComparedSetting{"/model/ffn_hidden_size", "--ffn-hidden-size", kNever},
    ComparedSetting{"/model/num_attention_heads", "--num-attention-heads", kNever},
    ComparedSetting{"/model/num_query_groups", "--num-query-groups", kNever},
    ComparedSetting{"/model/vocab_size", "--vocab-size", kNever},
    ComparedSetting{"/model/padded_vocab_size", "--make-vocab-size-divisible-by", kNever},
    ComparedSetting{"/model/add_bias_linear", "--add-bias-linear", kNever},
    ComparedSetting{"/model/tie_embeddings", "--untie-embeddings-and-output-weights", kNever},
    // What the next samples are (Megatron lets a run change its data on resume; so do we, and say so).
    ComparedSetting{"/data/data_path", "--data-path", kReported},
    ComparedSetting{"/data/split", "--split", kReported},
    ComparedSetting{"/data/data_order", "--data-order", kReported},
    ComparedSetting{"/data/packing", "--packing", kReported},
    ComparedSetting{"/data/seed", "--seed", kReported},
    ComparedSetting{"/data/loss_normalization", "--loss-normalization", kReported},
};

}  // namespace

std::vector<SettingChange> changed_resume_settings(const nlohmann::json& saved_run_config,
                                                   const RunConfig& resumed) {
  nlohmann::json resumed_json;
  to_json(resumed_json, resumed);
  std::vector<SettingChange> changes;
  for (const auto& setting : kComparedSettings) {
    const nlohmann::json::json_pointer pointer{std::string(setting.pointer)};
    const nlohmann::json& now = resumed_json.at(pointer);
    const bool recorded = saved_run_config.is_object() && saved_run_config.contains(pointer);
    // Doubles compare exactly: JSON keeps them round-trip exact, and any change is a change.
    if (recorded && saved_run_config.at(pointer) == now) continue;
    changes.push_back({std::string(setting.argument),
                       recorded ? saved_run_config.at(pointer).dump() : "<absent>", now.dump(),
                       setting.rule == Rule::needs_override, setting.rule == Rule::reported});
  }
  return changes;
}

std::string describe(const SettingChange& change) {
  return change.argument + " changed: the checkpoint's run had " + change.saved + ", this run has " + change.resumed;
}

namespace {

// SPEC 13: the padded vocabulary is Megatron's round_up(V, --make-vocab-size-divisible-by x TP),
// so it changes with TP: name both layouts, and the divisor that gives the checkpoint's rows here.
ConfigIssue padded_vocabulary_issue(const nlohmann::json& saved, const RunConfig& resumed) {
  const auto saved_number = [&saved](const char* pointer) -> std::int64_t {
    const nlohmann::json::json_pointer at{pointer};
    return saved.contains(at) && saved.at(at).is_number_integer() ? saved.at(at).get<std::int64_t>() : 0;
  };
  const std::int64_t saved_rows = saved_number("/model/padded_vocab_size");
  const std::int64_t tp = resumed.parallel.tensor_parallel;
  const auto layout = [](std::int64_t tensor, std::int64_t data, std::int64_t pipeline) {
    return "TP " + std::to_string(tensor) + " x DP " + std::to_string(data) + " x PP " + std::to_string(pipeline);
  };
  std::string rule = "the padded vocabulary would be " + std::to_string(resumed.model.padded_vocab_size) +
                     " rows (--vocab-size " + std::to_string(resumed.model.vocab_size) + " rounded up to a multiple of " +
                     std::to_string(resumed.model.make_vocab_size_divisible_by) + " x TP " + std::to_string(tp) +
                     ", this run's layout " +
                     layout(tp, resumed.parallel.data_parallel, resumed.parallel.pipeline_parallel) +
                     "), the checkpoint's is " + std::to_string(saved_rows) + " rows (" +
                     std::to_string(saved_number("/model/make_vocab_size_divisible_by")) + " x TP " +
                     std::to_string(saved_number("/parallel/tensor_parallel")) + ", written at " +
                     layout(saved_number("/parallel/tensor_parallel"), saved_number("/parallel/data_parallel"),
                            saved_number("/parallel/pipeline_parallel")) +
                     "): the embedding and output tensors would not fit";
  std::string fix = "resume at the checkpoint's TP, or start a fresh run without --load";
  // The smallest divisor m with round_up(V, m x TP) = the checkpoint's rows (m = rows / TP always is one).
  if (saved_rows > 0 && saved_rows % tp == 0 && saved_rows >= resumed.model.vocab_size) {
    const std::int64_t vocab = resumed.model.vocab_size;
    std::int64_t divisor = saved_rows / tp;
    for (std::int64_t m = 1; m < saved_rows / tp; ++m) {
      if ((vocab + m * tp - 1) / (m * tp) * (m * tp) == saved_rows) {
        divisor = m;
        break;
      }
    }
    fix = "add --make-vocab-size-divisible-by " + std::to_string(divisor) + " (rounding " + std::to_string(vocab) +
          " up to a multiple of " + std::to_string(divisor * tp) + " gives the checkpoint's " +
          std::to_string(saved_rows) + " rows at TP " + std::to_string(tp) + "), or resume at the checkpoint's TP";
  }
  return {"--make-vocab-size-divisible-by", std::to_string(resumed.model.make_vocab_size_divisible_by), rule, fix};
}

// SPEC 13: the checkpoint learned with its tokenizer's EOD and PAD (masks, positions, loss
// tokens); a resume with other ids would train on other documents. A checkpoint without
// "tokenizer" (written before it was recorded, or by a byte-tokenizer run) used EOD 256, PAD 257.
std::optional<ConfigIssue> tokenizer_issue(const nlohmann::json& saved, const RunConfig& resumed) {
  const nlohmann::json* recorded = saved.is_object() && saved.contains("tokenizer") ? &saved.at("tokenizer") : nullptr;
  const std::string saved_type = recorded != nullptr ? recorded->value("type", std::string("?")) : "bytes";
  const nlohmann::json saved_eod = recorded != nullptr ? recorded->value("eod", nlohmann::json()) : nlohmann::json(kEodToken);
  const nlohmann::json saved_pad = recorded != nullptr ? recorded->value("pad", nlohmann::json()) : nlohmann::json(kPadToken);
  const auto& now = resumed.tokenizer;
  const nlohmann::json now_pad = now.pad_token == kNoPadToken ? nlohmann::json() : nlohmann::json(now.pad_token);
  if (saved_eod == nlohmann::json(now.eod_token) && saved_pad == now_pad) return std::nullopt;
  const auto pad_text = [](const nlohmann::json& pad) { return pad.is_null() ? std::string("none") : pad.dump(); };
  std::string fix = "resume with the checkpoint's tokenizer";
  if (recorded != nullptr) {
    fix += " (--tokenizer-type " + saved_type;
    for (const auto& [key, option] : {std::pair{"vocab_file", " --vocab-file "}, std::pair{"merge_file", " --merge-file "},
                                      std::pair{"tokenizer_model", " --tokenizer-model "}}) {
      const std::string value = recorded->value(key, std::string());
      if (!value.empty()) fix += option + value;
    }
    fix += ")";
  } else {
    fix += " (tandem's byte tokenizer: no --tokenizer-type)";
  }
  fix += ", or start a fresh run without --load";
  return ConfigIssue{"--tokenizer-type", resumed.tokenizer.named() ? to_string(now.type) : "not given (bytes)",
                     "gives EOD " + std::to_string(now.eod_token) + ", PAD " + pad_text(now_pad) +
                         ", but the checkpoint being resumed trained with " + saved_type + "'s EOD " + saved_eod.dump() +
                         ", PAD " + pad_text(saved_pad) + "; its documents, masks and loss tokens would change (SPEC 13)",
                     fix};
}

}  // namespace

std::vector<SettingChange> check_resume_settings(const nlohmann::json& saved_run_config,
                                                 const RunConfig& resumed) {
  const bool override_allowed = resumed.checkpoint.override_opt_param_scheduler;
  std::vector<ConfigIssue> issues;
  std::vector<SettingChange> allowed;
  for (auto& change : changed_resume_settings(saved_run_config, resumed)) {
    if (change.reported || (change.overridable && override_allowed)) {
      allowed.push_back(std::move(change));
      continue;
    }
    if (change.overridable) {
      issues.push_back({change.argument, change.resumed,
                        "differs from the checkpoint being resumed, which used " + change.saved +
                            " (SPEC 9)",
                        "pass " + change.saved + " as the checkpoint did, or add "
                            "--override-opt-param-scheduler to take the new value"});
    } else if (change.argument == "--make-vocab-size-divisible-by") {
      issues.push_back(padded_vocabulary_issue(saved_run_config, resumed));
    } else {
      issues.push_back({change.argument, change.resumed,
                        "changes the model's shape from the checkpoint's " + change.saved +
                            "; the stored tensors would not fit",
                        "resume with the checkpoint's model settings, or start a fresh run "
                        "without --load"});
    }
  }
  if (auto issue = tokenizer_issue(saved_run_config, resumed)) issues.push_back(std::move(*issue));
  if (!issues.empty()) throw ConfigError(std::move(issues));
  return allowed;
}

}  // namespace tandem::checkpoint
