// Update-by-update comparison of two twins (comparison.hpp).
#include "equivalence/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "equivalence/error_bounds.hpp"
#include "equivalence/float_generator.hpp"
#include "equivalence/statistical_bounds.hpp"
#include "reference/record_audit.hpp"

namespace tandem::equivalence {
namespace {

constexpr std::size_t kKeptFailures = 20;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

double share_of_bound(const Finding& f) {
  if (!f.ok) return kInfinity;
  if (f.bound > 0) return f.error / f.bound;
  return f.error > 0 ? kInfinity : 0.0;
}

Finding exact(std::int64_t update, std::string quantity, std::string where, double reference,
              double under_test) {
  Finding f;
  f.update = update;
  f.quantity = std::move(quantity);
  f.where = std::move(where);
  f.comparison = Comparison::exact;
  f.reference = reference;
  f.under_test = under_test;
  f.ok = same_ieee_value(reference, under_test);
  f.error = f.ok ? 0.0 : (std::isnan(reference) || std::isnan(under_test) ? kInfinity
                                                                          : std::abs(reference - under_test));
  return f;
}

// NaN and infinities by class first, then the metric.
Finding approximate(std::int64_t update, std::string quantity, std::string where, double reference,
                    double under_test, double bound) {
  Finding f;
  f.update = update;
  f.quantity = std::move(quantity);
  f.where = std::move(where);
  f.comparison = Comparison::approximate;
  f.reference = reference;
  f.under_test = under_test;
  f.bound = bound;
  if (!std::isfinite(reference) || !std::isfinite(under_test)) {
    f.ok = classify(reference) == classify(under_test);
    f.error = f.ok ? 0.0 : kInfinity;
    return f;
  }
  f.error = std::abs(reference - under_test);
  f.ok = f.error == 0 || f.error <= bound;  // equal needs no bound; false for a NaN bound
  return f;
}

void compare_counters(std::int64_t update, const std::string& prefix, const Counters& r,
                      const Counters& t, Report& report) {
  auto add = [&](const char* name, std::int64_t a, std::int64_t b) {
    report.add(exact(update, prefix + name, "", static_cast<double>(a), static_cast<double>(b)));
  };
  add("iteration", r.iteration, t.iteration);
  add("consumed_samples", r.consumed_samples, t.consumed_samples);
  add("successful_updates", r.successful_updates, t.successful_updates);
  add("skipped_updates", r.skipped_updates, t.skipped_updates);
  add("consecutive_skips", r.consecutive_skips, t.consecutive_skips);
  add("input_tokens", r.input_tokens, t.input_tokens);
  add("loss_tokens", r.loss_tokens, t.loss_tokens);
  add("pad_tokens", r.pad_tokens, t.pad_tokens);
  add("scheduler_samples", r.scheduler_samples, t.scheduler_samples);
}

}  // namespace

void Report::add(const Finding& given) {
  Finding finding = given;
  const bool finite_values = std::isfinite(finding.reference) && std::isfinite(finding.under_test);
  if (finding.comparison == Comparison::approximate && finite_values) {
    if (!(finding.bound >= 0)) {
      // A bound is never negative: a negative or NaN one means its derivation went wrong (issue
      // 15 saw one), and an equal pair must not hide that.
      finding.ok = false;
      finding.where += (finding.where.empty() ? "" : " ") + std::string("[broken bound: ") +
                       std::to_string(finding.bound) + " is negative or NaN]";
    } else if (finding.bound > 0 && std::isfinite(finding.bound)) {
      ratios_[finding.quantity].push_back(static_cast<float>(finding.error / finding.bound));
    }
  }
  if (!finding.ok) {
    ++failures_;
    // Every failure is kept (up to a cap), beside the worst finding of its quantity.
    if (static_cast<std::size_t>(failures_) <= kKeptFailures) findings_.push_back(finding);
    return;
  }
  const auto key = std::make_pair(finding.update, finding.quantity);
  const auto found = worst_.find(key);
  if (found == worst_.end()) {
    worst_.emplace(key, findings_.size());
    findings_.push_back(finding);
  } else if (share_of_bound(finding) > share_of_bound(findings_[found->second])) {
    findings_[found->second] = finding;
  }
}

std::string Report::text(std::size_t max_lines) const {
  std::ostringstream os;
  os << std::setprecision(17);
  for (const auto& line : notes_) os << line << "\n";
  std::size_t lines = 0;
  std::vector<const Finding*> ordered;
  for (const auto& f : findings_) ordered.push_back(&f);
  // Failures first, so a truncated report still shows them.
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const Finding* a, const Finding* b) { return !a->ok && b->ok; });
  for (const Finding* f : ordered) {
    if (lines++ >= max_lines) {
      os << "... " << findings_.size() - max_lines << " more\n";
      break;
    }
    os << (f->ok ? "ok   " : "FAIL ") << "update " << f->update << " " << f->quantity;
    if (!f->where.empty()) os << " " << f->where;
    os << " (" << to_string(f->comparison) << "): reference " << f->reference << ", under test "
       << f->under_test << ", error " << f->error;
    if (f->comparison == Comparison::approximate) {
      // The error as a share of the bound, failed or not (share_of_bound ranks failures first).
      const double shown = f->bound > 0 ? f->error / f->bound : share_of_bound(*f);
      os << ", bound " << f->bound << " (" << std::setprecision(3) << 100.0 * shown
         << "% of the bound)" << std::setprecision(17);
    }
    os << "\n";
  }
  if (failures_ > 0) os << failures_ << " comparison(s) failed\n";
  return os.str();
}

std::map<std::string, Sharpness> Report::sharpness() const {
  std::map<std::string, Sharpness> out;
  for (const auto& [quantity, given] : ratios_) {
    std::vector<float> ratios = given;
    Sharpness s;
    s.compared = static_cast<std::int64_t>(ratios.size());
    const auto at = [&ratios](double fraction) {
      const auto k = static_cast<std::size_t>(fraction * static_cast<double>(ratios.size() - 1));
      std::nth_element(ratios.begin(), ratios.begin() + static_cast<std::ptrdiff_t>(k), ratios.end());
      return ratios[k];
    };
    s.max = *std::max_element(ratios.begin(), ratios.end());
    s.p90 = at(0.9);
    s.median = at(0.5);
    out.emplace(quantity, s);
  }
  return out;
}

std::string Report::sharpness_text() const {
  std::ostringstream os;
  os << std::setprecision(3);
  for (const auto& [quantity, s] : sharpness()) {
    os << "sharpness (error / bound) " << quantity << ": ";
    if (s.compared == 1) {
      os << s.max << "\n";
      continue;
    }
    os << "median " << s.median << ", p90 " << s.p90 << ", max " << s.max << " over " << s.compared
       << " values with a bound > 0\n";
  }
  return os.str();
}

void compare_samples(std::int64_t update, const Sample& r, const Sample& t, Report& report) {
  const std::string where = "sample " + std::to_string(r.global_index);
  auto vectors = [&](const char* name, const auto& a, const auto& b) {
    if (a.size() != b.size()) {
      report.add(exact(update, std::string("sample.") + name + ".size", where,
                       static_cast<double>(a.size()), static_cast<double>(b.size())));
      return;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      report.add(exact(update, std::string("sample.") + name, where + " position " + std::to_string(i),
                       static_cast<double>(a[i]), static_cast<double>(b[i])));
    }
  };
  vectors("tokens", r.tokens, t.tokens);
  vectors("labels", r.labels, t.labels);
  vectors("loss_mask", r.loss_mask, t.loss_mask);
  vectors("positions", r.positions, t.positions);
  vectors("attention_start", r.attention_start, t.attention_start);
}

void compare_states_bitwise(std::int64_t update, const std::string& what, const TwinState& r,
                            const TwinState& t, Report& report) {
  auto vectors = [&](const char* name, const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) {
      report.add(exact(update, what + name + ".size", "", static_cast<double>(a.size()),
                       static_cast<double>(b.size())));
      return;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      Finding f = exact(update, what + name, "[" + std::to_string(i) + "]", a[i], b[i]);
      f.comparison = Comparison::deterministic;
      report.add(f);
    }
  };
  vectors("params", r.params, t.params);
  vectors("exp_avg", r.exp_avg, t.exp_avg);
  vectors("exp_avg_sq", r.exp_avg_sq, t.exp_avg_sq);
  compare_counters(update, what + "counters.", r.counters, t.counters, report);
}

bool statistical_bounds_enabled() {
  static const bool enabled = [] {
    const char* setting = std::getenv("TANDEM_EQUIVALENCE_BOUNDS");
    if (setting == nullptr || std::string(setting) == "statistical") return true;
    if (std::string(setting) == "rigorous") return false;
    throw std::invalid_argument(std::string("TANDEM_EQUIVALENCE_BOUNDS=") + setting +
                                ": must be rigorous or statistical; fix: unset it for both bounds");
  }();
  return enabled;
}

PrecisionPair harness_pair(const Precision& under_test, const Precision& reference) {
  PrecisionPair pair{under_test, reference};
  pair.rigorous_only = !statistical_bounds_enabled();
  return pair;
}

namespace {

// Each element's bound becomes the smaller of its own and `sharper`'s, which must bound the same
// elements: a reference gradient of another length than the config's parameters is a caller's bug.
void tighten(std::vector<double>& bounds, const std::vector<double>& sharper, const char* what) {
  if (sharper.size() != bounds.size()) {
    throw std::logic_error(std::string("update_bounds: ") + what + " cover " + std::to_string(sharper.size()) +
                           " gradient elements, the reference's gradient has " + std::to_string(bounds.size()));
  }
  for (std::size_t i = 0; i < bounds.size(); ++i) bounds[i] = std::min(bounds[i], sharper[i]);
}

}  // namespace

UpdateBounds update_bounds(const RunConfig& config, const PrecisionPair& precisions,
                           const UpdateObservation& reference, double clip_coeff) {
  const IterationRecord& r = reference.record;
  const ReductionShape shape = reduction_shape(config);
  double max_pre_clip = 0;
  for (const double g : reference.gradient) max_pre_clip = std::max(max_pre_clip, std::abs(g) / clip_coeff);
  const double worst_case = gradient_bound(shape, precisions, max_pre_clip);
  UpdateBounds bounds;
  bounds.gradient.assign(reference.gradient.size(), worst_case);
  bounds.loss = loss_bound(shape, precisions, r.loss, config.model.padded_vocab_size);
  std::vector<double> pre_clip(reference.gradient.size());  // [P]
  for (std::size_t i = 0; i < pre_clip.size(); ++i) pre_clip[i] = reference.gradient[i] / clip_coeff;
  bounds.norm = std::min(norm_bound(shape, precisions, worst_case, r.grad_norm),
                         norm_bound_from_elements(shape, precisions, bounds.gradient, pre_clip, r.grad_norm));
  if (reference.batch.empty() || !per_element_bounds_apply(precisions)) return bounds;
  // Each element (and the loss) takes the smaller of two bounds: the per-element one is the
  // sharper at the top of the network, the worst case at depth (docs/EQUIVALENCE.md).
  const GradientErrorBounds sharp =
      gradient_error_bounds(config, reference.before.params, reference.batch, precisions);
  tighten(bounds.gradient, sharp.gradient, "the per-element bounds");
  bounds.loss = std::min(bounds.loss, sharp.loss);
  bounds.norm = std::min(bounds.norm,
                         norm_bound_from_elements(shape, precisions, bounds.gradient, pre_clip, r.grad_norm));
  if (precisions.rigorous_only) return bounds;
  // The statistical bounds, where smaller: sharp to within ~100x of a correct twin's error, and
  // exceeded by one with probability 1e-12 per value under their model (statistical_bounds.hpp).
  const std::uint64_t seed = static_cast<std::uint64_t>(reference.batch.front().global_index) * 0x9e3779b97f4a7c15ULL ^
                             static_cast<std::uint64_t>(r.iteration);
  const StatisticalBounds statistical =
      statistical_error_bounds(config, reference.before.params, reference.batch, precisions, seed);
  if (!statistical.finite) return bounds;
  tighten(bounds.gradient, statistical.gradient, "the statistical bounds");
  bounds.loss = std::min(bounds.loss, statistical.loss);
  bounds.norm = std::min(bounds.norm, statistical.norm);
  return bounds;
}

void compare_update(std::int64_t update, const RunConfig& config, const ModelLayout& layout,
                    const PrecisionPair& precisions, const UpdateObservation& ref,
                    const UpdateObservation& test, Report& report) {
  const IterationRecord& r = ref.record;
  const IterationRecord& t = test.record;
  auto add_exact = [&](const char* name, double a, double b) {
    report.add(exact(update, name, "", a, b));
  };
  // Exact: what the update did and the schedule it used (SPEC 1, 6, 8).
  add_exact("iteration", static_cast<double>(r.iteration), static_cast<double>(t.iteration));
  add_exact("update_successful", r.update_successful, t.update_successful);
  add_exact("step", static_cast<double>(r.step), static_cast<double>(t.step));
  add_exact("lr", r.lr, t.lr);
  add_exact("wd", r.wd, t.wd);
  add_exact("input_tokens", static_cast<double>(r.input_tokens), static_cast<double>(t.input_tokens));
  add_exact("loss_tokens", static_cast<double>(r.loss_tokens), static_cast<double>(t.loss_tokens));
  add_exact("pad_tokens", static_cast<double>(r.pad_tokens), static_cast<double>(t.pad_tokens));
  compare_counters(update, "counters.", ref.after.counters, test.after.counters, report);

  // Approximate: loss and norm (SPEC 5, 6).
  const std::size_t elements = ref.gradient.size();
  const double coeff = r.clip_coeff;
  const UpdateBounds bounds = update_bounds(config, precisions, ref, coeff);
  const std::vector<double>& grad_errors = bounds.gradient;
  const double loss_error = bounds.loss;
  const double norm_error = bounds.norm;
  report.add(approximate(update, "loss", "", r.loss, t.loss, loss_error));
  report.add(approximate(update, "grad_norm", "", r.grad_norm, t.grad_norm, norm_error));

  if (r.update_successful != t.update_successful) return;  // reported above
  if (r.clipped == t.clipped) add_exact("clipped", r.clipped, t.clipped);
  if (r.clipped != t.clipped) {
    // SPEC 6: clipping applies when clip < norm + 1e-6. A twin whose norm is known only within
    // the norm bound cannot be held to the flag when the threshold lies inside that bound.
    const double distance = std::abs(config.optimizer.clip_grad - (r.grad_norm + kClipNormEpsilon));
    Finding flag = exact(update, "clipped", "", r.clipped, t.clipped);
    if (distance <= norm_error) {
      flag.ok = true;
      flag.where = "undecidable: the threshold lies within the norm bound (" +
                   std::to_string(distance) + " <= " + std::to_string(norm_error) +
                   "); this update's state is not compared";
    }
    report.add(flag);
    return;
  }
  if (!r.update_successful) {
    // SPEC 8: a skipped update changes no weight or moment: both states equal the one before.
    compare_states_bitwise(update, "skipped: ", ref.after, test.after, report);
    return;
  }
  const double u = precisions.under_test.unit_roundoff + precisions.reference.unit_roundoff;
  // coeff = clip / (norm + 1e-6) with the norm known within norm_error; both coefficients lie in
  // (0, 1], so the error never exceeds 1 (the first-order form fails once norm_error ~ norm).
  const double coeff_error =
      r.clipped ? std::min(1.0, coeff * norm_error / std::max(r.grad_norm + kClipNormEpsilon - norm_error, kClipNormEpsilon) +
                                    2 * u * coeff)
                : 0.0;
  report.add(approximate(update, "clip_coeff", "", r.clip_coeff, t.clip_coeff, coeff_error));

  if (test.gradient.size() != elements || test.after.params.size() != elements) {
    report.add(exact(update, "elements", "", static_cast<double>(elements),
                     static_cast<double>(test.gradient.size())));
    return;
  }
  for (const auto& tensor : layout.tensors) {
    const double tensor_wd = tensor.decay_group == DecayGroup::decay ? r.wd : 0.0;
    for (std::int64_t e = 0; e < tensor.numel; ++e) {
      const auto i = static_cast<std::size_t>(tensor.offset + e);
      const double g = ref.gradient[i];
      const double grad_error = grad_errors[i];
      const double g_error =
          r.clipped ? clipped_gradient_bound(g / coeff, grad_error, r.grad_norm, norm_error, coeff,
                                             precisions)
                    : grad_error;
      const std::string where = tensor.name + "[" + std::to_string(e) + "]";
      report.add(approximate(update, "gradient", where, g, test.gradient[i], g_error));

      AdamwElementInput in;
      in.param = ref.before.params[i];
      in.exp_avg = ref.before.exp_avg[i];
      in.exp_avg_sq = ref.before.exp_avg_sq[i];
      in.grad = g;
      in.grad_error = g_error;
      in.lr = r.lr;
      in.wd = tensor_wd;
      in.beta1 = config.optimizer.adam_beta1;
      in.beta2 = config.optimizer.adam_beta2;
      in.eps = config.optimizer.adam_eps;
      in.step = r.step;
      const AdamwElementBound bound = adamw_element_bound(in, precisions);
      report.add(approximate(update, "params", where, ref.after.params[i], test.after.params[i],
                             bound.param));
      report.add(approximate(update, "exp_avg", where, ref.after.exp_avg[i],
                             test.after.exp_avg[i], bound.exp_avg));
      report.add(approximate(update, "exp_avg_sq", where, ref.after.exp_avg_sq[i],
                             test.after.exp_avg_sq[i], bound.exp_avg_sq));
    }
  }
}

std::vector<Sample> update_batch(const Twin& twin, const TwinState& before, const RunConfig& config) {
  std::vector<Sample> batch;  // [GBS]
  const std::int64_t first = before.counters.consumed_samples;
  for (std::int64_t index = first; index < first + config.batch.global_batch_size; ++index) {
    batch.push_back(twin.consumed_sample(index));
  }
  return batch;
}

namespace {

// What each twin's records prove about themselves, checked exactly as `tandem audit` checks a log
// (reference/record_audit.hpp): the skip and clip decisions, clip_coeff bit for
// bit, lr and wd from the schedule at the record's counters, step, the token sums, and the
// counters from one record to the next. A failed check fails the report, whatever the bounds say.
class RecordChecks {
 public:
  RecordChecks(const RunConfig& config, const Precision& precision, std::string whose) : whose_(std::move(whose)) {
    // The engine names the audit's arithmetic: production's clip and schedule are double (as the
    // double reference's); the 50-digit reference has its own.
    const bool reference = precision.name == "fp64" || precision.name == "float50";
    const nlohmann::json header = {
        {"type", "header"},
        {"engine", reference ? "reference" : "production"},
        {"main_precision", precision.name == "fp64" ? "double" : precision.name},
        {"config", config},
        // A twin may start anywhere (a schedule position, a loaded state): its first record
        // starts the counters' comparison, as after a resume whose record the log lacks.
        {"resumed_from_iteration", -1}};
    auditor_.header(header, 0);
  }

  void check(std::int64_t update, const IterationRecord& record, Report& report) {
    const std::size_t known = auditor_.findings().size();
    auditor_.iteration(nlohmann::json(record), update);
    for (std::size_t i = known; i < auditor_.findings().size(); ++i) {
      const reference::RecordFinding& found = auditor_.findings()[i];
      Finding f;
      f.update = update;
      f.quantity = "record of the " + whose_ + ": " + found.field + " logged " + found.logged + ", the rule gives " +
                   found.expected + " (" + found.rule + ")";
      f.where = "iteration " + std::to_string(found.iteration);
      f.comparison = Comparison::exact;
      f.reference = std::strtod(found.expected.c_str(), nullptr);
      f.under_test = std::strtod(found.logged.c_str(), nullptr);
      f.error = kInfinity;
      f.ok = false;
      report.add(f);
    }
  }

 private:
  std::string whose_;
  reference::RecordAuditor auditor_;
};

}  // namespace

void run_teacher_forced(Twin& reference, Twin& under_test, std::int64_t updates,
                        const RunConfig& config, const PrecisionPair& precisions, Report& report,
                        const std::function<void(std::int64_t, const UpdateObservation&,
                                                 const UpdateObservation&)>& on_update,
                        bool compare_consumed_samples) {
  const ModelLayout layout = make_model_layout(config.model);
  RecordChecks reference_records(config, precisions.reference, "reference");
  RecordChecks test_records(config, precisions.under_test, "twin under test");
  for (std::int64_t update = 1; update <= updates; ++update) {
    UpdateObservation ref;
    UpdateObservation test;
    test.before = under_test.state();
    reference.load_state(test.before);
    ref.before = reference.state();
    ref.record = reference.run_iteration();
    ref.after = reference.state();
    ref.gradient = reference.last_gradient();
    ref.batch = update_batch(reference, test.before, config);
    test.record = under_test.run_iteration();
    test.after = under_test.state();
    test.gradient = under_test.last_gradient();
    compare_update(update, config, layout, precisions, ref, test, report);
    reference_records.check(update, ref.record, report);
    test_records.check(update, test.record, report);
    const std::int64_t first = test.before.counters.consumed_samples;
    const std::int64_t last = compare_consumed_samples ? first + config.batch.global_batch_size : first;
    for (std::int64_t index = first; index < last; ++index) {
      compare_samples(update, reference.consumed_sample(index), under_test.consumed_sample(index),
                      report);
    }
    if (on_update) on_update(update, ref, test);
  }
}

}  // namespace tandem::equivalence
