// The named tolerances of the equivalence harness, each derived from the arithmetic's unit
// roundoff and the reduction length (STYLE: state the comparison class before any tolerance).
//
// Comparison classes:
//   exact         — counters, lr, wd, flags, step: the same integer / the same double, bitwise;
//   deterministic — the same twin, the same inputs: bitwise run to run (resume, skipped updates);
//   approximate   — loss, norm, gradients, weights and moments of two twins whose arithmetic or
//                   summation order differ: |a - b| <= bound, the bound derived below.
//
// The update comparison is teacher-forced (equivalence/comparison.hpp): before each update the
// reference is loaded with the twin under test's own state, so the bound of one update is the
// rounding of that update alone, never an amplified history. Counters are compared over the
// whole trajectory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace tandem::equivalence {

enum class Comparison { exact, deterministic, approximate };
std::string to_string(Comparison comparison);

// The arithmetic of a twin: where it rounds and by how much (relative, round to nearest).
struct Precision {
  std::string name;             // "fp64", "float50", "fp32", "bf16"
  double unit_roundoff = 0;     // u of every accumulation and of the main state
  // u of the compute-typed stores (bf16: activations and compute weights are rounded to bf16 once
  // per op output, production/backend.hpp); equal to unit_roundoff when there is no such store.
  double compute_roundoff = 0;
  // Absolute error of one rounding that underflows (half the smallest subnormal): the relative
  // bound u|x| does not hold below the normal range.
  double underflow = 0;
  // u of the global norm's sum of squares and root (SPEC 6): production adds the squares of its
  // fp32 main gradients in double, each square exact (production/kernels/optimizer_host.cpp and
  // optimizer.cu), so its fp32 and bf16 twins round that sum as fp64 does.
  double norm_roundoff = 0;
};
Precision fp64();     // u = 2^-53
Precision float50();  // u = 2^-166 (cpp_bin_float_50's significand)
Precision fp32();     // u = 2^-24
Precision bf16();     // main u = 2^-24, compute stores u = 2^-8

// gamma_n = n u / (1 - n u) (Higham): the relative error bound of a sum or dot product of n
// terms in any order. +inf when n u >= 1 (no worst-case bound exists).
double gamma(std::int64_t terms, double unit_roundoff);

// Reduction lengths of one update of a model (SPEC 4, 5).
struct ReductionShape {
  std::int64_t gradient_terms = 0;  // GBS x seq x max(d, F, V_padded): the longest sum into one
                                    // gradient element (tests/reference_trainer_test.cpp)
  std::int64_t samples = 0;         // GBS: per-sample parts of a gradient may cancel
  std::int64_t elements = 0;        // P: unique parameter elements, the norm's sum length
  std::int64_t forward_depth = 0;   // compute-typed roundings along the longest forward+backward
                                    // path: 2 x (15 L + 3) (stores, and bf16 attention's one
                                    // in-op rounding per block)
};
ReductionShape reduction_shape(const RunConfig& config);

// The two arithmetics compared: the twin under test and the reference it is held against.
struct PrecisionPair {
  Precision under_test;
  Precision reference;
  // Hold the pair to the rigorous bounds alone: no statistical bound
  // (equivalence/statistical_bounds.hpp), so no finding can be a false alarm of the model.
  bool rigorous_only = false;
};

// Gradient element (after reduction, before clipping), the worst case: every element gets the
// same bound. equivalence/error_bounds.hpp's per-element bound sharpens it where it is smaller
// (comparison.hpp's update_bounds). Two evaluations of the same sum of n terms
// differ by at most (gamma_n(u_test) + gamma_n(u_ref)) sum|terms|; sum|terms| is taken as
// max|g| x GBS (the per-sample parts may cancel). A bf16 twin adds one compute rounding per store
// along the path: forward_depth x u_compute x max|g| x GBS.
double gradient_bound(const ReductionShape& shape, const PrecisionPair& precisions,
                      double max_abs_gradient);

// Global norm: |norm(a) - norm(b)| <= ||a - b||_2 <= sqrt(P) x gradient bound, plus each side's
// rounding of its own sum of P squares and the root, in its norm arithmetic:
// (gamma_{P+1}(u_norm,test) + gamma_{P+1}(u_norm,ref)) x norm.
double norm_bound(const ReductionShape& shape, const PrecisionPair& precisions,
                  double gradient_element_bound, double norm);

// Global norm from per-element bounds e_i (equivalence/error_bounds.hpp) around the reference's
// gradient a (before clipping), b = a + d with |d_i| <= e_i: the smaller of
//   ||a - b||_2 <= sqrt(sum e_i^2)                       (the triangle inequality), and
//   |(||b||^2 - ||a||^2)| / (||a|| + ||b||) <= (2 sum |a_i| e_i + sum e_i^2) / (||a|| + max(0, ||a|| - ||e||))
// (||b||^2 = ||a||^2 + 2 a.d + ||d||^2): an error that lies across the gradient moves its norm at
// second order only, and the bounds are largest where the gradient is smallest (the deep layers'
// elements); plus each side's rounding of its own norm as in norm_bound.
double norm_bound_from_elements(const ReductionShape& shape, const PrecisionPair& precisions,
                                const std::vector<double>& element_bounds,
                                const std::vector<double>& gradient, double norm);

// Loss: the mean of per-position CE = lse(z) - z_label over the global batch. Each CE is a
// difference of terms of magnitude at most (loss + ln V_padded) to first order, reached through
// reductions of the gradient's length: (gamma_n(u_test) + gamma_n(u_ref)) x (loss + ln V), plus
// the bf16 store term as for gradients.
double loss_bound(const ReductionShape& shape, const PrecisionPair& precisions, double loss,
                  std::int64_t padded_vocab_size);

// One AdamW element (SPEC 7) from the same pre-update p, m, v, with a main gradient known to
// within `grad_error`: first-order propagation through m, v, the bias corrections, sqrt, the
// quotient and the step, plus each side's rounding as reference/audit.cpp derives it (3u for m,
// 4u for v, t u b^t / (1 - b^t) + u per bias correction, 6u for the Adam term, 3u for the step,
// u for the store), doubled for second-order terms (reference/audit.cpp kSecondOrderMargin),
// plus one underflow term per rounding (subnormal results).
struct AdamwElementInput {
  double param = 0, exp_avg = 0, exp_avg_sq = 0;  // before the update (shared)
  double grad = 0;                                // the reference's main gradient (after clipping)
  double grad_error = 0;                          // |g_test - g_ref| bound
  double lr = 0, wd = 0;                          // wd 0 for the no-decay group
  double beta1 = 0, beta2 = 0, eps = 0;
  std::int64_t step = 1;                          // t
};
struct AdamwElementBound {
  double exp_avg = 0;
  double exp_avg_sq = 0;
  double param = 0;
};
AdamwElementBound adamw_element_bound(const AdamwElementInput& input,
                                      const PrecisionPair& precisions);

// A clipped gradient g x coeff, coeff = clip / (norm + 1e-6) (SPEC 6), from g known to within
// `grad_error` and the norm to within `norm_error`: coeff x grad_error + |g| x coeff error, with
// coeff error = coeff x norm_error / (norm + 1e-6 - norm_error) + 2 (u_test + u_ref) coeff.
double clipped_gradient_bound(double grad, double grad_error, double norm, double norm_error,
                              double coeff, const PrecisionPair& precisions);

}  // namespace tandem::equivalence
