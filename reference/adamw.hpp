// The reference AdamW update of one parameter element, literally SPEC 7 in the scalar type Real.
// Boring on purpose: every quantity in Real, one expression per line of the SPEC.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/config.hpp"

namespace tandem::reference {

// The Adam hyperparameters widened exactly into Real once per update.
template <class Real>
struct AdamHyper {
  Real beta1;
  Real beta2;
  Real eps;
  Real bias_correction1;  // 1 - b1^t
  Real bias_correction2;  // 1 - b2^t

  AdamHyper(const OptimizerConfig& optimizer, std::int64_t step) {
    using std::pow;
    beta1 = Real(optimizer.adam_beta1);
    beta2 = Real(optimizer.adam_beta2);
    eps = Real(optimizer.adam_eps);
    // SPEC 7: t counts successful updates starting at 1. b^t by repeated multiplication, which is
    // exact in the widest type up to its rounding and independent of a libm's pow.
    Real beta1_power = Real(1);
    Real beta2_power = Real(1);
    for (std::int64_t i = 0; i < step; ++i) {
      beta1_power *= beta1;
      beta2_power *= beta2;
    }
    bias_correction1 = Real(1) - beta1_power;
    bias_correction2 = Real(1) - beta2_power;
  }
};

// Updates one element in place (SPEC 7). `wd` is 0 for the no-decay group.
template <class Real>
void adamw_update(const AdamHyper<Real>& hyper, const Real& lr, const Real& wd, const Real& grad,
                  Real& param, Real& exp_avg, Real& exp_avg_sq) {
  using std::sqrt;
  exp_avg = hyper.beta1 * exp_avg + (Real(1) - hyper.beta1) * grad;               // m
  exp_avg_sq = hyper.beta2 * exp_avg_sq + (Real(1) - hyper.beta2) * grad * grad;  // v
  const Real m_hat = exp_avg / hyper.bias_correction1;
  const Real v_hat = exp_avg_sq / hyper.bias_correction2;
  const Real param_old = param;
  param = param_old - lr * (m_hat / (sqrt(v_hat) + hyper.eps) + wd * param_old);
}

// Test-only: a deliberately wrong AdamW (equivalence negative controls; trainer.hpp Mutants).
// Never called on a user's run: the trainer calls it only when a mutant is switched on.
struct AdamMutation {
  bool l2_instead_of_decoupled = false;  // g += wd*p before the moments; no decoupled decay
  bool eps_inside_sqrt = false;          // m_hat / sqrt(v_hat + eps)
};

template <class Real>
void adamw_update_mutated(const AdamHyper<Real>& hyper, const Real& lr, const Real& wd,
                          const Real& grad, Real& param, Real& exp_avg, Real& exp_avg_sq,
                          const AdamMutation& mutation) {
  using std::sqrt;
  const Real g = mutation.l2_instead_of_decoupled ? grad + wd * param : grad;
  const Real decoupled_wd = mutation.l2_instead_of_decoupled ? Real(0) : wd;
  exp_avg = hyper.beta1 * exp_avg + (Real(1) - hyper.beta1) * g;
  exp_avg_sq = hyper.beta2 * exp_avg_sq + (Real(1) - hyper.beta2) * g * g;
  const Real m_hat = exp_avg / hyper.bias_correction1;
  const Real v_hat = exp_avg_sq / hyper.bias_correction2;
  const Real denominator = mutation.eps_inside_sqrt ? sqrt(v_hat + hyper.eps) : sqrt(v_hat) + hyper.eps;
  const Real param_old = param;
  param = param_old - lr * (m_hat / denominator + decoupled_wd * param_old);
}

}  // namespace tandem::reference
