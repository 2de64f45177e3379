// `tandem audit`'s exact checks of each iteration record (record_audit.hpp).
#include "reference/record_audit.hpp"

#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <nlohmann/json.hpp>

#include "core/schedule.hpp"

namespace tandem::reference {
namespace {

using Wide = boost::multiprecision::cpp_bin_float_50;

// The shortest decimal that reads back as the same double (so two texts differ iff the bits do).
std::string text(double value) {
  std::array<char, 64> digits{};
  const auto written = std::to_chars(digits.data(), digits.data() + digits.size(), value);
  return std::string(digits.data(), written.ptr);
}
std::string text(std::int64_t value) { return std::to_string(value); }
std::string text(bool value) { return value ? "true" : "false"; }

// Exact equality of two doubles, bit for bit (so -0 is not 0).
bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

[[noreturn]] void malformed(std::int64_t line, const std::string& what) {
  throw std::runtime_error("audit: line " + std::to_string(line) + ": " + what +
                           "; fix: pass a log written by tandem train, unedited");
}

const nlohmann::json& field_of(const nlohmann::json& record, const char* field, std::int64_t line) {
  if (!record.contains(field)) malformed(line, std::string("the record has no field \"") + field + "\"");
  return record.at(field);
}

std::int64_t integer(const nlohmann::json& record, const char* field, std::int64_t line) {
  const nlohmann::json& value = field_of(record, field, line);
  if (!value.is_number_integer()) malformed(line, std::string("\"") + field + "\" = " + value.dump() + " is not an integer");
  return value.get<std::int64_t>();
}

double number(const nlohmann::json& record, const char* field, std::int64_t line) {
  const nlohmann::json& value = field_of(record, field, line);
  if (!value.is_number()) malformed(line, std::string("\"") + field + "\" = " + value.dump() + " is not a number");
  return value.get<double>();
}

// A quantity the log writes as null when it is not finite (JSON has no NaN or infinity).
std::optional<double> finite_number(const nlohmann::json& record, const char* field, std::int64_t line) {
  const nlohmann::json& value = field_of(record, field, line);
  if (value.is_null()) return std::nullopt;
  if (!value.is_number()) malformed(line, std::string("\"") + field + "\" = " + value.dump() + " is neither a number nor null");
  const double number_value = value.get<double>();
  if (!std::isfinite(number_value)) return std::nullopt;
  return number_value;
}

bool boolean(const nlohmann::json& record, const char* field, std::int64_t line) {
  const nlohmann::json& value = field_of(record, field, line);
  if (!value.is_boolean()) malformed(line, std::string("\"") + field + "\" = " + value.dump() + " is not true or false");
  return value.get<bool>();
}

std::string string_field(const nlohmann::json& record, const char* field, std::int64_t line) {
  const nlohmann::json& value = field_of(record, field, line);
  if (!value.is_string()) malformed(line, std::string("\"") + field + "\" = " + value.dump() + " is not a string");
  return value.get<std::string>();
}

template <class Style>
Style style_named(const std::string& name, std::initializer_list<Style> styles, const char* field, std::int64_t line) {
  for (const Style style : styles) {
    if (to_string(style) == name) return style;
  }
  malformed(line, std::string("the header's schedule.") + field + " = \"" + name + "\" is no style tandem knows");
}

ScheduleConfig schedule_of(const nlohmann::json& schedule, std::int64_t line) {
  ScheduleConfig s;
  s.lr = number(schedule, "lr", line);
  s.min_lr = number(schedule, "min_lr", line);
  s.lr_warmup_init = number(schedule, "lr_warmup_init", line);
  s.lr_decay_style = style_named(string_field(schedule, "lr_decay_style", line),
                                 {LrDecayStyle::linear, LrDecayStyle::cosine, LrDecayStyle::constant},
                                 "lr_decay_style", line);
  s.lr_warmup_samples = integer(schedule, "lr_warmup_samples", line);
  s.lr_decay_samples = integer(schedule, "lr_decay_samples", line);
  s.train_samples = integer(schedule, "train_samples", line);
  s.weight_decay = number(schedule, "weight_decay", line);
  s.weight_decay_incr_style =
      style_named(string_field(schedule, "weight_decay_incr_style", line),
                  {WeightDecayIncrStyle::constant, WeightDecayIncrStyle::linear, WeightDecayIncrStyle::cosine},
                  "weight_decay_incr_style", line);
  s.start_weight_decay = number(schedule, "start_weight_decay", line);
  s.end_weight_decay = number(schedule, "end_weight_decay", line);
  s.wd_incr_samples = integer(schedule, "wd_incr_samples", line);
  return s;
}

}  // namespace

void RecordAuditor::header(const nlohmann::json& record, std::int64_t line) {
  Run run;
  run.engine = string_field(record, "engine", line);
  run.precision = string_field(record, "main_precision", line);
  if (run.engine == "production") {
    run.arithmetic = Arithmetic::double_precision;  // production/trainer.cpp: clip and schedule in double
  } else if (run.engine == "reference" && run.precision == "double") {
    run.arithmetic = Arithmetic::double_precision;  // reference Trainer<double>
  } else if (run.engine == "reference" && run.precision == "float50") {
    run.arithmetic = Arithmetic::float50;           // reference Trainer<cpp_bin_float_50>
  } else {
    malformed(line, "engine \"" + run.engine + "\" with main_precision \"" + run.precision +
                        "\" is no engine tandem audit knows (production; reference in double or float50)");
  }
  const nlohmann::json& config = field_of(record, "config", line);
  run.clip_grad = number(field_of(config, "optimizer", line), "clip_grad", line);
  run.global_batch_size = integer(field_of(config, "batch", line), "global_batch_size", line);
  run.seq_length = integer(field_of(config, "model", line), "seq_length", line);
  run.schedule = schedule_of(field_of(config, "schedule", line), line);
  run_ = run;

  // The records after this header continue from the zero state (a fresh run) or from the record
  // of the iteration its checkpoint holds (a resumed run; unknown when this log lacks that record,
  // e.g. torn, and then the first record after the header starts the comparison).
  const std::int64_t resumed = record.contains("resumed_from_iteration") ? integer(record, "resumed_from_iteration", line) : 0;
  if (resumed == 0) {
    previous_ = Counters{};
  } else if (const auto found = by_iteration_.find(resumed); found != by_iteration_.end()) {
    previous_ = found->second;
  } else {
    previous_.reset();
  }
}

void RecordAuditor::fail(std::int64_t iteration, std::int64_t line, std::string field, std::string logged,
                         std::string expected, std::string rule) {
  findings_.push_back(RecordFinding{iteration, line, std::move(field), std::move(logged), std::move(expected), std::move(rule)});
}

// SPEC 6: coeff = clip_grad / (grad_norm + 1e-6); clipped iff coeff < 1; the factor applied is
// logged: coeff when clipped, else 1. A skipped update and --clip-grad 0 apply none.
void RecordAuditor::check_clip(const nlohmann::json& record, std::int64_t iteration, std::int64_t line, bool successful) {
  const Run& run = *run_;
  const double clip_coeff = number(record, "clip_coeff", line);
  const bool clipped = boolean(record, "clipped", line);
  std::string why_unclipped;
  if (!successful) why_unclipped = "a skipped update applies no clipping (SPEC 6, 8)";
  if (run.clip_grad <= 0) why_unclipped = "--clip-grad " + text(run.clip_grad) + " disables clipping (SPEC 6)";
  if (!why_unclipped.empty()) {
    if (clipped) fail(iteration, line, "clipped", text(clipped), "false", why_unclipped);
    if (!same_bits(clip_coeff, 1.0)) fail(iteration, line, "clip_coeff", text(clip_coeff), "1", why_unclipped + ": clip_coeff 1");
    return;
  }
  const double grad_norm = number(record, "grad_norm", line);  // finite: the update succeeded
  const std::string formula = "clip_grad / (grad_norm + 1e-6) = " + text(run.clip_grad) + " / (" + text(grad_norm) + " + 1e-6)";

  if (run.arithmetic == Arithmetic::double_precision) {
    // production/trainer.cpp and reference Trainer<double>: one double division, bit for bit.
    const double coeff = run.clip_grad / (grad_norm + kClipNormEpsilon);
    const bool expected_clipped = coeff < 1.0;
    if (clipped != expected_clipped) {
      fail(iteration, line, "clipped", text(clipped), text(expected_clipped),
           "clipped iff " + formula + " = " + text(coeff) + " < 1, in double as the " + run.engine + " engine computes it (SPEC 6)");
    }
    const double expected = expected_clipped ? coeff : 1.0;
    if (!same_bits(clip_coeff, expected)) {
      fail(iteration, line, "clip_coeff", text(clip_coeff), text(expected),
           expected_clipped ? "clip_coeff = " + formula + ", in double as the " + run.engine +
                                  " engine computes it, bit for bit (SPEC 6)"
                            : "clip_coeff = 1 when " + formula + " = " + text(coeff) + " is not below 1 (SPEC 6)");
    }
    return;
  }

  // Reference float50: the logged norm is the 50-digit norm rounded to double, so the norm lies in
  // [low, high], the reals that round to it; the coefficient is decreasing in the norm.
  const double infinity = std::numeric_limits<double>::infinity();
  const Wide norm = Wide(grad_norm);
  const Wide low = (norm + Wide(std::nextafter(grad_norm, -infinity))) / 2;
  const Wide high = (norm + Wide(std::nextafter(grad_norm, infinity))) / 2;
  const Wide clip = Wide(run.clip_grad);
  const Wide epsilon = Wide(kClipNormEpsilon);
  const Wide coeff_largest = clip / (low + epsilon);
  const Wide coeff_smallest = clip / (high + epsilon);
  const bool surely_clipped = coeff_largest < 1;
  const bool surely_unclipped = !(coeff_smallest < 1);
  const bool expected_clipped = surely_clipped ? true : surely_unclipped ? false : clipped;
  const std::string interval = "[" + text(static_cast<double>(coeff_smallest)) + ", " + text(static_cast<double>(coeff_largest)) + "]";
  if (clipped != expected_clipped) {
    fail(iteration, line, "clipped", text(clipped), text(expected_clipped),
         "clipped iff " + formula + " < 1, in 50 digits for every norm that rounds to the logged one: " + interval + " (SPEC 6)");
  }
  if (!expected_clipped) {
    if (!same_bits(clip_coeff, 1.0)) {
      fail(iteration, line, "clip_coeff", text(clip_coeff), "1",
           "clip_coeff = 1 when " + formula + " is not below 1 (SPEC 6)");
    }
    return;
  }
  const double least = static_cast<double>(coeff_smallest);
  const double most = static_cast<double>(coeff_largest);
  if (!(least <= clip_coeff && clip_coeff <= most)) {
    fail(iteration, line, "clip_coeff", text(clip_coeff), "a double in " + interval,
         "clip_coeff = " + formula + " in 50 digits rounded to double, for a norm that rounds to the logged "
         "grad_norm (the reference's float50 norm is logged rounded) (SPEC 6)");
  }
}

// SPEC 8: the update used lr and wd at n = the scheduler's samples before it; the record logs the
// samples after it, which a successful update advanced by one global batch.
void RecordAuditor::check_schedule(const nlohmann::json& record, std::int64_t iteration, std::int64_t line, bool successful) {
  const Run& run = *run_;
  const std::int64_t scheduler_samples = integer(record, "scheduler_samples", line);
  const std::int64_t before = scheduler_samples - (successful ? run.global_batch_size : 0);
  double lr = 0;
  double wd = 0;
  if (run.arithmetic == Arithmetic::double_precision) {
    lr = learning_rate<double>(run.schedule, before);
    wd = weight_decay_at<double>(run.schedule, before);
  } else {
    lr = static_cast<double>(learning_rate<Wide>(run.schedule, before));
    wd = static_cast<double>(weight_decay_at<Wide>(run.schedule, before));
  }
  const std::string arithmetic = run.arithmetic == Arithmetic::double_precision ? "double" : "50 digits rounded to double";
  const std::string at = " at n = " + text(before) + " scheduler samples before this update (scheduler_samples " +
                         text(scheduler_samples) + (successful ? " less the global batch " + text(run.global_batch_size) : "") +
                         "), in " + arithmetic + " as the " + run.engine + " engine computes it (SPEC 8, core/schedule.hpp)";
  const double logged_lr = number(record, "lr", line);
  const double logged_wd = number(record, "wd", line);
  if (!same_bits(logged_lr, lr)) fail(iteration, line, "lr", text(logged_lr), text(lr), "lr = the learning-rate schedule" + at);
  if (!same_bits(logged_wd, wd)) fail(iteration, line, "wd", text(logged_wd), text(wd), "wd = the weight-decay schedule" + at);
}

void RecordAuditor::iteration(const nlohmann::json& record, std::int64_t line) {
  if (!run_) malformed(line, "an iteration record before the header record");
  const Run& run = *run_;
  ++records_checked_;
  const std::int64_t iteration = integer(record, "iteration", line);
  const bool successful = boolean(record, "update_successful", line);

  // SPEC 8: an update is skipped exactly when the norm or the loss is not finite.
  const bool finite = finite_number(record, "grad_norm", line).has_value() && finite_number(record, "loss", line).has_value();
  if (successful != finite) {
    fail(iteration, line, "update_successful", text(successful), text(finite),
         "an update is skipped iff grad_norm or loss is not finite (logged as null) (SPEC 8)");
  }
  check_clip(record, iteration, line, successful && finite);
  check_schedule(record, iteration, line, successful);

  Counters logged;
  logged.iteration = iteration;
  logged.consumed_samples = integer(record, "consumed_samples", line);
  logged.successful_updates = integer(record, "successful_updates", line);
  logged.skipped_updates = integer(record, "skipped_updates", line);
  logged.scheduler_samples = integer(record, "scheduler_samples", line);
  logged.total_input_tokens = integer(record, "total_input_tokens", line);
  logged.total_loss_tokens = integer(record, "total_loss_tokens", line);
  logged.total_pad_tokens = integer(record, "total_pad_tokens", line);
  const std::int64_t input_tokens = integer(record, "input_tokens", line);
  const std::int64_t loss_tokens = integer(record, "loss_tokens", line);
  const std::int64_t pad_tokens = integer(record, "pad_tokens", line);

  // SPEC 7, 12: step is the AdamW step count after the update, the successful updates so far.
  const std::int64_t step = integer(record, "step", line);
  if (step != logged.successful_updates) {
    fail(iteration, line, "step", text(step), text(logged.successful_updates),
         "step = successful_updates, the AdamW step count after this update (SPEC 7, 12)");
  }
  // SPEC 2, 3: every input position is a token or padding; a loss position is a non-pad input.
  const std::int64_t positions = run.global_batch_size * run.seq_length;
  if (input_tokens + pad_tokens != positions) {
    fail(iteration, line, "input_tokens", text(input_tokens) + " (+ pad_tokens " + text(pad_tokens) + ")", text(positions),
         "input_tokens + pad_tokens = global_batch_size x seq_length = " + text(run.global_batch_size) + " x " +
             text(run.seq_length) + ": every input position is a token or padding (SPEC 2)");
  }
  if (loss_tokens < 0 || loss_tokens > input_tokens) {
    fail(iteration, line, "loss_tokens", text(loss_tokens), "0 .. input_tokens = " + text(input_tokens),
         "a loss position is a non-pad input position (SPEC 3)");
  }

  if (!previous_) {  // a resumed run whose checkpoint's record this log lacks: start from here
    previous_ = logged;
    by_iteration_[iteration] = logged;
    return;
  }
  // SPEC 1, 8: from the previous record of this run, by the rules.
  const Counters& before = *previous_;
  const std::int64_t gbs = run.global_batch_size;
  Counters expected;
  expected.iteration = before.iteration + 1;
  expected.consumed_samples = before.consumed_samples + gbs;
  expected.successful_updates = before.successful_updates + (successful ? 1 : 0);
  expected.skipped_updates = before.skipped_updates + (successful ? 0 : 1);
  expected.scheduler_samples = before.scheduler_samples + (successful ? gbs : 0);
  expected.total_input_tokens = before.total_input_tokens + input_tokens;
  expected.total_loss_tokens = before.total_loss_tokens + loss_tokens;
  expected.total_pad_tokens = before.total_pad_tokens + pad_tokens;
  const std::string from = " (previous record: iteration " + text(before.iteration) + ")";
  const auto counter = [&](const char* field, std::int64_t logged_value, std::int64_t expected_value, const std::string& rule) {
    if (logged_value != expected_value) fail(iteration, line, field, text(logged_value), text(expected_value), rule + from);
  };
  counter("iteration", logged.iteration, expected.iteration, "iteration advances by 1 per record (SPEC 1)");
  counter("consumed_samples", logged.consumed_samples, expected.consumed_samples,
          "consumed_samples advances by the global batch " + text(gbs) + ", skipped or not (SPEC 8)");
  counter("successful_updates", logged.successful_updates, expected.successful_updates,
          std::string("successful_updates advances by 1 after a successful update, else not (this update ") +
              (successful ? "succeeded" : "was skipped") + ") (SPEC 8)");
  counter("skipped_updates", logged.skipped_updates, expected.skipped_updates,
          std::string("skipped_updates advances by 1 after a skipped update, else not (this update ") +
              (successful ? "succeeded" : "was skipped") + ") (SPEC 8)");
  counter("scheduler_samples", logged.scheduler_samples, expected.scheduler_samples,
          "the scheduler advances by the global batch " + text(gbs) + " after a successful update only (SPEC 8)");
  counter("total_input_tokens", logged.total_input_tokens, expected.total_input_tokens,
          "total_input_tokens = the previous total + this iteration's input_tokens " + text(input_tokens) + " (SPEC 1)");
  counter("total_loss_tokens", logged.total_loss_tokens, expected.total_loss_tokens,
          "total_loss_tokens = the previous total + this iteration's loss_tokens " + text(loss_tokens) + " (SPEC 1)");
  counter("total_pad_tokens", logged.total_pad_tokens, expected.total_pad_tokens,
          "total_pad_tokens = the previous total + this iteration's pad_tokens " + text(pad_tokens) + " (SPEC 1)");
  // The rules' counters carry on, so one wrong record is named once, not again in the next.
  previous_ = expected;
  by_iteration_[iteration] = expected;
}

}  // namespace tandem::reference
