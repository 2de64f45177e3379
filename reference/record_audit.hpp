// What a training log's iteration records prove about themselves, checked exactly, so that a log
// vouches for its own numbers without a rerun: `tandem audit` recomputes, for every record, in the
// arithmetic the engine that wrote it uses, and compares bit for bit (no bound):
//   - the skip decision: update_successful iff grad_norm and loss are finite (SPEC 8);
//   - the clip decision and coefficient: coeff = clip_grad / (grad_norm + 1e-6), clipped iff
//     coeff < 1, clip_coeff = coeff when clipped and 1 otherwise (1 with --clip-grad 0 and on a
//     skipped update) (SPEC 6);
//   - lr and wd: the schedule (core/schedule.hpp) at the scheduler samples before the update, n =
//     scheduler_samples less one global batch after a successful update (SPEC 8);
//   - step = successful_updates (SPEC 7, 12);
//   - the tokens: input_tokens + pad_tokens = global batch x seq_length, loss_tokens <= input_tokens
//     (SPEC 2, 3);
//   - the counters against the previous record of the same run (the zero state for a fresh run's
//     first, the resumed checkpoint's iteration's record after a resumed run's header): iteration
//     +1, consumed_samples +GBS, successful_updates or skipped_updates +1, scheduler_samples +GBS
//     after a successful update only, and each total_*_tokens + this iteration's count (SPEC 1, 8).
// The arithmetic of each engine, as its trainer computes (production/trainer.cpp: double;
// reference/trainer.cpp: Real, double or cpp_bin_float_50 rounded to double for the log):
//   production, and reference with main_precision double: the double computation, reproduced bit
//     for bit;
//   reference float50: its 50-digit norm reached the log rounded to double, so the record pins the
//     norm only to the interval of reals that round to the logged double; the 50-digit
//     coefficient of any norm in it, rounded to double, must contain the logged one, and the
//     clip decision is checked wherever that interval does not straddle 1. lr and wd are the
//     50-digit schedule rounded to double, bit for bit.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/config.hpp"

namespace tandem::reference {

// One failed check: the record, the field, both values and the rule.
struct RecordFinding {
  std::int64_t iteration = 0;
  std::int64_t line = 0;  // of the log file, 1-based
  std::string field;      // the record's field, e.g. "clip_coeff"
  std::string logged;     // as logged (a double's shortest round-trip decimal)
  std::string expected;   // what the rule gives
  std::string rule;       // the rule, citing SPEC
};

class RecordAuditor {
 public:
  // A header record: the engine, its precision and the configuration the records after it follow.
  // Throws std::runtime_error naming the line and field when one is missing or unknown.
  void header(const nlohmann::json& record, std::int64_t line);
  // An iteration record: every check above; a failed one becomes a finding. Throws on a missing
  // or mistyped field (naming it) and on an iteration record before any header.
  void iteration(const nlohmann::json& record, std::int64_t line);

  std::int64_t records_checked() const { return records_checked_; }
  const std::vector<RecordFinding>& findings() const { return findings_; }

  // The counters a record carries after its iteration (SPEC 1, 12).
  struct Counters {
    std::int64_t iteration = 0;
    std::int64_t consumed_samples = 0;
    std::int64_t successful_updates = 0;
    std::int64_t skipped_updates = 0;
    std::int64_t scheduler_samples = 0;
    std::int64_t total_input_tokens = 0;
    std::int64_t total_loss_tokens = 0;
    std::int64_t total_pad_tokens = 0;
  };

 private:
  enum class Arithmetic { double_precision, float50 };
  struct Run {
    std::string engine;
    std::string precision;
    Arithmetic arithmetic = Arithmetic::double_precision;
    double clip_grad = 0;
    std::int64_t global_batch_size = 0;
    std::int64_t seq_length = 0;
    ScheduleConfig schedule;
  };

  void check_clip(const nlohmann::json& record, std::int64_t iteration, std::int64_t line, bool successful);
  void check_schedule(const nlohmann::json& record, std::int64_t iteration, std::int64_t line, bool successful);
  void fail(std::int64_t iteration, std::int64_t line, std::string field, std::string logged, std::string expected,
            std::string rule);

  std::optional<Run> run_;
  std::optional<Counters> previous_;             // the counters the next record continues from
  std::map<std::int64_t, Counters> by_iteration_;  // every record's counters (a resume's start)
  std::int64_t records_checked_ = 0;
  std::vector<RecordFinding> findings_;
};

}  // namespace tandem::reference
