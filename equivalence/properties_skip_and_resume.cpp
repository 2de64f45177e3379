// The equivalence properties over the counters and state between updates
// (properties_internal.hpp): what a skipped update changes, and save, stop, resume against
// running straight.
#include "equivalence/properties_internal.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "equivalence/float_generator.hpp"

namespace tandem::equivalence {
namespace {

namespace fs = std::filesystem;

std::string fresh_directory() {
  static std::atomic<std::int64_t> counter{0};
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  return (base / ("tandem-equivalence-resume-" + std::to_string(::getpid()) + "-" +
                  std::to_string(counter++)))
      .string();
}

}  // namespace

// ---- skipped updates ----

void a_skipped_update_changes_only_the_counters_it_names(const TwinKind& kind) {
  UpdateCase c = *update_case(CaseLimits{1, false, false});
  FloatClassWeights weights;
  weights.nan = 8;
  weights.infinity = 8;
  c.injection.iteration = 2;  // after one real update, so the moments are not zero
  c.injection.value = *ieee_value<double>(weights);
  c.injection.element = *rc::gen::inRange<std::int64_t>(0, 1 << 20);
  c.injection.on_loss = *rc::gen::weightedElement<bool>({{2, false}, {1, true}});
  adapt_to(kind, c);
  RunConfig config = with_layout(c.config, c.test_layout);
  config.optimizer.clip_grad = c.clip == ClipMode::off ? 0.0 : 1.0;
  const auto samples = shipped_samples(config, c.documents);
  auto twin = kind.make(setup_for(config, samples, c.injection, starting_samples(c)));
  move_to_position(*twin, starting_samples(c), config.batch.global_batch_size);
  twin->run_iteration();
  const TwinState before = twin->state();
  const IterationRecord record = twin->run_iteration();
  const TwinState after = twin->state();

  // SPEC 6, 8: the norm sums g*g; the injected square is the only term that can overflow (the
  // others are O(1) and below half an ulp of anything near DBL_MAX), so the update is skipped
  // exactly when value*value is not finite: NaN, +-inf, and |value| >= ~2^512.
  // On the loss (SPEC 8's other condition): skipped exactly when the value is not finite.
  const bool expect_skip = c.injection.on_loss ? !std::isfinite(c.injection.value)
                                               : !std::isfinite(c.injection.value * c.injection.value);
  Report report;
  auto add = [&](const std::string& quantity, double a, double b) {
    Finding f;
    f.update = 2;
    f.quantity = quantity;
    f.reference = a;
    f.under_test = b;
    f.ok = same_ieee_value(a, b);
    f.error = f.ok ? 0 : INFINITY;
    report.add(f);
  };
  add("update_successful (expected, observed)", !expect_skip, record.update_successful);
  if (expect_skip) {
    TwinState expected = before;
    const std::int64_t gbs = config.batch.global_batch_size;
    expected.counters.iteration += 1;
    expected.counters.consumed_samples += gbs;
    expected.counters.skipped_updates += 1;
    expected.counters.consecutive_skips += 1;
    expected.counters.input_tokens += record.input_tokens;
    expected.counters.loss_tokens += record.loss_tokens;
    expected.counters.pad_tokens += record.pad_tokens;
    compare_states_bitwise(2, "expected vs after the skip: ", expected, after, report);
    // Its record shows the lr the scheduler holds: the one the next successful update uses.
    auto next = kind.make(setup_for(config, samples, {}, 0));
    next->load_state(after);
    const IterationRecord following = next->run_iteration();
    add("lr of the skipped record vs the next update's", record.lr, following.lr);
    add("step of the next update", static_cast<double>(before.counters.successful_updates + 1),
        static_cast<double>(following.step));
  }
  assert_report(report);
}

// ---- resume ----

void save_stop_resume_equals_running_straight(const TwinKind& kind) {
  CaseLimits limits;
  limits.max_updates = 4;
  limits.injections = true;
  UpdateCase c = *update_case(limits);
  adapt_to(kind, c);
  const std::int64_t total = std::max<std::int64_t>(2, c.updates);
  const std::int64_t stop = *rc::gen::inRange<std::int64_t>(1, total);
  RunConfig config = with_layout(c.config, c.test_layout);
  config.optimizer.clip_grad = c.clip == ClipMode::off ? 0.0 : (c.clip == ClipMode::active ? 1e-3 : 1.0);
  const auto samples = shipped_samples(config, c.documents);
  const std::int64_t gbs = config.batch.global_batch_size;

  auto straight = kind.make(setup_for(config, samples, c.injection, starting_samples(c)));
  move_to_position(*straight, starting_samples(c), gbs);
  std::vector<IterationRecord> straight_records;
  for (std::int64_t i = 0; i < total; ++i) straight_records.push_back(straight->run_iteration());

  auto first = kind.make(setup_for(config, samples, c.injection, starting_samples(c)));
  move_to_position(*first, starting_samples(c), gbs);
  for (std::int64_t i = 0; i < stop; ++i) first->run_iteration();
  // Through files, as the engine writes and reads them (with DP ranks: a shard per rank).
  struct Scratch {
    std::string path = fresh_directory();
    ~Scratch() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } scratch;
  first->save_checkpoint(scratch.path);
  first.reset();  // stop

  auto resumed = kind.make(setup_for(config, samples, c.injection, starting_samples(c)));
  resumed->resume_from(scratch.path);
  Report report;
  for (std::int64_t i = stop; i < total; ++i) {
    const IterationRecord record = resumed->run_iteration();
    const IterationRecord& expected = straight_records[static_cast<std::size_t>(i)];
    for (const auto& [name, a, b] : {std::tuple{"loss", expected.loss, record.loss},
                                     std::tuple{"grad_norm", expected.grad_norm, record.grad_norm},
                                     std::tuple{"lr", expected.lr, record.lr},
                                     std::tuple{"clip_coeff", expected.clip_coeff, record.clip_coeff}}) {
      Finding f;
      f.update = i + 1;
      f.quantity = name;
      f.comparison = Comparison::deterministic;
      f.reference = a;
      f.under_test = b;
      f.ok = same_ieee_value(a, b);
      f.error = f.ok ? 0 : INFINITY;
      report.add(f);
    }
  }
  compare_states_bitwise(total, "straight vs resumed: ", straight->state(), resumed->state(), report);
  assert_report(report);
}

}  // namespace tandem::equivalence
