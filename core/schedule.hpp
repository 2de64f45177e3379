// The learning-rate and weight-decay schedule of SPEC 8, shared by the planner, `tandem schedule`,
// the reference trainer (in wide arithmetic) and the production trainer (in double).
// Header-only templates over the arithmetic type Real: double, or a Boost.Multiprecision type such
// as cpp_bin_float_50 (found through argument-dependent lookup; this header includes no Boost).
// The formulas and their order of operations are Megatron-LM's OptimizerParamScheduler.get_lr and
// get_wd, with the step counter in samples (n = scheduler samples).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/config.hpp"

namespace tandem {

namespace schedule_detail {

// pi in the precision of Real, so a 50-digit reference does not inherit double's pi.
template <class Real>
Real pi() {
  using std::acos;
  return Real(acos(Real(-1)));
}

// (numerator / denominator) in Real, both sample counts. A zero-length span gives ratio 0: the
// schedule is then at the span's start (Megatron would divide by zero; tandem never does).
template <class Real>
Real span_ratio(std::int64_t numerator_samples, std::int64_t denominator_samples) {
  if (denominator_samples == 0) return Real(0);
  return Real(numerator_samples) / Real(denominator_samples);
}

}  // namespace schedule_detail

// Learning rate at scheduler position n (samples). SPEC 8, in Megatron's order of operations:
//   warmup  (W > 0, n <= W): init + (max - init) * n / W
//   constant style, n > W:   max, forever
//   n > D:                   min
//   otherwise ratio = (n - W) / (D - W), lr = min + coeff * (max - min) with
//     linear coeff = 1 - ratio            (= SPEC's max - ratio*(max - min) in exact arithmetic)
//     cosine coeff = 0.5 * (cos(pi * ratio) + 1)
template <class Real>
Real learning_rate(const ScheduleConfig& schedule, std::int64_t scheduler_samples) {
  using std::cos;
  const std::int64_t n = scheduler_samples;
  const std::int64_t warmup = schedule.lr_warmup_samples;  // W, samples
  const std::int64_t decay = schedule.lr_decay_samples;    // D, samples from 0, incl. warmup
  const Real max_lr = Real(schedule.lr);
  const Real min_lr = Real(schedule.min_lr);
  const Real init_lr = Real(schedule.lr_warmup_init);

  if (warmup > 0 && n <= warmup) {
    return Real(init_lr + (max_lr - init_lr) * Real(n) / Real(warmup));
  }
  if (schedule.lr_decay_style == LrDecayStyle::constant) return max_lr;
  if (n > decay) return min_lr;

  const Real ratio = schedule_detail::span_ratio<Real>(n - warmup, decay - warmup);
  const Real delta_lr = max_lr - min_lr;
  Real coeff = Real(0);
  switch (schedule.lr_decay_style) {
    case LrDecayStyle::linear:
      coeff = Real(1) - ratio;
      break;
    case LrDecayStyle::cosine:
      coeff = Real(0.5) * (Real(cos(Real(schedule_detail::pi<Real>() * ratio))) + Real(1));
      break;
    case LrDecayStyle::constant:
      return max_lr;  // handled above; kept so every style is named here
  }
  return Real(min_lr + coeff * delta_lr);
}

// Weight decay at scheduler position n (samples). SPEC 8 "as Megatron defines them":
//   n > wd_incr_samples: end
//   constant style:      end (= start = --weight-decay)
//   ratio = n / wd_incr_samples, wd = start + coeff * (end - start) with
//     linear coeff = ratio
//     cosine coeff = 0.5 * (cos(pi * (1 - ratio)) + 1)
template <class Real>
Real weight_decay_at(const ScheduleConfig& schedule, std::int64_t scheduler_samples) {
  using std::cos;
  const std::int64_t n = scheduler_samples;
  const Real start_wd = Real(schedule.start_weight_decay);
  const Real end_wd = Real(schedule.end_weight_decay);

  if (n > schedule.wd_incr_samples) return end_wd;
  if (schedule.weight_decay_incr_style == WeightDecayIncrStyle::constant) return end_wd;

  const Real ratio = schedule_detail::span_ratio<Real>(n, schedule.wd_incr_samples);
  const Real delta_wd = end_wd - start_wd;
  Real coeff = Real(0);
  switch (schedule.weight_decay_incr_style) {
    case WeightDecayIncrStyle::linear:
      coeff = ratio;
      break;
    case WeightDecayIncrStyle::cosine:
      coeff = Real(0.5) *
              (Real(cos(Real(schedule_detail::pi<Real>() * (Real(1) - ratio)))) + Real(1));
      break;
    case WeightDecayIncrStyle::constant:
      return end_wd;  // handled above
  }
  return Real(start_wd + coeff * delta_wd);
}

// SPEC 8: update k (1-based) uses lr((k - 1) x GBS) when every update before it succeeded.
inline std::int64_t scheduler_samples_before_update(std::int64_t update, std::int64_t gbs) {
  return (update - 1) * gbs;
}

}  // namespace tandem
