// JSON forms of the shared trainer records (records.hpp).
#include "core/train/records.hpp"

#include <fstream>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace tandem {

void to_json(nlohmann::json& out, const Counters& c) {
  out = nlohmann::json{{"iteration", c.iteration},
                       {"consumed_samples", c.consumed_samples},
                       {"successful_updates", c.successful_updates},
                       {"skipped_updates", c.skipped_updates},
                       {"consecutive_skips", c.consecutive_skips},
                       {"input_tokens", c.input_tokens},
                       {"loss_tokens", c.loss_tokens},
                       {"pad_tokens", c.pad_tokens},
                       {"scheduler_samples", c.scheduler_samples},
                       {"consumed_valid_samples", c.consumed_valid_samples}};
}

void from_json(const nlohmann::json& in, Counters& c) {
  in.at("iteration").get_to(c.iteration);
  in.at("consumed_samples").get_to(c.consumed_samples);
  in.at("successful_updates").get_to(c.successful_updates);
  in.at("skipped_updates").get_to(c.skipped_updates);
  in.at("consecutive_skips").get_to(c.consecutive_skips);
  in.at("input_tokens").get_to(c.input_tokens);
  in.at("loss_tokens").get_to(c.loss_tokens);
  in.at("pad_tokens").get_to(c.pad_tokens);
  in.at("scheduler_samples").get_to(c.scheduler_samples);
  c.consumed_valid_samples = in.value("consumed_valid_samples", std::int64_t{0});  // absent: 0
}

void to_json(nlohmann::json& out, const AuditEntry& e) {
  out = nlohmann::json{{"tensor", e.tensor}, {"element", e.element}, {"group", e.group},
                       {"old_value", e.old_value}, {"grad", e.grad}, {"old_m", e.old_m},
                       {"old_v", e.old_v}, {"m", e.m}, {"v", e.v}, {"lr", e.lr}, {"wd", e.wd},
                       {"step", e.step}, {"new_value", e.new_value}};
}

void from_json(const nlohmann::json& in, AuditEntry& e) {
  in.at("tensor").get_to(e.tensor);
  in.at("element").get_to(e.element);
  in.at("group").get_to(e.group);
  in.at("old_value").get_to(e.old_value);
  in.at("grad").get_to(e.grad);
  in.at("old_m").get_to(e.old_m);
  in.at("old_v").get_to(e.old_v);
  in.at("m").get_to(e.m);
  in.at("v").get_to(e.v);
  in.at("lr").get_to(e.lr);
  in.at("wd").get_to(e.wd);
  in.at("step").get_to(e.step);
  in.at("new_value").get_to(e.new_value);
}

double evaluation_perplexity(double loss) { return std::exp(std::min(20.0, loss)); }

void to_json(nlohmann::json& out, const EvaluationRecord& r) {
  out = nlohmann::json{{"type", "evaluation"},
                       {"iteration", r.iteration},
                       {"split", "valid"},
                       {"at_end", r.at_end},
                       {"loss", r.loss},
                       {"ppl", r.ppl},
                       {"samples", r.samples},
                       {"loss_tokens", r.loss_tokens},
                       {"consumed_valid_samples", r.consumed_valid_samples},
                       {"seconds", r.seconds}};
}

void to_json(nlohmann::json& out, const IterationRecord& r) {
  out = nlohmann::json{{"type", "iteration"},
                       {"iteration", r.iteration},
                       {"consumed_samples", r.consumed_samples},
                       {"lr", r.lr},
                       {"wd", r.wd},
                       {"loss", r.loss},
                       {"grad_norm", r.grad_norm},
                       {"clip_coeff", r.clip_coeff},
                       {"clipped", r.clipped},
                       {"update_successful", r.update_successful},
                       {"step", r.step},
                       {"input_tokens", r.input_tokens},
                       {"loss_tokens", r.loss_tokens},
                       {"pad_tokens", r.pad_tokens},
                       {"successful_updates", r.totals.successful_updates},
                       {"skipped_updates", r.totals.skipped_updates},
                       {"total_input_tokens", r.totals.input_tokens},
                       {"total_loss_tokens", r.totals.loss_tokens},
                       {"total_pad_tokens", r.totals.pad_tokens},
                       {"scheduler_samples", r.totals.scheduler_samples},
                       {"seconds", r.seconds},
                       {"tokens_per_second", r.tokens_per_second}};
  if (r.model_flops) {
    out["model_flops"] = *r.model_flops;
    out["model_flops_per_second"] = r.seconds > 0 ? *r.model_flops / r.seconds : 0.0;
    out["mfu"] = r.mfu ? nlohmann::json(*r.mfu) : nlohmann::json(nullptr);
  }
  if (!r.audit.empty()) out["audit"] = r.audit;
}

JsonlLog::JsonlLog(const std::string& path, bool append) : path_(path) {
  // A run killed while writing leaves a torn last line: a resumed run starts on a new line, so its
  // header is not glued onto the torn record (the torn line stays, alone; tandem audit skips it).
  bool torn = false;
  if (append) {
    std::ifstream existing(path, std::ios::binary | std::ios::ate);
    if (existing && existing.tellg() > 0) {
      existing.seekg(-1, std::ios::end);
      torn = existing.get() != '\n';
    }
  }
  file_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!file_) {
    throw std::runtime_error("--log " + path + ": cannot open for writing (" +
                             std::strerror(errno) + "); fix: choose a writable path");
  }
  if (torn) {
    file_ << '\n';
    file_.flush();
  }
}

void JsonlLog::write(const nlohmann::json& record) {
  // NaN and Inf are not JSON: nlohmann writes them as null, which is what a reader sees for a
  // non-finite loss or norm of a skipped update.
  file_ << record.dump() << '\n';
  file_.flush();
  if (!file_) {
    throw std::runtime_error("--log " + path_ + ": write failed (" + std::strerror(errno) +
                             "); fix: free space on that file system or choose another --log");
  }
}

}  // namespace tandem
