// Every host op of the production backend (production/kernels/*_host.cpp, the code the cpu
// backend ships) against the reference op (reference/model_ops.hpp) in fp32.
//
// Kind of comparison: approximate, elementwise, |host - reference| <= bound with the bound derived
// next to each comparison from fp32's unit roundoff u = 2^-24, the reduction length n and the sum
// of |terms| (Higham: a recursive fp32 sum of n terms errs by at most gamma_n sum|terms|,
// gamma_n = n u / (1 - n u) <= 1.01 n u here). The reference runs in double on the SAME fp32
// inputs widened exactly, so its own error (2^-53 relative) is below 1e-9 of every bound.
// Exact comparisons where the op has no rounding (embedding forward, conversions, AdamW on dyadic
// inputs). Every approximate check has a negative control: the reference perturbed by 4x the bound
// at one element must be rejected.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/checkpoint/tensor_data.hpp"
#include "core/init.hpp"
#include "production/kernels/attention.hpp"
#include "production/kernels/cross_entropy.hpp"
#include "production/kernels/elementwise.hpp"
#include "production/kernels/embedding.hpp"
#include "production/kernels/gemm.hpp"
#include "production/kernels/host_workers.hpp"
#include "production/kernels/optimizer.hpp"
#include "production/kernels/rmsnorm.hpp"
#include "production/kernels/rope.hpp"
#include "production/kernels/swiglu.hpp"
#include "reference/adamw.hpp"
#include "reference/model_ops.hpp"

namespace tandem {
namespace {

using namespace tandem::production;

const double kUnitRoundoff = std::ldexp(1.0, -24);  // u of fp32

// Values in [-scale, scale) from a counter-based stream (core/init.hpp), as fp32.
std::vector<float> random_values(std::int64_t count, std::uint64_t seed, double scale) {
  std::vector<float> values(static_cast<std::size_t>(count));
  const std::uint64_t stream = splitmix64_mix(seed);
  for (std::int64_t i = 0; i < count; ++i) {
    const double unit = static_cast<double>(init_stream_word(stream, static_cast<std::uint64_t>(i)) >> 11) *
                        std::ldexp(1.0, -53);  // [0, 1)
    values[static_cast<std::size_t>(i)] = static_cast<float>(scale * (2.0 * unit - 1.0));
  }
  return values;
}

std::vector<double> widen(const std::vector<float>& values) { return {values.begin(), values.end()}; }

struct Verdict {
  bool ok = true;
  std::string report;  // the worst element: index, both values, bound, % of bound
};

// NaN/Inf first, then |got - want| <= bound elementwise.
Verdict compare(const std::string& name, const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<double>& bound) {
  Verdict verdict;
  if (got.size() != want.size() || want.size() != bound.size()) {
    return {false, name + ": sizes differ"};
  }
  double worst_ratio = -1;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      return {false, name + "[" + std::to_string(i) + "] is not finite: got " +
                         std::to_string(got[i]) + " want " + std::to_string(want[i])};
    }
    const double error = std::abs(static_cast<double>(got[i]) - want[i]);
    const double ratio = bound[i] > 0 ? error / bound[i] : (error == 0 ? 0 : 1e300);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
    if (error > bound[i]) verdict.ok = false;
  }
  char line[256];
  std::snprintf(line, sizeof line, "%s: worst [%zu] got %.9g want %.12g error %.3g bound %.3g (%.1f%% of bound)",
                name.c_str(), worst, static_cast<double>(got[worst]), want[worst],
                std::abs(static_cast<double>(got[worst]) - want[worst]), bound[worst], 100 * worst_ratio);
  verdict.report = line;
  return verdict;
}

// The check and its negative control: the reference moved by 4x the bound at the element with
// the largest bound (never one whose bound is 0, where any move fails trivially) must fail.
void expect_within(const std::string& name, const std::vector<float>& got,
                   const std::vector<double>& want, const std::vector<double>& bound) {
  const Verdict verdict = compare(name, got, want, bound);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  std::printf("%s\n", verdict.report.c_str());
  std::vector<double> shifted = want;
  const auto widest = static_cast<std::size_t>(std::max_element(bound.begin(), bound.end()) - bound.begin());
  shifted[widest] += 4 * bound[widest];
  EXPECT_FALSE(compare(name + " (negative control)", got, shifted, bound).ok)
      << name << ": a reference shifted by 4x the bound was accepted";
}

// ---------------------------------------------------------------------------------------- GEMM

struct GemmCase {
  std::int64_t m, n, k;
  Transpose a_transpose, b_transpose;
  float beta;
};

TEST(ProductionOps, GemmMatchesReferenceLinearInEveryLayout) {
  const std::vector<GemmCase> cases = {
      {5, 7, 33, Transpose::no, Transpose::yes, 0.0f},   // forward X W^T (linear_forward)
      {5, 33, 7, Transpose::no, Transpose::no, 0.0f},    // input grad dY W (linear_backward)
      {7, 33, 5, Transpose::yes, Transpose::no, 1.0f},   // weight grad dY^T X += (linear_backward)
      {6, 4, 65, Transpose::yes, Transpose::yes, 1.0f},  // both transposed, accumulate
  };
  for (const GemmCase& c : cases) {
    const std::vector<float> a = random_values(c.m * c.k, 11, 1.0);  // op(A) [m, k] as stored
    const std::vector<float> b = random_values(c.k * c.n, 12, 1.0);  // op(B) [k, n] as stored
    std::vector<float> out = random_values(c.m * c.n, 13, 1.0);      // [m, n] C
    const std::vector<float> initial = out;
    auto a_at = [&](std::int64_t i, std::int64_t l) {  // op(A)[i, l]
      return static_cast<double>(c.a_transpose == Transpose::no ? a[static_cast<std::size_t>(i * c.k + l)]
                                                                : a[static_cast<std::size_t>(l * c.m + i)]);
    };
    auto b_at = [&](std::int64_t l, std::int64_t j) {  // op(B)[l, j]
      return static_cast<double>(c.b_transpose == Transpose::no ? b[static_cast<std::size_t>(l * c.n + j)]
                                                                : b[static_cast<std::size_t>(j * c.k + l)]);
    };
    GemmParams params;
    params.m = c.m;
    params.n = c.n;
    params.k = c.k;
    params.a = GemmOperand{a.data(), DType::f32, c.a_transpose};
    params.b = GemmOperand{b.data(), DType::f32, c.b_transpose};
    params.c = out.data();
    params.beta = c.beta;
    gemm_host(params);

    // The reference op: linear_forward computes op(A) op(B) as input [m, k] x weight [n, k]^T.
    std::vector<double> input(static_cast<std::size_t>(c.m * c.k));   // [m, k]
    std::vector<double> weight(static_cast<std::size_t>(c.n * c.k));  // [n, k]
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t l = 0; l < c.k; ++l) input[static_cast<std::size_t>(i * c.k + l)] = a_at(i, l);
    for (std::int64_t j = 0; j < c.n; ++j)
      for (std::int64_t l = 0; l < c.k; ++l) weight[static_cast<std::size_t>(j * c.k + l)] = b_at(l, j);
    std::vector<double> want(static_cast<std::size_t>(c.m * c.n));
    reference::linear_forward(input.data(), weight.data(), static_cast<const double*>(nullptr), c.m, c.k, c.n,
                              want.data());
    std::vector<double> bound(want.size());
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.n; ++j) {
        const auto e = static_cast<std::size_t>(i * c.n + j);
        double terms = 0;  // sum_l |a_il b_lj|
        for (std::int64_t l = 0; l < c.k; ++l) terms += std::abs(a_at(i, l) * b_at(l, j));
        want[e] += static_cast<double>(c.beta) * initial[e];
        // k products and k-1 sums in fp32: gamma_k sum|terms|; + beta*C: one more rounding
        // of everything (u (sum|terms| + |C|)); 1.01 covers gamma's denominator.
        bound[e] = 1.01 * kUnitRoundoff *
                   ((c.k + 1) * terms + (c.beta != 0 ? 2 * std::abs(static_cast<double>(initial[e])) : 0.0));
      }
    }
    expect_within("gemm m" + std::to_string(c.m) + " n" + std::to_string(c.n) + " k" + std::to_string(c.k),
                  out, want, bound);
  }
}

// Exact (bitwise): the blocked kernel the cpu backend ships computes every element with the
// operations, and in the order, gemm_host_ordered states one element at a time (k increasing, no
// fused multiply-add), with the baseline's vectors, AVX2's and AVX-512F's (where the processor has
// them), on ragged shapes around the register tiles (4 x 8, 6 x 16, 8 x 32), zero sizes, every transpose, f32
// and bf16 inputs, f32 and bf16 C, beta 0 and 1, and values of every magnitude.
TEST(ProductionOps, TheBlockedHostGemmGivesTheOrderedOnesBitsOnEveryShape) {
  const std::vector<std::int64_t> sizes = {0, 1, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33};
  std::uint64_t seed = 100;
  int compared = 0;
  for (const std::int64_t m : sizes) {
    for (const std::int64_t n : sizes) {
      for (const std::int64_t k : {0, 1, 2, 7, 16, 31}) {
        const int variant = static_cast<int>(seed % 16);
        ++seed;
        const Transpose a_transpose = variant & 1 ? Transpose::yes : Transpose::no;
        const Transpose b_transpose = variant & 2 ? Transpose::yes : Transpose::no;
        const DType inputs = variant & 4 ? DType::bf16 : DType::f32;
        const DType output = variant & 8 ? DType::bf16 : DType::f32;
        // Magnitudes from 2^-20 to 2^20 so that sums round and cancel.
        std::vector<float> a = random_values(m * k, seed, 1.0);
        std::vector<float> b = random_values(k * n, seed + 1000, 1.0);
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::ldexp(a[i], static_cast<int>(i % 41) - 20);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::ldexp(b[i], static_cast<int>(i % 37) - 18);
        std::vector<Bf16> a16(a.size()), b16(b.size());
        for (std::size_t i = 0; i < a.size(); ++i) a16[i] = bf16_from_f32(a[i]);
        for (std::size_t i = 0; i < b.size(); ++i) b16[i] = bf16_from_f32(b[i]);
        const std::vector<float> initial = random_values(m * n, seed + 2000, 4.0);
        for (const float beta : {0.0f, 1.0f}) {
          std::vector<std::uint8_t> blocked(static_cast<std::size_t>(m * n) * dtype_bytes(output));
          for (std::int64_t e = 0; e < m * n; ++e) store_from_f32(blocked.data(), output, e, initial[static_cast<std::size_t>(e)]);
          std::vector<std::uint8_t> ordered = blocked;
          GemmParams params;
          params.m = m;
          params.n = n;
          params.k = k;
          params.a = GemmOperand{inputs == DType::f32 ? static_cast<const void*>(a.data()) : a16.data(), inputs, a_transpose};
          params.b = GemmOperand{inputs == DType::f32 ? static_cast<const void*>(b.data()) : b16.data(), inputs, b_transpose};
          params.c_dtype = output;
          params.beta = beta;
          const std::vector<std::uint8_t> initial_c = blocked;
          params.c = ordered.data();
          gemm_host_ordered(params);
          for (const HostSimd simd : kHostSimds) {
            if (!host_gemm_has(simd)) continue;  // this processor lacks that path
            blocked = initial_c;
            params.c = blocked.data();
            gemm_host_with(params, simd);
            ASSERT_EQ(blocked, ordered) << "m " << m << " n " << n << " k " << k << " variant " << variant << " beta "
                                        << beta << " " << host_simd_name(simd);
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 16 * 16 * 6 * 2);
}

// Exact (bitwise): split among worker threads (--cpu-threads), each tile whole on one thread, the
// product gives the single thread's bits for every thread count and vector path, on shapes large
// enough that the workers take part (a million multiply-adds and more) and ragged at every edge.
TEST(ProductionOps, TheHostGemmGivesTheSameBitsOnEveryThreadCount) {
  struct Shape {
    std::int64_t m, n, k;
  };
  std::uint64_t seed = 7000;
  for (const Shape shape : {Shape{70, 130, 121}, Shape{257, 65, 64}, Shape{33, 1000, 40}}) {
    for (const int variant : {0, 3, 5, 14}) {
      const Transpose a_transpose = variant & 1 ? Transpose::yes : Transpose::no;
      const Transpose b_transpose = variant & 2 ? Transpose::yes : Transpose::no;
      const DType inputs = variant & 4 ? DType::bf16 : DType::f32;
      const DType output = variant & 8 ? DType::bf16 : DType::f32;
      std::vector<float> a = random_values(shape.m * shape.k, seed++, 1.0);
      std::vector<float> b = random_values(shape.k * shape.n, seed++, 1.0);
      std::vector<Bf16> a16(a.size()), b16(b.size());
      for (std::size_t i = 0; i < a.size(); ++i) a16[i] = bf16_from_f32(a[i]);
      for (std::size_t i = 0; i < b.size(); ++i) b16[i] = bf16_from_f32(b[i]);
      const std::vector<float> initial = random_values(shape.m * shape.n, seed++, 4.0);
      std::vector<std::uint8_t> initial_c(static_cast<std::size_t>(shape.m * shape.n) * dtype_bytes(output));
      for (std::int64_t e = 0; e < shape.m * shape.n; ++e) store_from_f32(initial_c.data(), output, e, initial[static_cast<std::size_t>(e)]);
      GemmParams params;
      params.m = shape.m;
      params.n = shape.n;
      params.k = shape.k;
      params.a = GemmOperand{inputs == DType::f32 ? static_cast<const void*>(a.data()) : a16.data(), inputs, a_transpose};
      params.b = GemmOperand{inputs == DType::f32 ? static_cast<const void*>(b.data()) : b16.data(), inputs, b_transpose};
      params.c_dtype = output;
      params.alpha = 0.75f;
      params.beta = variant == 3 ? 1.0f : 0.0f;
      std::vector<std::uint8_t> ordered = initial_c;
      params.c = ordered.data();
      gemm_host_ordered(params);
      for (const HostSimd simd : kHostSimds) {
        if (!host_gemm_has(simd)) continue;
        for (const int threads : {1, 2, 3, 8}) {
          HostWorkers workers(threads);
          std::vector<std::uint8_t> split = initial_c;
          params.c = split.data();
          gemm_host_with(params, simd, &workers);
          ASSERT_EQ(split, ordered) << "m " << shape.m << " n " << shape.n << " k " << shape.k << " variant " << variant
                                    << " " << host_simd_name(simd) << " on " << threads << " threads";
        }
      }
    }
  }
}

TEST(ProductionOps, GemmOnBf16InputsAccumulatesInFp32) {
  // bf16 inputs are exact dyadic values; with small integers every product and partial sum is
  // exactly representable in fp32, so the result is exact: the accumulation is fp32, not bf16
  // (a bf16 accumulator would round 257 to 256).
  const std::int64_t k = 257;
  std::vector<Bf16> a(static_cast<std::size_t>(k), bf16_from_f32(1.0f));  // [1, k]
  std::vector<Bf16> b(static_cast<std::size_t>(k), bf16_from_f32(1.0f));  // [k, 1]
  float out = 0;
  GemmParams params;
  params.m = 1;
  params.n = 1;
  params.k = k;
  params.a = GemmOperand{a.data(), DType::bf16, Transpose::no};
  params.b = GemmOperand{b.data(), DType::bf16, Transpose::no};
  params.c = &out;
  gemm_host(params);
  EXPECT_EQ(out, 257.0f);  // 257 ones
  Bf16 rounded{};
  params.c = &rounded;
  params.c_dtype = DType::bf16;
  gemm_host(params);
  EXPECT_EQ(f32_from_bf16(rounded), 256.0f);  // 257 stored in bf16: 8 significant bits, ties to even
}

// The weight gradient's accumulating GEMM (dY^T X, beta = 1 into the fp32 main gradient) on bf16
// operands, called once per microbatch. Inputs are dyadic so that every product and partial sum is
// exact in fp32 in any order: the result is knowable exactly, and each value the fp32 main
// gradient holds needs more than bf16's 8 significant bits. Comparison: exact. A GEMM that rounds
// its fp32 result (or reads C) to bf16, or a main gradient kept in bf16 between microbatches,
// changes every element.
TEST(ProductionOps, AccumulatingGemmOnBf16InputsKeepsTheFp32MainGradientExactly) {
  const std::int64_t out = 12, in = 20, rows = 16;  // dW [out, in] += dY^T [out, rows] X [rows, in]
  const int microbatches = 2;
  // Small integers over 16 (|k| <= 8: exact in bf16); a product is a multiple of 2^-8 of at most
  // 1/4, so a microbatch's sum is at most rows / 4 = 4 in magnitude.
  const auto small_dyadic = [](std::int64_t count, std::uint64_t seed) {
    std::vector<float> values = random_values(count, seed, 8.5);
    for (float& value : values) value = std::trunc(value) / 16.0f;
    return values;
  };
  // The main gradient before the first microbatch: +-(20 to 30) plus an odd multiple of 2^-16 (21
  // significant bits, exact in fp32). With the sums above every later value keeps a magnitude of
  // at least 20 - 2 x 4 = 12 and an odd multiple of 2^-16 below 64: between 19 and 22 bits.
  std::vector<float> initial = random_values(out * in, 31, 5.0);  // [out, in]
  for (std::size_t e = 0; e < initial.size(); ++e) {
    const float magnitude = 25.0f + std::trunc(initial[e]) + static_cast<float>(2 * (e % 97) + 1) / 65536.0f;
    initial[e] = e % 2 == 0 ? magnitude : -magnitude;
  }
  std::vector<std::vector<Bf16>> output_grads, inputs;  // per microbatch: [rows, out], [rows, in]
  std::vector<double> want(initial.begin(), initial.end());  // [out, in], exact
  for (int mb = 0; mb < microbatches; ++mb) {
    const std::vector<float> dy = small_dyadic(rows * out, 40 + 2 * static_cast<std::uint64_t>(mb));
    const std::vector<float> x = small_dyadic(rows * in, 41 + 2 * static_cast<std::uint64_t>(mb));
    std::vector<Bf16> dy16(dy.size()), x16(x.size());
    for (std::size_t i = 0; i < dy.size(); ++i) dy16[i] = bf16_from_f32(dy[i]);
    for (std::size_t i = 0; i < x.size(); ++i) x16[i] = bf16_from_f32(x[i]);
    output_grads.push_back(std::move(dy16));
    inputs.push_back(std::move(x16));
    for (std::int64_t i = 0; i < out; ++i) {
      for (std::int64_t j = 0; j < in; ++j) {
        double sum = 0;  // exact: multiples of 2^-8 below 2^6
        for (std::int64_t r = 0; r < rows; ++r) {
          sum += static_cast<double>(dy[static_cast<std::size_t>(r * out + i)]) * x[static_cast<std::size_t>(r * in + j)];
        }
        want[static_cast<std::size_t>(i * in + j)] += sum;
      }
    }
  }
  // The inputs are what the comment says: every expected value is an fp32 value bf16 cannot hold.
  for (const double value : want) {
    ASSERT_EQ(static_cast<double>(static_cast<float>(value)), value);
    ASSERT_NE(static_cast<double>(f32_from_bf16(bf16_from_f32(static_cast<float>(value)))), value);
  }
  // Microbatch mb's weight-gradient GEMM, accumulated (beta = 1) into the fp32 `main_grad`.
  const auto accumulating_gemm = [&](int mb, float* main_grad) {
    GemmParams params;
    params.m = out;
    params.n = in;
    params.k = rows;
    params.a = GemmOperand{output_grads[static_cast<std::size_t>(mb)].data(), DType::bf16, Transpose::yes};
    params.b = GemmOperand{inputs[static_cast<std::size_t>(mb)].data(), DType::bf16, Transpose::no};
    params.c = main_grad;
    params.c_dtype = DType::f32;
    params.beta = 1.0f;
    return params;
  };
  const auto run = [&](const std::function<void(const GemmParams&)>& gemm, const std::string& name) {
    std::vector<float> main_grad = initial;  // [out, in] fp32
    for (int mb = 0; mb < microbatches; ++mb) gemm(accumulating_gemm(mb, main_grad.data()));
    for (std::size_t e = 0; e < want.size(); ++e) {
      ASSERT_EQ(static_cast<double>(main_grad[e]), want[e])
          << name << ": element " << e << " of the main gradient after " << microbatches << " microbatches";
    }
  };
  run([](const GemmParams& params) { gemm_host(params); }, "gemm_host");
  run(gemm_host_ordered, "gemm_host_ordered");
  for (const HostSimd simd : kHostSimds) {
    if (!host_gemm_has(simd)) continue;  // this processor lacks that path
    run([simd](const GemmParams& params) { gemm_host_with(params, simd); }, host_simd_name(simd));
  }
  // Negative control: the same calls with the fp32 result rounded to bf16 after each microbatch
  // (a bf16 accumulator) are rejected at every element.
  std::vector<float> rounded = initial;
  for (int mb = 0; mb < microbatches; ++mb) {
    gemm_host(accumulating_gemm(mb, rounded.data()));
    for (float& value : rounded) value = f32_from_bf16(bf16_from_f32(value));
  }
  for (std::size_t e = 0; e < want.size(); ++e) EXPECT_NE(static_cast<double>(rounded[e]), want[e]) << e;
}

// ------------------------------------------------------------------------------------- RMSNorm

TEST(ProductionOps, RmsnormForwardAndBackwardMatchReference) {
  const std::int64_t rows = 6, width = 48;
  const float epsilon = 1e-5f;
  const std::vector<float> x = random_values(rows * width, 21, 2.0);       // [rows, width]
  const std::vector<float> w = random_values(width, 22, 1.5);              // [width]
  const std::vector<float> dy = random_values(rows * width, 23, 1.0);      // [rows, width]
  std::vector<float> y(x.size()), inverse_rms(static_cast<std::size_t>(rows));
  rmsnorm_forward_host(RmsnormForwardParams{x.data(), w.data(), y.data(), inverse_rms.data(), rows, width,
                                            epsilon, DType::f32});
  std::vector<double> want_y(x.size()), want_r(static_cast<std::size_t>(rows));
  const auto xd = widen(x), wd = widen(w), dyd = widen(dy);
  reference::rmsnorm_forward(xd.data(), wd.data(), rows, width, static_cast<double>(epsilon), want_y.data(),
                             want_r.data());
  // r = 1/sqrt(sum x^2 / width + eps): the sum of width positive squares errs by gamma_(width+1)
  // relative; /width, +eps, sqrt, 1/ add 4 roundings; sqrt halves the sum's error, so r is within
  // (width/2 + 5) u relative; y = x r w adds 2 roundings.
  std::vector<double> bound_r(want_r.size()), bound_y(want_y.size());
  for (std::int64_t row = 0; row < rows; ++row) {
    bound_r[static_cast<std::size_t>(row)] = 1.01 * kUnitRoundoff * (width / 2.0 + 5) * want_r[static_cast<std::size_t>(row)];
    for (std::int64_t j = 0; j < width; ++j) {
      const auto e = static_cast<std::size_t>(row * width + j);
      bound_y[e] = 1.01 * kUnitRoundoff * (width / 2.0 + 7) * std::abs(want_y[e]);
    }
  }
  expect_within("rmsnorm inverse_rms", inverse_rms, want_r, bound_r);
  expect_within("rmsnorm output", y, want_y, bound_y);

  // Backward on the same fp32 r (both twins read the saved statistic), accumulating into dx.
  const std::vector<float> dx_initial = random_values(rows * width, 24, 1.0);
  std::vector<float> dx = dx_initial, dw(static_cast<std::size_t>(width), 0.0f);
  RmsnormBackwardParams backward{x.data(), w.data(), inverse_rms.data(), dy.data(), dx.data(), dw.data(),
                                 rows, width, true, DType::f32};
  rmsnorm_backward_host(backward);
  std::vector<double> want_dx = widen(dx_initial), want_dw(static_cast<std::size_t>(width), 0.0);
  const auto rd = widen(inverse_rms);
  reference::rmsnorm_backward(xd.data(), wd.data(), rd.data(), dyd.data(), rows, width, want_dx.data(),
                              want_dw.data());
  // dx_k = r w_k dy_k - (r^3/width) x_k sum_j dy_j w_j x_j + dx_old: the dot has width terms of
  // 3 factors (gamma_(width+2) of sum|dy w x|), then r^3/width (4 roundings), times x_k, the
  // subtraction and the accumulation: (width + 10) u over the |terms|.
  // dw_j = sum over rows of dy x r: rows terms of 3 factors: (rows + 2) u sum|dy x r|.
  std::vector<double> bound_dx(want_dx.size()), bound_dw(want_dw.size(), 0.0);
  for (std::int64_t row = 0; row < rows; ++row) {
    const double r = rd[static_cast<std::size_t>(row)];
    double dot_terms = 0;
    for (std::int64_t j = 0; j < width; ++j) {
      const auto e = static_cast<std::size_t>(row * width + j);
      dot_terms += std::abs(dyd[e] * wd[static_cast<std::size_t>(j)] * xd[e]);
      bound_dw[static_cast<std::size_t>(j)] += 1.01 * kUnitRoundoff * (rows + 2) * std::abs(dyd[e] * xd[e] * r);
    }
    for (std::int64_t k = 0; k < width; ++k) {
      const auto e = static_cast<std::size_t>(row * width + k);
      const double terms = std::abs(r * wd[static_cast<std::size_t>(k)] * dyd[e]) +
                           r * r * r / static_cast<double>(width) * std::abs(xd[e]) * dot_terms +
                           std::abs(static_cast<double>(dx_initial[e]));
      bound_dx[e] = 1.01 * kUnitRoundoff * (width + 10) * terms;
    }
  }
  expect_within("rmsnorm input grad", dx, want_dx, bound_dx);
  expect_within("rmsnorm weight grad", dw, want_dw, bound_dw);
}

// ---------------------------------------------------------------------------------------- RoPE

TEST(ProductionOps, RopeTablesAndRotationsMatchReference) {
  const std::int64_t rows = 9, heads = 3, head_dim = 8, half = head_dim / 2;
  const std::vector<std::int32_t> positions = {0, 1, 2, 0, 1, 5000, 8191, 3, 65535};  // [rows]
  const double base = 10000.0;
  std::vector<float> cosines(static_cast<std::size_t>(rows * half)), sines(cosines.size());
  rope_table_host(RopeTableParams{positions.data(), cosines.data(), sines.data(), rows, head_dim, base});
  std::vector<double> want_cos(cosines.size()), want_sin(sines.size());
  reference::rope_tables(positions.data(), rows, head_dim, base, want_cos.data(), want_sin.data());
  // The host computes the angle and its cosine in double and rounds once: u relative, plus
  // double's own error on an angle up to 65535 rad (~2^-53 x 65535, absolute) - far below u.
  std::vector<double> bound_cos(want_cos.size()), bound_sin(want_sin.size());
  for (std::size_t i = 0; i < want_cos.size(); ++i) {
    bound_cos[i] = kUnitRoundoff * std::abs(want_cos[i]) + 1e-11;
    bound_sin[i] = kUnitRoundoff * std::abs(want_sin[i]) + 1e-11;
  }
  expect_within("rope cosines", cosines, want_cos, bound_cos);
  expect_within("rope sines", sines, want_sin, bound_sin);

  const std::vector<float> x = random_values(rows * heads * head_dim, 31, 1.0);  // [rows, heads*hd]
  const auto cd = widen(cosines), sd = widen(sines);
  for (const bool backward : {false, true}) {
    std::vector<float> got = x;
    RopeParams params{got.data(), cosines.data(), sines.data(), rows, heads, head_dim, DType::f32};
    backward ? rope_backward_host(params) : rope_forward_host(params);
    std::vector<double> want = widen(x);
    backward ? reference::rope_backward(want.data(), cd.data(), sd.data(), rows, heads, head_dim)
             : reference::rope_forward(want.data(), cd.data(), sd.data(), rows, heads, head_dim);
    // Each output is a c +- b s: two products and one sum, 2u (|a c| + |b s|) (+1 for the sign
    // multiplication, exact).
    std::vector<double> bound(want.size());
    for (std::int64_t row = 0; row < rows; ++row) {
      for (std::int64_t head = 0; head < heads; ++head) {
        for (std::int64_t i = 0; i < half; ++i) {
          const auto first = static_cast<std::size_t>((row * heads + head) * head_dim + i);
          const auto second = first + static_cast<std::size_t>(half);
          const auto table = static_cast<std::size_t>(row * half + i);
          const double terms = std::abs(static_cast<double>(x[first]) * cd[table]) +
                               std::abs(static_cast<double>(x[second]) * sd[table]) +
                               std::abs(static_cast<double>(x[second]) * cd[table]) +
                               std::abs(static_cast<double>(x[first]) * sd[table]);
          bound[first] = bound[second] = 2.02 * kUnitRoundoff * terms;
        }
      }
    }
    expect_within(backward ? "rope backward" : "rope forward", got, want, bound);
  }
}

// -------------------------------------------------------------------------------------- SwiGLU

TEST(ProductionOps, SwigluForwardAndBackwardMatchReference) {
  const std::int64_t count = 257;
  const std::vector<float> gate = random_values(count, 41, 8.0), up = random_values(count, 42, 2.0);
  const std::vector<float> dh = random_values(count, 43, 1.0);
  std::vector<float> hidden(static_cast<std::size_t>(count)), dgate(hidden.size()), dup(hidden.size());
  swiglu_forward_host(SwigluForwardParams{gate.data(), up.data(), hidden.data(), count, DType::f32});
  swiglu_backward_host(SwigluBackwardParams{gate.data(), up.data(), dh.data(), dgate.data(), dup.data(), count,
                                            DType::f32});
  const auto gd = widen(gate), ud = widen(up), dhd = widen(dh);
  std::vector<double> want_h(hidden.size()), want_dg(hidden.size(), 0.0), want_du(hidden.size(), 0.0);
  reference::swiglu_forward(gd.data(), ud.data(), count, want_h.data());
  reference::swiglu_backward(gd.data(), ud.data(), dhd.data(), count, want_dg.data(), want_du.data());
  std::vector<double> bound_h(want_h.size()), bound_dg(want_h.size()), bound_du(want_h.size());
  for (std::size_t i = 0; i < want_h.size(); ++i) {
    const double sigma = 1.0 / (1.0 + std::exp(-gd[i]));
    // sigma = 1/(1 + exp(-g)): exp within 2u (libm), +1 and / add 2: 4u relative; h = g sigma up
    // two more products: 6u; silu likewise 5u.
    bound_h[i] = 6.06 * kUnitRoundoff * std::abs(want_h[i]);
    bound_du[i] = 6.06 * kUnitRoundoff * std::abs(want_du[i]);
    // dg = dh up sigma (1 + g (1 - sigma)): 1 - sigma cancels, so its error is absolute, 5u sigma;
    // with the products and sums the whole is within 12u of |dh up| sigma (1 + 2|g|).
    bound_dg[i] = 12.12 * kUnitRoundoff * std::abs(dhd[i] * ud[i]) * sigma * (1 + 2 * std::abs(gd[i]));
  }
  expect_within("swiglu hidden", hidden, want_h, bound_h);
  expect_within("swiglu gate grad", dgate, want_dg, bound_dg);
  expect_within("swiglu up grad", dup, want_du, bound_du);
}

// ----------------------------------------------------------------------------------- Attention

// Exact (bitwise): the shipped host attention (operands widened once, 8 scores a block in vector
// lanes) equals the ordered statement of its arithmetic, forward and backward, f32 and bf16, on
// spans that start anywhere (documents), GQA and multi-head, sequences around the score block and
// the bf16 key tile, head dims that are and are not multiples of the lanes.
TEST(ProductionOps, TheFastHostAttentionGivesTheOrderedOnesBits) {
  struct Case {
    std::int64_t samples, seq, heads, groups, head_dim;
  };
  std::uint64_t seed = 300;
  for (const Case& c : {Case{1, 1, 1, 1, 2}, Case{2, 7, 2, 1, 4}, Case{1, 9, 4, 2, 6}, Case{2, 16, 4, 4, 8},
                        Case{1, 70, 4, 2, 16}, Case{3, 33, 6, 3, 10}, Case{1, 130, 2, 1, 8}, Case{3, 100, 4, 2, 16}}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      ++seed;
      const std::int64_t rows = c.samples * c.seq, qw = c.heads * c.head_dim, kvw = c.groups * c.head_dim;
      // Documents of random lengths (SPEC 3: attention_start is the start of t's document).
      std::vector<std::int32_t> starts(static_cast<std::size_t>(rows));
      const std::vector<float> cuts = random_values(rows, seed, 1.0);
      for (std::int64_t sample = 0; sample < c.samples; ++sample) {
        std::int32_t start = 0;
        for (std::int64_t t = 0; t < c.seq; ++t) {
          if (t > 0 && cuts[static_cast<std::size_t>(sample * c.seq + t)] > 0.7f) start = static_cast<std::int32_t>(t);
          starts[static_cast<std::size_t>(sample * c.seq + t)] = start;
        }
      }
      const auto operand = [&](std::int64_t count, std::uint64_t offset) {
        std::vector<float> values = random_values(count, seed * 10 + offset, 2.0);
        std::vector<std::uint8_t> stored(static_cast<std::size_t>(count) * dtype_bytes(dtype));
        for (std::int64_t i = 0; i < count; ++i) store_from_f32(stored.data(), dtype, i, values[static_cast<std::size_t>(i)]);
        return stored;
      };
      const auto q = operand(rows * qw, 1), k = operand(rows * kvw, 2), v = operand(rows * kvw, 3), dctx = operand(rows * qw, 4);
      const AttentionShape shape{c.samples, c.seq, c.heads, c.groups, c.head_dim};
      const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
      const auto bytes = [&](std::int64_t count) { return std::vector<std::uint8_t>(static_cast<std::size_t>(count) * dtype_bytes(dtype)); };
      // 0: the ordered kernels; 1: the fast ones on the calling thread; 2: the fast ones with the
      // (sample, group) pairs split among 3 threads (the last case is large enough to split).
      std::vector<std::vector<std::uint8_t>> contexts(3, bytes(rows * qw));
      std::vector<std::vector<float>> sums(3, std::vector<float>(static_cast<std::size_t>(rows * c.heads)));
      std::vector<std::vector<std::uint8_t>> dq(3, bytes(rows * qw)), dk(3, bytes(rows * kvw)), dv(3, bytes(rows * kvw));
      HostWorkers three(3);
      for (int variant = 0; variant < 3; ++variant) {
        const AttentionForwardParams forward{q.data(), k.data(), v.data(), starts.data(), contexts[variant].data(),
                                             sums[variant].data(), shape, scale, dtype};
        // Every backward reads the ordered forward's outputs.
        const AttentionBackwardParams backward{q.data(), k.data(), v.data(), contexts[0].data(), sums[0].data(),
                                               dctx.data(), starts.data(), dq[variant].data(), dk[variant].data(),
                                               dv[variant].data(), shape, scale, dtype};
        if (variant == 0) {
          attention_forward_host_ordered(forward);
          attention_backward_host_ordered(backward);
        } else {
          attention_forward_host(forward, variant == 2 ? &three : nullptr);
          attention_backward_host(backward, variant == 2 ? &three : nullptr);
        }
      }
      for (int variant = 1; variant < 3; ++variant) {
        const std::string name = "seq " + std::to_string(c.seq) + " H " + std::to_string(c.heads) + " G " +
                                 std::to_string(c.groups) + " hd " + std::to_string(c.head_dim) +
                                 (dtype == DType::bf16 ? " bf16" : " f32") + (variant == 2 ? " on 3 threads" : "");
        EXPECT_EQ(contexts[0], contexts[variant]) << name;
        EXPECT_EQ(sums[0], sums[variant]) << name;
        EXPECT_EQ(dq[0], dq[variant]) << name;
        EXPECT_EQ(dk[0], dk[variant]) << name;
        EXPECT_EQ(dv[0], dv[variant]) << name;
      }
    }
  }
}

TEST(ProductionOps, DocumentMaskedGqaAttentionMatchesReference) {
  const std::int64_t samples = 2, seq = 12, heads = 4, groups = 2, head_dim = 8;
  const std::int64_t rows = samples * seq, qw = heads * head_dim, kvw = groups * head_dim;
  // Two documents per sample at different places (SPEC 3: attention_start is the document start).
  const std::vector<std::int32_t> starts = {0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5, 11,
                                            0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};  // [rows]
  const std::vector<float> q = random_values(rows * qw, 51, 1.0), k = random_values(rows * kvw, 52, 1.0);
  const std::vector<float> v = random_values(rows * kvw, 53, 1.0), dctx = random_values(rows * qw, 54, 1.0);
  const double scale_d = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const AttentionShape shape{samples, seq, heads, groups, head_dim};
  std::vector<float> context(static_cast<std::size_t>(rows * qw)), lse(static_cast<std::size_t>(rows * heads));
  AttentionForwardParams forward{q.data(), k.data(), v.data(), starts.data(), context.data(), lse.data(), shape,
                                 static_cast<float>(scale_d), DType::f32};
  attention_forward_host(forward);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  AttentionBackwardParams backward{q.data(), k.data(), v.data(), context.data(), lse.data(), dctx.data(),
                                   starts.data(), dq.data(), dk.data(), dv.data(), shape,
                                   static_cast<float>(scale_d), DType::f32};
  attention_backward_host(backward);

  // The reference runs one sample at a time: [seq] rows with starts relative to the sample.
  std::vector<double> want_ctx(context.size()), want_dq(q.size(), 0.0), want_dk(k.size(), 0.0),
      want_dv(v.size(), 0.0);
  std::vector<double> bound_ctx(context.size(), 0.0), bound_dq(q.size(), 0.0), bound_dk(k.size(), 0.0),
      bound_dv(v.size(), 0.0);
  const reference::AttentionShape one{seq, heads, groups, head_dim};
  for (std::int64_t s = 0; s < samples; ++s) {
    const auto qd = widen({q.begin() + s * seq * qw, q.begin() + (s + 1) * seq * qw});
    const auto kd = widen({k.begin() + s * seq * kvw, k.begin() + (s + 1) * seq * kvw});
    const auto vd = widen({v.begin() + s * seq * kvw, v.begin() + (s + 1) * seq * kvw});
    const auto dcd = widen({dctx.begin() + s * seq * qw, dctx.begin() + (s + 1) * seq * qw});
    std::vector<double> probabilities(static_cast<std::size_t>(heads * seq * seq), 0.0);
    std::vector<double> ctx(static_cast<std::size_t>(seq * qw)), gq(qd.size(), 0.0), gk(kd.size(), 0.0),
        gv(vd.size(), 0.0);
    const std::int32_t* start = starts.data() + s * seq;
    reference::attention_forward(qd.data(), kd.data(), vd.data(), start, one, probabilities.data(), ctx.data());
    reference::attention_backward(qd.data(), kd.data(), vd.data(), start, one, probabilities.data(), dcd.data(),
                                  gq.data(), gk.data(), gv.data());
    std::copy(ctx.begin(), ctx.end(), want_ctx.begin() + s * seq * qw);
    std::copy(gq.begin(), gq.end(), want_dq.begin() + s * seq * qw);
    std::copy(gk.begin(), gk.end(), want_dk.begin() + s * seq * kvw);
    std::copy(gv.begin(), gv.end(), want_dv.begin() + s * seq * kvw);
    // Bounds, per (head, t) with span n = t - start + 1:
    //   a score z = scale q.k errs by (hd + 2) u S_ts absolutely, S_ts = scale sum_i |q_i k_i|;
    //   exp(z - max) / sum turns that into a relative error of p of 2 Z + (n + 4) u with
    //   Z = max_s (hd + 2) u S_ts (the shift and the normalizer carry one score's error each);
    //   context = sum_s p v over n terms: (n + 1) u sum p|v| plus the p error times sum p|v|.
    // The backward recomputes p from the saved lse (one more score error) and its sums are over
    // n (dp, dz, dq), over heads-per-group x n (dk, dv) or hd (D, dp): each output's bound is
    // E x its |terms| with E = 3 Z + (n x heads/groups + 2 hd + 12) u (D_t = dctx . ctx reads the
    // fp32 context, whose relative error 2 Z + (2n + 5) u is inside E), the terms of dq_t being
    // scale sum_s p (|dp| + |D|) |k_s|, of dk_s the same with |q_t|, of dv_s sum_t p |dctx_t|.
    const std::int64_t per_group = heads / groups;
    for (std::int64_t head = 0; head < heads; ++head) {
      const std::int64_t group = head / per_group;
      for (std::int64_t t = 0; t < seq; ++t) {
        const std::int64_t first = start[t];
        const std::int64_t n = t - first + 1;
        double score_error = 0;
        for (std::int64_t j = first; j <= t; ++j) {
          double s_abs = 0;
          for (std::int64_t i = 0; i < head_dim; ++i)
            s_abs += std::abs(qd[static_cast<std::size_t>(t * qw + head * head_dim + i)] *
                              kd[static_cast<std::size_t>(j * kvw + group * head_dim + i)]);
          score_error = std::max(score_error, (head_dim + 2) * kUnitRoundoff * scale_d * s_abs);
        }
        const double forward_relative = 2 * score_error + (n + 4) * kUnitRoundoff;
        const double backward_relative =
            3 * score_error + static_cast<double>(n * per_group + 2 * head_dim + 12) * kUnitRoundoff;
        double expected_grad = 0;  // D_t
        for (std::int64_t i = 0; i < head_dim; ++i)
          expected_grad += std::abs(dcd[static_cast<std::size_t>(t * qw + head * head_dim + i)] *
                                    ctx[static_cast<std::size_t>(t * qw + head * head_dim + i)]);
        for (std::int64_t j = first; j <= t; ++j) {
          const double p = probabilities[static_cast<std::size_t>((head * seq + t) * seq + j)];
          double dp = 0;
          for (std::int64_t i = 0; i < head_dim; ++i)
            dp += std::abs(dcd[static_cast<std::size_t>(t * qw + head * head_dim + i)] *
                           vd[static_cast<std::size_t>(j * kvw + group * head_dim + i)]);
          for (std::int64_t i = 0; i < head_dim; ++i) {
            const auto qi = static_cast<std::size_t>((s * seq + t) * qw + head * head_dim + i);
            const auto ki = static_cast<std::size_t>((s * seq + j) * kvw + group * head_dim + i);
            const double v_abs = std::abs(vd[static_cast<std::size_t>(j * kvw + group * head_dim + i)]);
            const double k_abs = std::abs(kd[static_cast<std::size_t>(j * kvw + group * head_dim + i)]);
            const double q_abs = std::abs(qd[static_cast<std::size_t>(t * qw + head * head_dim + i)]);
            const double dctx_abs = std::abs(dcd[static_cast<std::size_t>(t * qw + head * head_dim + i)]);
            bound_ctx[qi] += 1.01 * (forward_relative + (n + 1) * kUnitRoundoff) * p * v_abs;
            bound_dq[qi] += 1.01 * backward_relative * scale_d * p * (dp + expected_grad) * k_abs;
            bound_dk[ki] += 1.01 * backward_relative * scale_d * p * (dp + expected_grad) * q_abs;
            bound_dv[ki] += 1.01 * backward_relative * p * dctx_abs;
          }
        }
      }
    }
  }
  expect_within("attention context", context, want_ctx, bound_ctx);
  expect_within("attention query grad", dq, want_dq, bound_dq);
  expect_within("attention key grad", dk, want_dk, bound_dk);
  expect_within("attention value grad", dv, want_dv, bound_dv);
}

// bf16 attention rounds p~ = exp(z - m) to bf16 before context += p~ v, m the running max over the
// 64-key tiles so far (attention.hpp), as the tensor-core twin does. Engineered scores: q = (1, 0),
// k_s = (z_s, 0), scale 1, so z_s is exact; one value row is (1, 0) and the others zero, so the
// context element is bf16(bf16(exp(z_s - m_tile)) exp(m_tile - max) / sum_r exp(z_r - max)),
// computed here in double. d is chosen so that this differs, after the store, from the other
// candidate semantics (no rounding; rounding relative to the final max) and so that each rounded
// value lies at least 5% of a bf16 ulp from a tie: the twin's fp32 (a few 2^-24 relative) cannot
// move it, and the comparison is exact.
TEST(ProductionOps, Bf16AttentionRoundsProbabilitiesRelativeToTheRunningTileMax) {
  const auto rounded = [](double x) { return static_cast<double>(round_to(DType::bf16, static_cast<float>(x))); };
  const auto far_from_tie = [](double x) {
    const double ulp = std::ldexp(1.0, std::ilogb(x) - 7);  // bf16 spacing at x > 0
    const double fraction = x / ulp - std::floor(x / ulp);
    return std::abs(fraction - 0.5) > 0.05;
  };
  struct Case {
    std::string name;
    std::int64_t seq;
    std::int64_t key;                 // the key whose value row is (1, 0)
    std::vector<double> other_scores; // z of every other key of the last row's span, in order
    double tile_max;                  // the running max when `key` is rounded, given z_key = -d
    double final_max;
  };
  // One tile: z = (0, -d), the last row's own key picked out.
  // Two tiles: z_0 = -d, z_1 = 0 (tile 0's max), z_2..63 = -64, z_64 = 2 (the final max), z_65 = -64.
  std::vector<double> two_tile_others = {0.0};
  for (int s = 2; s < 64; ++s) two_tile_others.push_back(-64.0);
  two_tile_others.push_back(2.0);
  two_tile_others.push_back(-64.0);
  const std::vector<Case> cases = {{"one tile", 2, 1, {0.0}, 0.0, 0.0}, {"two tiles", 66, 0, two_tile_others, 0.0, 2.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    double d = 0, expected = 0;
    for (int eighths = 1; eighths <= 120 && d == 0; ++eighths) {
      const double candidate = eighths / 8.0;
      double normalizer = std::exp(-candidate - c.final_max);
      for (const double z : c.other_scores) normalizer += std::exp(z - c.final_max);
      const double tile_probability = std::exp(-candidate - c.tile_max);
      const double value = rounded(tile_probability) * std::exp(c.tile_max - c.final_max) / normalizer;
      const double unrounded = std::exp(-candidate - c.final_max) / normalizer;
      const double final_relative = rounded(std::exp(-candidate - c.final_max)) / normalizer;
      if (far_from_tie(tile_probability) && far_from_tie(value) && far_from_tie(unrounded) &&
          far_from_tie(final_relative) && rounded(value) != rounded(unrounded) &&
          (c.tile_max == c.final_max || rounded(value) != rounded(final_relative))) {
        d = candidate;
        expected = rounded(value);
      }
    }
    ASSERT_GT(d, 0.0) << "no score gap in (0, 15] separates the semantics";
    const AttentionShape shape{1, c.seq, 1, 1, 2};
    std::vector<double> scores;  // z_s of the last row's span, s = 0 .. seq-1
    for (std::int64_t s = 0, other = 0; s < c.seq; ++s) {
      scores.push_back(s == c.key ? -d : c.other_scores[static_cast<std::size_t>(other++)]);
    }
    std::vector<Bf16> query(static_cast<std::size_t>(c.seq * 2)), key(query.size()), value(query.size());
    for (std::int64_t s = 0; s < c.seq; ++s) {
      query[static_cast<std::size_t>(2 * s)] = bf16_from_f32(1.0f);
      key[static_cast<std::size_t>(2 * s)] = bf16_from_f32(static_cast<float>(scores[static_cast<std::size_t>(s)]));
      value[static_cast<std::size_t>(2 * s)] = bf16_from_f32(s == c.key ? 1.0f : 0.0f);
    }
    const std::vector<std::int32_t> starts(static_cast<std::size_t>(c.seq), 0);
    std::vector<Bf16> context(query.size());
    std::vector<float> lse(static_cast<std::size_t>(c.seq));
    attention_forward_host({query.data(), key.data(), value.data(), starts.data(), context.data(), lse.data(), shape,
                            1.0f, DType::bf16});
    const double got = f32_from_bf16(context[static_cast<std::size_t>(2 * (c.seq - 1))]);
    EXPECT_EQ(got, expected) << "d = " << d << " (exact: the rounding points of attention.hpp)";
  }
}

// ------------------------------------------------------------------------------- Cross-entropy

TEST(ProductionOps, MaskedCrossEntropyMatchesReferenceInChunks) {
  const std::int64_t rows = 7, vocab = 384;
  const std::vector<float> logits = random_values(rows * vocab, 61, 6.0);  // [rows, V]
  const std::vector<std::int32_t> labels = {3, 0, 383, 256, 17, 100, 200};
  const std::vector<std::uint8_t> mask = {1, 0, 1, 1, 0, 1, 1};
  const float loss_scale = 1.0f / 5.0f;
  std::vector<float> row_losses(static_cast<std::size_t>(rows)), grad(logits.size());
  // Two chunks of rows, as the trainer calls it.
  const std::int64_t split = 3;
  for (const auto& [first, count] : {std::pair<std::int64_t, std::int64_t>{0, split}, {split, rows - split}}) {
    cross_entropy_host(CrossEntropyParams{logits.data() + first * vocab, labels.data() + first, mask.data() + first,
                                          row_losses.data() + first, grad.data() + first * vocab, count, vocab,
                                          loss_scale, DType::f32});
  }
  const auto zd = widen(logits);
  std::vector<double> want_grad(logits.size(), 0.0), want_losses(static_cast<std::size_t>(rows));
  std::vector<double> bound_losses(want_losses.size()), bound_grad(want_grad.size());
  for (std::int64_t row = 0; row < rows; ++row) {
    want_losses[static_cast<std::size_t>(row)] = reference::cross_entropy_forward_backward(
        zd.data() + row * vocab, labels.data() + row, mask.data() + row, 1, vocab,
        static_cast<double>(loss_scale), want_grad.data() + row * vocab);
    double max_logit = zd[static_cast<std::size_t>(row * vocab)];
    for (std::int64_t c = 0; c < vocab; ++c) max_logit = std::max(max_logit, zd[static_cast<std::size_t>(row * vocab + c)]);
    // lse = max + log(sum exp(z - max)): the V positive terms sum within gamma_V relative, exp
    // adds 2u each, log turns a relative error into an absolute one (<= (V + 3) u), then + max and
    // - z_label round relative to |max| + |z_label|: absolute (V + 3) u + 2u (|max| + |z_label|).
    const double lse_error = 1.01 * kUnitRoundoff * ((vocab + 3) + 2 * (std::abs(max_logit) +
                             std::abs(zd[static_cast<std::size_t>(row * vocab + labels[static_cast<std::size_t>(row)])])));
    bound_losses[static_cast<std::size_t>(row)] = mask[static_cast<std::size_t>(row)] ? lse_error : 0.0;
    for (std::int64_t c = 0; c < vocab; ++c) {
      const auto e = static_cast<std::size_t>(row * vocab + c);
      // dz = scale (exp(z - lse) - onehot): p's relative error is |lse error| + 4u (subtract, exp),
      // then minus 1 and times scale: 2u of |scale| (p + 1); scale itself is fp32 (u relative).
      const double p = mask[static_cast<std::size_t>(row)] ? std::abs(want_grad[e] / static_cast<double>(loss_scale) +
                                                                       (c == labels[static_cast<std::size_t>(row)] ? 1.0 : 0.0))
                                                           : 0.0;
      bound_grad[e] = mask[static_cast<std::size_t>(row)]
                          ? std::abs(static_cast<double>(loss_scale)) *
                                ((lse_error + 1.01 * 4 * kUnitRoundoff) * p + 3.03 * kUnitRoundoff * (p + 1))
                          : 0.0;
    }
  }
  expect_within("cross-entropy row losses", row_losses, want_losses, bound_losses);
  expect_within("cross-entropy logits grad", grad, want_grad, bound_grad);
  for (std::int64_t c = 0; c < vocab; ++c) EXPECT_EQ(grad[static_cast<std::size_t>(vocab + c)], 0.0f);  // masked row
}

TEST(ProductionOps, LossOnlyCrossEntropyWritesTheSameRowLossesAndNoGradient) {
  // Evaluation's variant (logits_grad = nullptr): exact, the row losses bit for bit those of the
  // call that also stores the gradient, and the logits untouched (no in-place gradient).
  const std::int64_t rows = 7, vocab = 384;
  const std::vector<float> logits = random_values(rows * vocab, 62, 6.0);  // [rows, V]
  const std::vector<std::int32_t> labels = {3, 0, 383, 256, 17, 100, 200};
  const std::vector<std::uint8_t> mask = {1, 0, 1, 1, 0, 1, 1};
  std::vector<float> with_gradient(static_cast<std::size_t>(rows)), grad(logits.size());
  cross_entropy_host(CrossEntropyParams{logits.data(), labels.data(), mask.data(), with_gradient.data(),
                                        grad.data(), rows, vocab, 0.25f, DType::f32});
  std::vector<float> in_place = logits;
  std::vector<float> loss_only(static_cast<std::size_t>(rows), -1.0f);
  cross_entropy_host(CrossEntropyParams{in_place.data(), labels.data(), mask.data(), loss_only.data(),
                                        nullptr, rows, vocab, 0.25f, DType::f32});
  for (std::int64_t row = 0; row < rows; ++row) {
    const auto r = static_cast<std::size_t>(row);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(loss_only[r]), std::bit_cast<std::uint32_t>(with_gradient[r])) << "row " << row;
    if (mask[r] == 0) {
      EXPECT_EQ(loss_only[r], 0.0f) << "row " << row;
    }
  }
  EXPECT_EQ(in_place, logits);
  // Negative control: the unmasked rows carry a loss, so a variant that wrote 0 would be caught.
  EXPECT_GT(loss_only[0], 0.0f);
}

// ---------------------------------------------------------------------------------- Embedding

TEST(ProductionOps, EmbeddingGatherIsExactAndScatterMatchesReferenceOrder) {
  const std::int64_t vocab = 10, width = 6;
  const std::vector<std::int32_t> tokens = {3, 3, 9, 0, 3, 9};  // [rows], repeats accumulate
  const std::int64_t rows = static_cast<std::int64_t>(tokens.size());
  const std::vector<float> table = random_values(vocab * width, 71, 1.0);
  std::vector<float> out(static_cast<std::size_t>(rows * width));
  embedding_forward_host(EmbeddingForwardParams{tokens.data(), table.data(), out.data(), rows, width, DType::f32});
  for (std::int64_t t = 0; t < rows; ++t)
    for (std::int64_t j = 0; j < width; ++j)
      EXPECT_EQ(out[static_cast<std::size_t>(t * width + j)], table[static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)] * width + j)]);
  const std::vector<float> dy = random_values(rows * width, 72, 1.0);
  std::vector<float> grad(static_cast<std::size_t>(vocab * width), 0.0f);
  embedding_backward_host(EmbeddingBackwardParams{tokens.data(), dy.data(), grad.data(), rows, width, vocab, DType::f32});
  std::vector<double> want(grad.size(), 0.0), bound(grad.size(), 0.0);
  for (std::int64_t t = 0; t < rows; ++t) {
    for (std::int64_t j = 0; j < width; ++j) {
      const auto e = static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)] * width + j);
      want[e] += dy[static_cast<std::size_t>(t * width + j)];
      // at most `rows` additions per element: gamma_rows sum|dy|.
      bound[e] += 1.01 * kUnitRoundoff * static_cast<double>(rows) * std::abs(static_cast<double>(dy[static_cast<std::size_t>(t * width + j)]));
    }
  }
  expect_within("embedding scatter", grad, want, bound);
}

// ---------------------------------------------------------------------------- Update path ops

TEST(ProductionOps, SquaredNormPartialSumsMatchTheDoubleSum) {
  const std::int64_t count = 1000, block = 64;
  const std::vector<float> g = random_values(count, 81, 1.0);
  std::vector<double> blocks(static_cast<std::size_t>(squared_norm_blocks(count, block)));
  squared_norm_host(SquaredNormParams{g.data(), blocks.data(), count, block});
  double total = 0, want = 0, terms = 0;
  for (const double b : blocks) total += b;
  for (const float x : g) {
    want += static_cast<double>(x) * x;
    terms += static_cast<double>(x) * x;
  }
  // Squares of fp32 values are exact in double; the two orders of count additions differ by at
  // most 2 x count x 2^-53 x sum g^2.
  EXPECT_LE(std::abs(total - want), 2.0 * count * std::ldexp(1.0, -53) * terms);
  EXPECT_EQ(blocks.size(), 16u);  // ceil(1000 / 64)
}

TEST(ProductionOps, AdamwOnDyadicInputsIsExact) {
  // b1 = b2 = 0.5, t = 1: m = g/2, v = g^2/2, bias corrections 1/2: m_hat = g, v_hat = g^2,
  // a = g/(|g| + 0) = sign(g) with eps = 0 (the op is written for any eps); lr = 1/2, wd = 1/2:
  // decay: p - 1/2 (sign(g) + p/2); no decay: p - 1/2 sign(g).
  std::vector<float> params = {4.0f, -2.0f, 8.0f, 1.0f};  // [4]: two decay, two no-decay
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  const std::vector<float> g = {2.0f, -0.5f, 1.0f, -4.0f};
  std::vector<Bf16> copy(4);
  const std::vector<DecaySegment> segments = {{0, 2, true}, {2, 2, false}};
  AdamwParams params_struct;
  params_struct.params = params.data();
  params_struct.exp_avg = m.data();
  params_struct.exp_avg_sq = v.data();
  params_struct.grads = g.data();
  params_struct.compute_weights = copy.data();
  params_struct.compute_dtype = DType::bf16;
  params_struct.count = 4;
  params_struct.segments = segments.data();
  params_struct.segment_count = 2;
  params_struct.hyper = AdamwHyper{0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.0f, 0.5f, 0.5f};
  adamw_host(params_struct);
  EXPECT_EQ(params[0], 4.0f - 0.5f * (1.0f + 2.0f));     // 2.5
  EXPECT_EQ(params[1], -2.0f - 0.5f * (-1.0f - 1.0f));   // -1
  EXPECT_EQ(params[2], 8.0f - 0.5f * 1.0f);              // 7.5: no decay
  EXPECT_EQ(params[3], 1.0f - 0.5f * -1.0f);             // 1.5
  EXPECT_EQ(m[0], 1.0f);   // g/2
  EXPECT_EQ(v[0], 2.0f);   // g^2/2
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(copy[i].bits, bf16_from_f32(params[i]).bits);
}

TEST(ProductionOps, AdamwMatchesReferenceWithinTheAuditBound) {
  const std::int64_t count = 300;
  std::vector<float> p = random_values(count, 91, 1.0), m = random_values(count, 92, 1e-3),
                     v = random_values(count, 93, 1e-6), g = random_values(count, 94, 1e-2);
  for (float& x : v) x = std::abs(x);
  const std::vector<float> p0 = p, m0 = m, v0 = v;
  OptimizerConfig optimizer;  // b1 0.9, b2 0.999, eps 1e-8
  const std::int64_t step = 7;
  const double lr = 3e-3, wd = 0.1;
  const std::vector<DecaySegment> segments = {{0, 100, true}, {100, 50, false}, {150, 150, true}};
  reference::AdamHyper<double> hyper(optimizer, step);
  AdamwParams params;
  params.params = p.data();
  params.exp_avg = m.data();
  params.exp_avg_sq = v.data();
  params.grads = g.data();
  params.count = count;
  params.segments = segments.data();
  params.segment_count = 3;
  params.hyper = AdamwHyper{static_cast<float>(lr), static_cast<float>(wd), static_cast<float>(optimizer.adam_beta1),
                            static_cast<float>(optimizer.adam_beta2), static_cast<float>(1 - optimizer.adam_beta1),
                            static_cast<float>(1 - optimizer.adam_beta2), static_cast<float>(optimizer.adam_eps),
                            static_cast<float>(hyper.bias_correction1), static_cast<float>(hyper.bias_correction2)};
  adamw_host(params);
  std::vector<double> want_p(static_cast<std::size_t>(count)), want_m(want_p.size()), want_v(want_p.size());
  std::vector<double> bound_p(want_p.size()), bound_m(want_p.size()), bound_v(want_p.size());
  const double u = kUnitRoundoff, b1 = optimizer.adam_beta1, b2 = optimizer.adam_beta2;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto e = static_cast<std::size_t>(i);
    const bool decays = i < 100 || i >= 150;
    double param = p0[e], exp_avg = m0[e], exp_avg_sq = v0[e];
    reference::adamw_update(hyper, lr, decays ? wd : 0.0, static_cast<double>(g[e]), param, exp_avg, exp_avg_sq);
    want_p[e] = param;
    want_m[e] = exp_avg;
    want_v[e] = exp_avg_sq;
    // The audit's bounds (reference/audit.cpp) for fp32 arithmetic, each hyperparameter rounded
    // to fp32 once more (one u per rounded constant): m 5u, v 6u of their terms; the new weight
    // from the fp32 m and v: relative 12u on the Adam term (quotients, sqrt, +eps, both bias
    // corrections, lr) and 6u on lr wd |p|, plus u |new|; the m/v errors propagate (first order)
    // through m_hat/(sqrt(v_hat)+eps).
    bound_m[e] = 1.01 * u * 5 * (std::abs(b1 * m0[e]) + std::abs((1 - b1) * g[e]));
    bound_v[e] = 1.01 * u * 6 * (std::abs(b2 * v0[e]) + std::abs((1 - b2) * g[e] * g[e]));
    const double m_hat = exp_avg / hyper.bias_correction1, v_hat = exp_avg_sq / hyper.bias_correction2;
    const double denominator = std::sqrt(v_hat) + optimizer.adam_eps;
    const double a = std::abs(m_hat / denominator);
    const double carried = lr * (bound_m[e] / hyper.bias_correction1 / denominator +
                                 a * (bound_v[e] / hyper.bias_correction2) / (2 * std::sqrt(v_hat) * denominator));
    bound_p[e] = 1.01 * (lr * (12 * u * a + 6 * u * (decays ? wd : 0.0) * std::abs(p0[e])) + u * std::abs(param)) + carried;
  }
  expect_within("adamw m", m, want_m, bound_m);
  expect_within("adamw v", v, want_v, bound_v);
  expect_within("adamw weights", p, want_p, bound_p);
}

TEST(ProductionOps, ConversionsRoundToNearestEvenLikeTheCheckpointFormat) {
  // bf16_from_f32 (the ONE production rounding) against core/checkpoint's independent
  // bf16_from_float on ties, subnormals, infinities, NaN and a stream of random values.
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.00390625f /* tie: even down */, 1.01171875f /* tie: up */,
                               std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), 65504.0f, 3.0e38f};
  const auto random = random_values(4096, 101, 1e3);
  values.insert(values.end(), random.begin(), random.end());
  std::vector<Bf16> converted(values.size());
  convert_host(ConvertParams{values.data(), converted.data(), static_cast<std::int64_t>(values.size()), DType::f32, DType::bf16});
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(converted[i].bits, checkpoint::bf16_from_float(values[i])) << "value " << values[i];
  }
  EXPECT_EQ(f32_from_bf16(bf16_from_f32(1.00390625f)), 1.0f);        // 1 + 2^-8: tie to even
  EXPECT_EQ(f32_from_bf16(bf16_from_f32(1.01171875f)), 1.015625f);   // 1 + 3 x 2^-8: tie up to even
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(nan))));
  std::vector<float> back(values.size());
  convert_host(ConvertParams{converted.data(), back.data(), static_cast<std::int64_t>(values.size()), DType::bf16, DType::f32});
  for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(back[i], f32_from_bf16(converted[i]));  // exact widening
}

TEST(ProductionOps, ResidualAddBiasAndScaleAreTheirOneRounding) {
  // Dyadic inputs: every result is exactly representable, so exact equality.
  std::vector<float> a = {1.5f, -2.25f, 0.125f, 4.0f}, b = {0.5f, 0.25f, -0.125f, -8.0f}, out(4);
  add_host(AddParams{a.data(), b.data(), out.data(), 4, DType::f32});
  EXPECT_EQ(out, (std::vector<float>{2.0f, -2.0f, 0.0f, -4.0f}));
  std::vector<float> bias = {1.0f, -1.0f};  // [2]
  bias_add_host(BiasAddParams{a.data(), bias.data(), 2, 2, DType::f32});
  EXPECT_EQ(a, (std::vector<float>{2.5f, -3.25f, 1.125f, 3.0f}));
  std::vector<float> bias_grad = {0.5f, 0.5f};
  bias_grad_host(BiasGradParams{b.data(), bias_grad.data(), 2, 2, DType::f32});
  EXPECT_EQ(bias_grad, (std::vector<float>{0.5f + 0.5f - 0.125f, 0.5f + 0.25f - 8.0f}));
  scale_host(ScaleParams{b.data(), 4, 0.5f});
  EXPECT_EQ(b, (std::vector<float>{0.25f, 0.125f, -0.0625f, -4.0f}));
  // bf16 add rounds once: 1 + 2^-9 is not a bf16 value; the sum rounds to 1.
  std::vector<Bf16> x = {bf16_from_f32(1.0f)}, y = {bf16_from_f32(std::ldexp(1.0f, -9))}, z(1);
  add_host(AddParams{x.data(), y.data(), z.data(), 1, DType::bf16});
  EXPECT_EQ(f32_from_bf16(z[0]), 1.0f);
}

}  // namespace
}  // namespace tandem
