// Every CUDA twin (production/kernels/*.cu, the shipped kernels through the cuda backend) against
// its host twin (kernels/*_host.cpp) on the same inputs. The comparison class comes first:
//   exact         — the interface promises the host's roundings (elementwise ops, embedding,
//                   RoPE's rotation for a given table, AdamW, scale, bias_grad, and RMSNorm's
//                   forward on inputs whose sums are exact): bit for bit;
//   approximate   — different summation order or a different expf (RMSNorm's weight gradient,
//                   SwiGLU, cross-entropy, attention, GEMM): |cuda - host| <= a bound derived from
//                   u = 2^-24 (fp32), u_bf16 = 2^-8 and the reduction length, written beside it;
//   deterministic — the same CUDA op twice on the same inputs: bitwise equal.
// A compute-typed bf16 output may straddle a rounding boundary when the fp32 values differ, so its
// bound adds one bf16 ulp, 2 u_bf16 |host|. Every test skips when no CUDA device answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "production/backend.hpp"
#include "production/cuda/device.hpp"
#include "production/trainer.hpp"
#include "tests/support/op_comparison.hpp"

namespace tandem::production {
namespace {

using namespace op_comparison;

class CudaOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (tandem::cuda::device_count() == 0) {
      GTEST_SKIP() << "no CUDA device answers (" << tandem::cuda::device_description(0) << ")";
    }
    gpu_ = make_cuda_backend(0);
  }
  DType dtype() const { return GetParam(); }

  // A device copy of host data.
  template <class T>
  Buffer<T> upload(const std::vector<T>& host) {
    Buffer<T> buffer(*gpu_, static_cast<std::int64_t>(host.size()));
    buffer.upload(host);
    return buffer;
  }
  Buffer<std::uint8_t> upload(const HostArray& host) { return upload(host.bytes); }
  HostArray download(const Buffer<std::uint8_t>& buffer, DType type) {
    HostArray out;
    out.dtype = type;
    out.bytes = buffer.download();
    return out;
  }

  std::unique_ptr<Backend> gpu_;
};

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return info.param == DType::f32 ? std::string("f32") : std::string("bf16"); });

TEST_P(CudaOps, ConvertAddBiasAreExactAndBiasGradSumsInTheHostsOrder) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 37, width = 29, count = rows * width;
  std::vector<float> a = uniform(generator, count, -4.0f, 4.0f);
  // Rounding edge cases: a tie (1 + 2^-8 rounds to even), NaN, infinities, -0, a subnormal.
  a[0] = 1.0f + 0x1p-8f;
  a[1] = std::numeric_limits<float>::quiet_NaN();
  a[2] = std::numeric_limits<float>::infinity();
  a[3] = -0.0f;
  a[4] = 0x1p-130f;
  const std::vector<float> b = uniform(generator, count, -4.0f, 4.0f);
  const std::vector<float> bias = uniform(generator, width, -1.0f, 1.0f);

  // convert f32 -> dtype, then dtype -> f32.
  const HostArray a32(DType::f32, a);
  HostArray host_converted(dtype(), count);
  convert_host({a32.data(), host_converted.data(), count, DType::f32, dtype()});
  auto device_a32 = upload(a32);
  Buffer<std::uint8_t> device_converted(*gpu_, count * dtype_bytes(dtype()));
  gpu_->convert({device_a32.data(), device_converted.data(), count, DType::f32, dtype()});
  Verdict verdict = compare_bits("convert", host_converted.bytes, device_converted.download(),
                                 static_cast<int>(dtype_bytes(dtype())));
  EXPECT_TRUE(verdict.ok) << verdict.report;
  HostArray host_back(DType::f32, count);
  convert_host({host_converted.data(), host_back.data(), count, dtype(), DType::f32});
  Buffer<std::uint8_t> device_back(*gpu_, count * 4);
  gpu_->convert({device_converted.data(), device_back.data(), count, dtype(), DType::f32});
  verdict = compare_bits("convert back", host_back.bytes, device_back.download(), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;

  // add (in place on a, the residual stream's aliasing), bias_add, bias_grad.
  const HostArray ha(dtype(), uniform(generator, count, -4.0f, 4.0f)), hb(dtype(), b), hbias(dtype(), bias);
  HostArray host_sum = ha;
  add_host({host_sum.data(), hb.data(), host_sum.data(), count, dtype()});
  bias_add_host({host_sum.data(), hbias.data(), rows, width, dtype()});
  std::vector<float> host_bias_grad = uniform(generator, width, -1.0f, 1.0f);
  std::vector<float> initial_bias_grad = host_bias_grad;
  bias_grad_host({host_sum.data(), host_bias_grad.data(), rows, width, dtype()});

  auto device_sum = upload(ha);
  auto device_b = upload(hb);
  auto device_bias = upload(hbias);
  auto device_bias_grad = upload(initial_bias_grad);
  gpu_->add({device_sum.data(), device_b.data(), device_sum.data(), count, dtype()});
  gpu_->bias_add({device_sum.data(), device_bias.data(), rows, width, dtype()});
  gpu_->bias_grad({device_sum.data(), device_bias_grad.data(), rows, width, dtype()});
  verdict = compare_bits("add + bias_add", host_sum.bytes, device_sum.download(), static_cast<int>(dtype_bytes(dtype())));
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("bias_grad", as_bytes(host_bias_grad), as_bytes(device_bias_grad.download()), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(CudaOps, EmbeddingForwardCopiesAndBackwardAddsInTheHostsOrderDeterministically) {
  std::mt19937 generator(kSeed);
  const std::int64_t vocab = 50, width = 24, rows = 300;
  std::uniform_int_distribution<std::int32_t> token(0, 9);  // few tokens: long runs of repeats
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows));
  for (auto& t : tokens) t = token(generator) * 5;
  const HostArray table(dtype(), uniform(generator, vocab * width, -1.0f, 1.0f));
  const HostArray output_grad(dtype(), uniform(generator, rows * width, -1.0f, 1.0f));
  const std::vector<float> initial_grad = uniform(generator, vocab * width, -1.0f, 1.0f);

  HostArray host_out(dtype(), rows * width);
  embedding_forward_host({tokens.data(), table.data(), host_out.data(), rows, width, dtype()});
  std::vector<float> host_grad = initial_grad;
  embedding_backward_host({tokens.data(), output_grad.data(), host_grad.data(), rows, width, vocab, dtype()});

  auto d_tokens = upload(tokens);
  auto d_table = upload(table);
  auto d_output_grad = upload(output_grad);
  Buffer<std::uint8_t> d_out(*gpu_, rows * width * dtype_bytes(dtype()));
  gpu_->embedding_forward({d_tokens.data(), d_table.data(), d_out.data(), rows, width, dtype()});
  Verdict verdict = compare_bits("embedding forward", host_out.bytes, d_out.download(), static_cast<int>(dtype_bytes(dtype())));
  EXPECT_TRUE(verdict.ok) << verdict.report;
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    auto d_grad = upload(initial_grad);
    gpu_->embedding_backward({d_tokens.data(), d_output_grad.data(), d_grad.data(), rows, width, vocab, dtype()});
    runs.push_back(d_grad.download());
  }
  verdict = compare_bits("embedding backward", as_bytes(host_grad), as_bytes(runs[0]), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("embedding backward run to run", as_bytes(runs[0]), as_bytes(runs[1]), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(CudaOps, RopeTableWithinTheDoubleBoundAndRotationExactForTheSameTable) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 64, head_dim = 16, heads = 3, half = head_dim / 2;
  std::vector<std::int32_t> positions(static_cast<std::size_t>(rows));
  for (std::int64_t t = 0; t < rows; ++t) positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 977) % 9000);
  std::vector<float> host_cos(static_cast<std::size_t>(rows * half)), host_sin(host_cos.size());
  rope_table_host({positions.data(), host_cos.data(), host_sin.data(), rows, head_dim, 10000.0});
  auto d_positions = upload(positions);
  Buffer<float> d_cos(*gpu_, rows * half), d_sin(*gpu_, rows * half);
  gpu_->rope_table({d_positions.data(), d_cos.data(), d_sin.data(), rows, head_dim, 10000.0});
  // Both build the value in double: the frequency (pow within 1 ulp on glibc, 2 on CUDA) and the
  // angle's product differ by <= 8 * 2^-53 |angle| between them, cos/sin each within 2^-52
  // absolute; rounded to fp32 the two values then differ by that delta plus one fp32 ulp
  // (<= 2u |value|).
  const auto one_ulp = [&](const std::vector<float>& reference) {
    return [&reference, &positions, half, head_dim](std::size_t index) {
      const std::size_t row = index / static_cast<std::size_t>(half), i = index % static_cast<std::size_t>(half);
      const double angle = positions[row] * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      return 2.0 * kU * std::fabs(reference[index]) + 8.0 * 0x1p-53 * std::fabs(angle) + 0x1p-51;
    };
  };
  Verdict verdict = compare_within("rope cosines", host_cos, d_cos.download(), one_ulp(host_cos));
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_within("rope sines", host_sin, d_sin.download(), one_ulp(host_sin));
  EXPECT_TRUE(verdict.ok) << verdict.report;

  // Rotation on the host's table, forward then backward: bit for bit.
  d_cos.upload(host_cos);
  d_sin.upload(host_sin);
  HostArray host_values(dtype(), uniform(generator, rows * heads * head_dim, -2.0f, 2.0f));
  auto d_values = upload(host_values);
  rope_forward_host({host_values.data(), host_cos.data(), host_sin.data(), rows, heads, head_dim, dtype()});
  gpu_->rope_forward({d_values.data(), d_cos.data(), d_sin.data(), rows, heads, head_dim, dtype()});
  verdict = compare_bits("rope forward", host_values.bytes, d_values.download(), static_cast<int>(dtype_bytes(dtype())));
  EXPECT_TRUE(verdict.ok) << verdict.report;
  rope_backward_host({host_values.data(), host_cos.data(), host_sin.data(), rows, heads, head_dim, dtype()});
  gpu_->rope_backward({d_values.data(), d_cos.data(), d_sin.data(), rows, heads, head_dim, dtype()});
  verdict = compare_bits("rope backward", host_values.bytes, d_values.download(), static_cast<int>(dtype_bytes(dtype())));
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(CudaOps, SwigluWithinTheBoundOfTwoExpImplementations) {
  std::mt19937 generator(kSeed);
  const std::int64_t count = 4099;
  const HostArray gate(dtype(), uniform(generator, count, -12.0f, 12.0f));
  const HostArray up(dtype(), uniform(generator, count, -3.0f, 3.0f));
  const HostArray hidden_grad(dtype(), uniform(generator, count, -3.0f, 3.0f));
  HostArray host_hidden(dtype(), count), host_gate_grad(dtype(), count), host_up_grad(dtype(), count);
  swiglu_forward_host({gate.data(), up.data(), host_hidden.data(), count, dtype()});
  swiglu_backward_host({gate.data(), up.data(), hidden_grad.data(), host_gate_grad.data(), host_up_grad.data(), count, dtype()});
  auto d_gate = upload(gate), d_up = upload(up), d_hidden_grad = upload(hidden_grad);
  Buffer<std::uint8_t> d_hidden(*gpu_, count * dtype_bytes(dtype())), d_gate_grad(*gpu_, count * dtype_bytes(dtype())),
      d_up_grad(*gpu_, count * dtype_bytes(dtype()));
  gpu_->swiglu_forward({d_gate.data(), d_up.data(), d_hidden.data(), count, dtype()});
  gpu_->swiglu_backward({d_gate.data(), d_up.data(), d_hidden_grad.data(), d_gate_grad.data(), d_up_grad.data(), count, dtype()});
  // exp(-g): CUDA's expf within 2 ulp, glibc's within 1: relative difference <= 6u. sigma = 1/(1+e)
  // inherits <= 6u and each of its two ops adds 2u (both sides round): 10u; silu = g sigma: 12u;
  // hidden = silu up: 14u. Bound 16u |hidden| (+ the bf16 straddle).
  const auto g = gate.values(), u = up.values(), dh = hidden_grad.values();
  const std::vector<float> hidden = host_hidden.values();
  Verdict verdict = compare_within("swiglu hidden", hidden, download(d_hidden, dtype()).values(), [&](std::size_t i) {
    return 16.0 * kU * std::fabs(hidden[i]) + store_slack(dtype(), hidden[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  // silu'(g) = sigma (1 + g (1 - sigma)): 1 - sigma has absolute error <= 12u sigma, so
  // g (1 - sigma) has absolute error <= 12u |g| (+ its own 2u relative); the whole derivative has
  // absolute error <= (12 |g| + 8) u (sigma <= 1, 1 + ... rounding). gate_grad = dh up silu':
  // <= (12 |g| + 16) u |dh up| with the two products' 4u; bound 16 (|g| + 2) u |dh up|.
  const std::vector<float> gate_grad = host_gate_grad.values(), up_grad = host_up_grad.values();
  verdict = compare_within("swiglu gate_grad", gate_grad, download(d_gate_grad, dtype()).values(), [&](std::size_t i) {
    return 16.0 * (std::fabs(g[i]) + 2.0) * kU * std::fabs(dh[i] * u[i]) + store_slack(dtype(), gate_grad[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_within("swiglu up_grad", up_grad, download(d_up_grad, dtype()).values(), [&](std::size_t i) {
    return 16.0 * kU * std::fabs(up_grad[i]) + store_slack(dtype(), up_grad[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(CudaOps, RmsnormForwardExactOnExactSumsAndBackwardWithinTheReductionBound) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 100, width = 64;  // width a power of two: the mean is exact
  // x = k/16, |k| <= 64: squares are multiples of 2^-8 below 16, their sums exact in fp32 in any
  // order, so inverse_rms and y are the host's bit for bit.
  const HostArray input(dtype(), dyadic(generator, rows * width, 64, 4));
  const HostArray weight(dtype(), dyadic(generator, width, 16, 3));
  const HostArray output_grad(dtype(), dyadic(generator, rows * width, 32, 4));
  const HostArray initial_input_grad(dtype(), dyadic(generator, rows * width, 32, 4));
  HostArray host_out(dtype(), rows * width);
  std::vector<float> host_inverse_rms(static_cast<std::size_t>(rows));
  rmsnorm_forward_host({input.data(), weight.data(), host_out.data(), host_inverse_rms.data(), rows, width, 1e-5f, dtype()});
  auto d_input = upload(input), d_weight = upload(weight), d_output_grad = upload(output_grad);
  Buffer<std::uint8_t> d_out(*gpu_, rows * width * dtype_bytes(dtype()));
  Buffer<float> d_inverse_rms(*gpu_, rows);
  gpu_->rmsnorm_forward({d_input.data(), d_weight.data(), d_out.data(), d_inverse_rms.data(), rows, width, 1e-5f, dtype()});
  Verdict verdict = compare_bits("rmsnorm inverse_rms", as_bytes(host_inverse_rms), as_bytes(d_inverse_rms.download()), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("rmsnorm forward", host_out.bytes, d_out.download(), static_cast<int>(dtype_bytes(dtype())));
  EXPECT_TRUE(verdict.ok) << verdict.report;

  for (const bool accumulate : {false, true}) {
    HostArray host_input_grad = initial_input_grad;
    std::vector<float> host_weight_grad(static_cast<std::size_t>(width), 0.25f);
    rmsnorm_backward_host({input.data(), weight.data(), host_inverse_rms.data(), output_grad.data(), host_input_grad.data(),
                           host_weight_grad.data(), rows, width, accumulate, dtype()});
    std::vector<std::vector<float>> weight_grads;
    std::vector<std::vector<std::uint8_t>> input_grads;
    for (int run = 0; run < 2; ++run) {
      auto d_input_grad = upload(initial_input_grad);
      auto d_weight_grad = upload(std::vector<float>(static_cast<std::size_t>(width), 0.25f));
      gpu_->rmsnorm_backward({d_input.data(), d_weight.data(), d_inverse_rms.data(), d_output_grad.data(),
                              d_input_grad.data(), d_weight_grad.data(), rows, width, accumulate, dtype()});
      weight_grads.push_back(d_weight_grad.download());
      input_grads.push_back(d_input_grad.download());
    }
    // dx: the dot product sum_j dy_j w_j x_j is exact on these inputs, so dx is exact.
    verdict = compare_bits("rmsnorm input_grad", host_input_grad.bytes, input_grads[0], static_cast<int>(dtype_bytes(dtype())));
    EXPECT_TRUE(verdict.ok) << verdict.report << " (accumulate " << accumulate << ")";
    // dw_j = 0.25 + sum over rows of fl(fl(dy x) r): the same rounded terms summed in two orders
    // (sequential; blocks of 32 rows then the blocks), each within gamma_{rows+1} of the exact
    // sum of |terms|: |difference| <= 2 gamma_{rows+1} (0.25 + sum |dy x r|).
    const std::vector<float> dy = output_grad.values(), x = input.values();
    verdict = compare_within("rmsnorm weight_grad", host_weight_grad, weight_grads[0], [&](std::size_t j) {
      double magnitude = 0.25;
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::size_t i = static_cast<std::size_t>(row * width) + j;
        magnitude += std::fabs(static_cast<double>(dy[i]) * x[i] * host_inverse_rms[static_cast<std::size_t>(row)]);
      }
      const double n = static_cast<double>(rows + 1);
      return 2.0 * n * kU / (1.0 - n * kU) * magnitude;
    });
    EXPECT_TRUE(verdict.ok) << verdict.report;
    verdict = compare_bits("rmsnorm weight_grad run to run", as_bytes(weight_grads[0]), as_bytes(weight_grads[1]), 4);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
}

TEST_P(CudaOps, CrossEntropyWithinTheBoundAndMaskedRowsExactlyZero) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 9, vocab = 1000;
  const std::vector<float> logits = uniform(generator, rows * vocab, -8.0f, 8.0f);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    labels[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 311) % vocab);
    mask[static_cast<std::size_t>(r)] = r % 3 == 1 ? 0 : 1;
  }
  const float loss_scale = 1.0f / 6.0f;
  std::vector<float> host_losses(static_cast<std::size_t>(rows));
  HostArray host_grad(dtype(), rows * vocab);
  cross_entropy_host({logits.data(), labels.data(), mask.data(), host_losses.data(), host_grad.data(), rows, vocab, loss_scale, dtype()});
  auto d_logits = upload(logits);
  auto d_labels = upload(labels);
  auto d_mask = upload(mask);
  std::vector<std::vector<float>> losses;
  std::vector<std::vector<std::uint8_t>> grads;
  for (int run = 0; run < 2; ++run) {
    Buffer<float> d_losses(*gpu_, rows);
    Buffer<std::uint8_t> d_grad(*gpu_, rows * vocab * dtype_bytes(dtype()));
    gpu_->cross_entropy({d_logits.data(), d_labels.data(), d_mask.data(), d_losses.data(), d_grad.data(), rows, vocab, loss_scale, dtype()});
    losses.push_back(d_losses.download());
    grads.push_back(d_grad.download());
  }
  // lse = max + log(S), S = sum of V terms exp(z - max) in [0, 1]: each term within 6u (two expf
  // implementations), the sums in two orders within 2 gamma_V S, so log S within (6 + 2V)u + the
  // two logf's 3 ulp; the loss lse - z[label] within ((6 + 2V)u + 6u |log S|) + 2u |lse| + 2u |loss|.
  const double sum_bound = (6.0 + 2.0 * static_cast<double>(vocab)) * kU;
  std::vector<double> lse_bound(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * vocab;
    const double max_logit = *std::max_element(z, z + vocab);
    double s = 0;
    for (std::int64_t c = 0; c < vocab; ++c) s += std::exp(z[c] - max_logit);
    const double lse = max_logit + std::log(s);
    lse_bound[static_cast<std::size_t>(r)] = sum_bound + 6.0 * kU * std::fabs(std::log(s)) + 4.0 * kU * std::fabs(lse);
  }
  Verdict verdict = compare_within("cross-entropy row losses", host_losses, losses[0], [&](std::size_t r) {
    return lse_bound[r] + 2.0 * kU * std::fabs(host_losses[r]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  // p = exp(z - lse): its argument within lse_bound + 2u |z - lse|, expf within 6u: relative
  // (lse_bound + 2u |z - lse| + 6u); grad = scale (p - target) with 2 more roundings.
  const std::vector<float> host_grad_values = host_grad.values();
  HostArray device_grad;
  device_grad.dtype = dtype();
  device_grad.bytes = grads[0];
  verdict = compare_within("cross-entropy logits_grad", host_grad_values, device_grad.values(), [&](std::size_t i) {
    const std::size_t r = i / static_cast<std::size_t>(vocab);
    if (mask[r] == 0) return 0.0;  // exactly zero in both
    const double lse = static_cast<double>(host_losses[r]) + logits[r * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(labels[r])];
    const double p = std::exp(static_cast<double>(logits[i]) - lse);
    const double relative = lse_bound[r] + 2.0 * kU * std::fabs(logits[i] - lse) + 6.0 * kU;
    return loss_scale * (p * relative + 4.0 * kU * (p + 1.0)) + store_slack(dtype(), host_grad_values[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("cross-entropy run to run", grads[0], grads[1], 1);
  EXPECT_TRUE(verdict.ok) << verdict.report;

  // Negative control: the comparison rejects a loss shifted by 100 times its bound.
  std::vector<float> shifted = host_losses;
  shifted[0] += static_cast<float>(100.0 * (lse_bound[0] + 2.0 * kU * std::fabs(host_losses[0])));
  EXPECT_FALSE(compare_within("control", host_losses, shifted, [&](std::size_t r) { return lse_bound[r] + 2.0 * kU * std::fabs(host_losses[r]); }).ok);

  // f32 gradients may overwrite the logits in place.
  if (dtype() == DType::f32) {
    Buffer<float> d_losses(*gpu_, rows);
    gpu_->cross_entropy({d_logits.data(), d_labels.data(), d_mask.data(), d_losses.data(), d_logits.data(), rows, vocab, loss_scale, DType::f32});
    verdict = compare_bits("cross-entropy in place", grads[0], as_bytes(d_logits.download()), 4);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }

  // Loss only (logits_grad = nullptr, evaluation): the same row losses bit for bit as the call
  // that stores the gradient, and the logits untouched.
  auto d_fresh_logits = upload(logits);
  Buffer<float> d_loss_only(*gpu_, rows);
  gpu_->cross_entropy({d_fresh_logits.data(), d_labels.data(), d_mask.data(), d_loss_only.data(), nullptr, rows, vocab, loss_scale, dtype()});
  verdict = compare_bits("cross-entropy loss only", as_bytes(losses[0]), as_bytes(d_loss_only.download()), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("cross-entropy loss only leaves the logits", as_bytes(logits), as_bytes(d_fresh_logits.download()), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

// Attention cases: packed samples (several documents, including one of a single position), GQA,
// head dims 16, 20 (padded, scalar loads on the bf16 path), 64 and 128, sequences that are not a
// multiple of the 64-row tiles. bf16 runs the tensor-core kernels, fp32 the CUDA-core ones.
struct AttentionCase {
  std::string name;
  AttentionShape shape;
  std::vector<std::int64_t> documents;  // lengths of sample 0's documents (sum = seq); the others are one document
};

const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> cases = {
      {"hd16 S2 seq64 H4 G2 docs 5/40/19", {2, 64, 4, 2, 16}, {5, 40, 19}},
      {"hd20 S1 seq80 H2 G1 docs 30/50", {1, 80, 2, 1, 20}, {30, 50}},
      {"hd64 S2 seq200 H4 G2 docs 37/100/63", {2, 200, 4, 2, 64}, {37, 100, 63}},
      {"hd128 S1 seq150 H4 G1 docs 1/70/79", {1, 150, 4, 1, 128}, {1, 70, 79}},
      {"hd128 S1 seq130 H2 G2 one doc", {1, 130, 2, 2, 128}, {130}},
  };
  return cases;
}

TEST_P(CudaOps, AttentionWithinTheBoundAndDeterministic) {
  for (const AttentionCase& attention_case : attention_cases()) {
    SCOPED_TRACE(attention_case.name);
    std::mt19937 generator(kSeed);
    const AttentionShape shape = attention_case.shape;
    const std::int64_t rows = shape.samples * shape.seq;
    const std::int64_t q_width = shape.heads * shape.head_dim, kv_width = shape.groups * shape.head_dim;
    std::vector<std::int32_t> starts(static_cast<std::size_t>(rows), 0);
    std::int64_t document_start = 0;
    for (const std::int64_t length : attention_case.documents) {
      for (std::int64_t t = document_start; t < document_start + length; ++t) {
        starts[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(document_start);
      }
      document_start += length;
    }
    ASSERT_EQ(document_start, shape.seq) << "the documents must fill sample 0";
    const HostArray query(dtype(), uniform(generator, rows * q_width, -1.0f, 1.0f));
    const HostArray key(dtype(), uniform(generator, rows * kv_width, -1.0f, 1.0f));
    const HostArray value(dtype(), uniform(generator, rows * kv_width, -1.0f, 1.0f));
    const HostArray context_grad(dtype(), uniform(generator, rows * q_width, -1.0f, 1.0f));
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));

    HostArray host_context(dtype(), rows * q_width);
    std::vector<float> host_lse(static_cast<std::size_t>(rows * shape.heads));
    attention_forward_host({query.data(), key.data(), value.data(), starts.data(), host_context.data(), host_lse.data(), shape, scale, dtype()});
    HostArray host_dq(dtype(), rows * q_width), host_dk(dtype(), rows * kv_width), host_dv(dtype(), rows * kv_width);
    attention_backward_host({query.data(), key.data(), value.data(), host_context.data(), host_lse.data(), context_grad.data(),
                             starts.data(), host_dq.data(), host_dk.data(), host_dv.data(), shape, scale, dtype()});

    auto d_query = upload(query), d_key = upload(key), d_value = upload(value), d_context_grad = upload(context_grad);
    auto d_starts = upload(starts);
    std::vector<std::vector<std::uint8_t>> context_runs, lse_runs;
    for (int run = 0; run < 2; ++run) {
      Buffer<std::uint8_t> d_context(*gpu_, rows * q_width * dtype_bytes(dtype()));
      Buffer<float> d_lse(*gpu_, rows * shape.heads);
      gpu_->attention_forward({d_query.data(), d_key.data(), d_value.data(), d_starts.data(), d_context.data(), d_lse.data(), shape, scale, dtype()});
      context_runs.push_back(d_context.download());
      lse_runs.push_back(as_bytes(d_lse.download()));
    }
    // The backward runs on the host's forward outputs, so it is compared alone.
    auto d_host_context = upload(host_context);
    auto d_host_lse = upload(host_lse);
    std::vector<std::vector<std::uint8_t>> dq_runs, dk_runs, dv_runs;
    for (int run = 0; run < 2; ++run) {
      Buffer<std::uint8_t> dq(*gpu_, rows * q_width * dtype_bytes(dtype())), dk(*gpu_, rows * kv_width * dtype_bytes(dtype())),
          dv(*gpu_, rows * kv_width * dtype_bytes(dtype()));
      gpu_->attention_backward({d_query.data(), d_key.data(), d_value.data(), d_host_context.data(), d_host_lse.data(),
                                d_context_grad.data(), d_starts.data(), dq.data(), dk.data(), dv.data(), shape, scale, dtype()});
      dq_runs.push_back(dq.download());
      dk_runs.push_back(dk.download());
      dv_runs.push_back(dv.download());
    }
    // Bounds per element from the magnitudes of what is summed, recomputed here in double.
    // sum_units: u's per term of a sum, both twins together. The host's fp32 sums are within
    //   gamma_n(u); the fp32 CUDA kernels' too (2 u together). The bf16 kernels sum on tensor cores:
    //   products of bf16 are exact in fp32, but the hardware's additions inside an mma are neither
    //   documented nor round-to-nearest (Fasi et al. 2021 measured truncated alignment and
    //   round-toward-zero on V100..A100), so the kernel side is held to 4 u a term (two ulps of
    //   truncation): 1 + 4 = 5 u together.
    //   z_ts = scale q_t . k_s: the twins differ by e_z = sum_units (hd + 1) u scale sum_i |q_ti k_si|;
    //   p_ts (backward: from the host's own logsumexp): relative difference
    //     rho_ts = e_z + 2u |z - lse| + 6u (the argument's rounding; two expf within 4u and 2u);
    //   forward context_t = sum_s p v / sum_s p: each p within rho (z differs by e_z on both the
    //     score and the max), the normalizer's sums within 2 gamma_n, the online rescaling's
    //     corrections within 4u each, the context sums within sum_units n u:
    //     |difference| <= (2 max_s rho + (5n + 32) u + (sum_units - 2) n u) sum_s p |v|;
    //   bf16 rounds p~ (and in the backward p and dz) in both twins at the same points
    //     (attention.hpp): values a and b within rho of each other round to values within
    //     |a - b| + u_bf16 (|a| + |b|) <= (rho + u_bf16 (2 + rho)) |a|, so a rounded factor's error
    //     grows by u_bf16 (2 |x| + its error), and a sum of rounded terms by (1 + u_bf16);
    //   dz_ts = p (dp - D) with dp, D dot products of hd terms:
    //     e_dz = p (rho |dp - D| + sum_units (hd + 2) u (sum |dctx v| + sum |dctx ctx|)) + 8u |dz|;
    //   dq = scale sum_s dz k, dk = scale sum dz q, dv = sum p dctx over N terms:
    //     the terms' errors plus sum_units (N + 2) u times the sum of |terms|.
    const bool rounded = dtype() == DType::bf16;
    const double sum_units = rounded ? 5.0 : 2.0;
    const double rounded_growth = rounded ? 1.0 + kUBf16 : 1.0;
    const auto rounding_error = [&](double magnitude, double error) {  // a rounded factor's error
      return rounded ? error + kUBf16 * (2.0 * magnitude + error) : error;
    };
    const std::int64_t hd = shape.head_dim, hpg = shape.heads / shape.groups;
    const std::vector<float> qv = query.values(), kv = key.values(), vv = value.values(), dctx = context_grad.values();
    const std::vector<float> context = host_context.values();
    std::vector<double> context_bound(context.size(), 0.0), dq_bound(context.size(), 0.0);
    std::vector<double> dk_bound(static_cast<std::size_t>(rows * kv_width), 0.0), dv_bound(dk_bound.size(), 0.0);
    std::vector<double> dq_terms(dq_bound.size(), 0.0), dk_terms(dk_bound.size(), 0.0), dv_terms(dv_bound.size(), 0.0);
    std::vector<double> context_terms(context.size(), 0.0), context_rho(context.size(), 0.0);
    std::vector<double> context_rounding(context.size(), 0.0);
    const double ds = static_cast<double>(scale);
    for (std::int64_t sample = 0; sample < shape.samples; ++sample) {
      for (std::int64_t head = 0; head < shape.heads; ++head) {
        const std::int64_t group = head / hpg;
        for (std::int64_t t = 0; t < shape.seq; ++t) {
          const std::int64_t row = sample * shape.seq + t;
          const std::int64_t first = starts[static_cast<std::size_t>(row)];
          const std::size_t q_at = static_cast<std::size_t>(row * q_width + head * hd);
          const double lse = host_lse[static_cast<std::size_t>(row * shape.heads + head)];
          double dot_magnitude = 0, expected_grad = 0;
          for (std::int64_t i = 0; i < hd; ++i) {
            dot_magnitude += std::fabs(static_cast<double>(dctx[q_at + i]) * context[q_at + i]);
            expected_grad += static_cast<double>(dctx[q_at + i]) * context[q_at + i];
          }
          double max_rho = 0;
          const double n = static_cast<double>(t - first + 1);
          for (std::int64_t s = first; s <= t; ++s) {
            const std::size_t k_at = static_cast<std::size_t>((sample * shape.seq + s) * kv_width + group * hd);
            double z = 0, z_magnitude = 0, dp = 0, dp_magnitude = 0;
            for (std::int64_t i = 0; i < hd; ++i) {
              z += static_cast<double>(qv[q_at + i]) * kv[k_at + i];
              z_magnitude += std::fabs(static_cast<double>(qv[q_at + i]) * kv[k_at + i]);
              dp += static_cast<double>(dctx[q_at + i]) * vv[k_at + i];
              dp_magnitude += std::fabs(static_cast<double>(dctx[q_at + i]) * vv[k_at + i]);
            }
            z *= ds;
            const double p = std::exp(z - lse);
            const double rho = sum_units * static_cast<double>(hd + 1) * kU * ds * z_magnitude + 2.0 * kU * std::fabs(z - lse) + 6.0 * kU;
            max_rho = std::max(max_rho, rho);
            const double dz = p * (dp - expected_grad);
            const double dz_error = rounding_error(
                std::fabs(dz), p * (rho * std::fabs(dp - expected_grad) + sum_units * static_cast<double>(hd + 2) * kU * (dp_magnitude + dot_magnitude)) +
                                   8.0 * kU * std::fabs(dz));
            const double p_error = rounding_error(p, rho * p);
            for (std::int64_t i = 0; i < hd; ++i) {
              const std::size_t qi = q_at + static_cast<std::size_t>(i), ki = k_at + static_cast<std::size_t>(i);
              context_terms[qi] += p * std::fabs(vv[ki]);
              dq_bound[qi] += ds * dz_error * std::fabs(kv[ki]);
              dq_terms[qi] += rounded_growth * ds * std::fabs(dz * kv[ki]);
              dk_bound[ki] += ds * dz_error * std::fabs(qv[qi]);
              dk_terms[ki] += rounded_growth * ds * std::fabs(dz * qv[qi]);
              dv_bound[ki] += p_error * std::fabs(dctx[qi]);
              dv_terms[ki] += rounded_growth * p * std::fabs(dctx[qi]);
            }
          }
          for (std::int64_t i = 0; i < hd; ++i) {
            context_rho[q_at + static_cast<std::size_t>(i)] = 2.0 * max_rho + (5.0 * n + 32.0) * kU + (sum_units - 2.0) * n * kU;
            context_rounding[q_at + static_cast<std::size_t>(i)] = rounded ? kUBf16 * (2.0 + 2.0 * max_rho) : 0.0;
            dq_bound[q_at + static_cast<std::size_t>(i)] += sum_units * (n + 2.0) * kU * dq_terms[q_at + static_cast<std::size_t>(i)];
          }
        }
      }
    }
    const double key_terms = static_cast<double>(shape.seq * hpg);  // terms of a dk or dv sum, at most
    for (std::size_t i = 0; i < context.size(); ++i) {
      context_bound[i] = (context_rho[i] + context_rounding[i]) * rounded_growth * context_terms[i];
    }
    for (std::size_t i = 0; i < dk_bound.size(); ++i) {
      dk_bound[i] += sum_units * (key_terms + 2.0) * kU * dk_terms[i];
      dv_bound[i] += sum_units * (key_terms + 2.0) * kU * dv_terms[i];
    }
    const auto values_of = [&](const std::vector<std::uint8_t>& bytes) {
      HostArray array;
      array.dtype = dtype();
      array.bytes = bytes;
      return array.values();
    };
    Verdict verdict = compare_within("attention context", context, values_of(context_runs[0]),
                                     [&](std::size_t i) { return context_bound[i] + store_slack(dtype(), context[i]); });
    EXPECT_TRUE(verdict.ok) << verdict.report;
    // logsumexp = max + log(sum p'): the max within e_z, the normalizer within the context's
    // relative bound before rounding (the normalizer sums unrounded p), logf within 3 ulp of
    // |log sum| <= log(seq), the final add 2u |lse|.
    std::vector<float> cuda_lse(host_lse.size());
    std::memcpy(cuda_lse.data(), lse_runs[0].data(), lse_runs[0].size());
    verdict = compare_within("attention logsumexp", host_lse, cuda_lse, [&](std::size_t i) {
      const std::size_t row = i / static_cast<std::size_t>(shape.heads), head = i % static_cast<std::size_t>(shape.heads);
      return context_rho[row * static_cast<std::size_t>(q_width) + head * static_cast<std::size_t>(hd)] +
             6.0 * kU * std::log(static_cast<double>(shape.seq)) + 4.0 * kU * std::fabs(host_lse[i]);
    });
    EXPECT_TRUE(verdict.ok) << verdict.report;
    const std::vector<float> dq = host_dq.values(), dk = host_dk.values(), dv = host_dv.values();
    verdict = compare_within("attention query_grad", dq, values_of(dq_runs[0]),
                             [&](std::size_t i) { return dq_bound[i] + store_slack(dtype(), dq[i]); });
    EXPECT_TRUE(verdict.ok) << verdict.report;
    verdict = compare_within("attention key_grad", dk, values_of(dk_runs[0]),
                             [&](std::size_t i) { return dk_bound[i] + store_slack(dtype(), dk[i]); });
    EXPECT_TRUE(verdict.ok) << verdict.report;
    verdict = compare_within("attention value_grad", dv, values_of(dv_runs[0]),
                             [&](std::size_t i) { return dv_bound[i] + store_slack(dtype(), dv[i]); });
    EXPECT_TRUE(verdict.ok) << verdict.report;
    // deterministic: the same launch twice gives the same bits.
    for (const auto* runs : {&context_runs, &lse_runs, &dq_runs, &dk_runs, &dv_runs}) {
      verdict = compare_bits("attention run to run", (*runs)[0], (*runs)[1], 1);
      EXPECT_TRUE(verdict.ok) << verdict.report;
    }
    // Negative controls: a context shifted in one element by 10 times its bound is rejected, and
    // so is the host twin's context computed with one document boundary moved (a mask error).
    std::vector<float> shifted = context;
    shifted[7] += static_cast<float>(10.0 * (context_bound[7] + store_slack(dtype(), context[7])));
    EXPECT_FALSE(compare_within("control", context, shifted,
                                [&](std::size_t i) { return context_bound[i] + store_slack(dtype(), context[i]); }).ok);
    if (attention_case.documents.size() > 1) {
      std::vector<std::int32_t> moved = starts;
      const auto boundary = static_cast<std::size_t>(attention_case.documents[0]);
      moved[boundary] = 0;  // the second document's first row also sees the first document
      HostArray moved_context(dtype(), rows * q_width);
      std::vector<float> moved_lse(host_lse.size());
      attention_forward_host({query.data(), key.data(), value.data(), moved.data(), moved_context.data(), moved_lse.data(), shape, scale, dtype()});
      EXPECT_FALSE(compare_within("mask control", context, moved_context.values(),
                                  [&](std::size_t i) { return context_bound[i] + store_slack(dtype(), context[i]); }).ok);
    }
  }
}

TEST_P(CudaOps, GemmWithinTheDotProductBoundForEveryTransposeAndBeta) {
  std::mt19937 generator(kSeed);
  // bf16 operands on tensor-core friendly sizes; f32 on odd ones as well.
  struct Case { std::int64_t m, n, k; };
  const std::vector<Case> cases = dtype() == DType::bf16 ? std::vector<Case>{{64, 48, 96}, {128, 72, 40}}
                                                         : std::vector<Case>{{64, 48, 96}, {37, 29, 53}};
  for (const Case& shape : cases) {
    for (const Transpose ta : {Transpose::no, Transpose::yes}) {
      for (const Transpose tb : {Transpose::no, Transpose::yes}) {
        for (const DType c_dtype : {DType::f32, dtype()}) {
          for (const float beta : {0.0f, 1.0f}) {
            const HostArray a(dtype(), uniform(generator, shape.m * shape.k, -1.0f, 1.0f));
            const HostArray b(dtype(), uniform(generator, shape.k * shape.n, -1.0f, 1.0f));
            const HostArray c0(c_dtype, uniform(generator, shape.m * shape.n, -1.0f, 1.0f));
            GemmParams params{shape.m, shape.n, shape.k, {a.data(), dtype(), ta}, {b.data(), dtype(), tb},
                              nullptr, c_dtype, 0.5f, beta};
            HostArray host_c = c0;
            params.c = host_c.data();
            gemm_host(params);
            auto d_a = upload(a), d_b = upload(b), d_c = upload(c0);
            params.a.data = d_a.data();
            params.b.data = d_b.data();
            params.c = d_c.data();
            gpu_->gemm(params);
            // Each C element: alpha sum_l a b + beta c. Two dot products of k terms in any order
            // differ by <= 2 gamma_k sum |a b|, plus alpha's and beta's roundings (2u each side).
            const std::vector<float> av = a.values(), bv = b.values(), cv = c0.values(), expected = host_c.values();
            const auto a_at = [&](std::int64_t i, std::int64_t l) {
              return av[static_cast<std::size_t>(ta == Transpose::no ? i * shape.k + l : l * shape.m + i)];
            };
            const auto b_at = [&](std::int64_t l, std::int64_t j) {
              return bv[static_cast<std::size_t>(tb == Transpose::no ? l * shape.n + j : j * shape.k + l)];
            };
            const double k = static_cast<double>(shape.k);
            std::ostringstream name;
            name << "gemm m=" << shape.m << " n=" << shape.n << " k=" << shape.k << " ta=" << (ta == Transpose::yes)
                 << " tb=" << (tb == Transpose::yes) << " c=" << (c_dtype == DType::f32 ? "f32" : "bf16") << " beta=" << beta;
            const Verdict verdict = compare_within(name.str(), expected, download(d_c, c_dtype).values(), [&](std::size_t index) {
              const std::int64_t i = static_cast<std::int64_t>(index) / shape.n, j = static_cast<std::int64_t>(index) % shape.n;
              double magnitude = 0;
              for (std::int64_t l = 0; l < shape.k; ++l) magnitude += std::fabs(static_cast<double>(a_at(i, l)) * b_at(l, j));
              return 2.0 * (k + 2.0) * kU * (0.5 * magnitude + std::fabs(beta * cv[index])) +
                     store_slack(c_dtype, expected[index]);
            });
            EXPECT_TRUE(verdict.ok) << verdict.report;
          }
        }
      }
    }
  }
}

// The weight gradient's accumulating GEMM (dY^T X, beta = 1 into the fp32 main gradient), once per
// microbatch, on dyadic operands whose products and partial sums are exact in fp32 in any order:
// comparison exact, against the exact value. Each value the main gradient holds needs more than
// bf16's 8 significant bits, so an epilogue that rounds the fp32 result (or reads C) as bf16, or
// a bf16 accumulator, changes every element.
TEST_P(CudaOps, AccumulatingGemmKeepsTheFp32MainGradientExactly) {
  std::mt19937 generator(kSeed);
  const std::int64_t out = 64, in = 48, rows = 32;  // dW [out, in] += dY^T [out, rows] X [rows, in]
  const int microbatches = 2;
  // The main gradient before the first microbatch: +-(21 to 29) plus an odd multiple of 2^-16. A
  // microbatch adds at most rows x (1/2)^2 = 8 in magnitude (operands k/16, |k| <= 8), so every
  // later value lies between 5 and 46 and stays an odd multiple of 2^-16: 19 to 22 bits.
  std::vector<float> initial = dyadic(generator, out * in, 4, 0);  // [out, in]
  for (std::size_t e = 0; e < initial.size(); ++e) {
    const float magnitude = 25.0f + initial[e] + static_cast<float>(2 * (e % 97) + 1) / 65536.0f;
    initial[e] = e % 2 == 0 ? magnitude : -magnitude;
  }
  std::vector<double> want(initial.begin(), initial.end());  // [out, in], exact
  HostArray host_c(DType::f32, initial);
  auto d_c = upload(host_c);
  for (int mb = 0; mb < microbatches; ++mb) {
    const HostArray dy(dtype(), dyadic(generator, rows * out, 8, 4));  // [rows, out]
    const HostArray x(dtype(), dyadic(generator, rows * in, 8, 4));    // [rows, in]
    for (std::int64_t i = 0; i < out; ++i) {
      for (std::int64_t j = 0; j < in; ++j) {
        double sum = 0;  // exact: multiples of 2^-8 below 2^4
        for (std::int64_t r = 0; r < rows; ++r) sum += static_cast<double>(dy.at(r * out + i)) * x.at(r * in + j);
        want[static_cast<std::size_t>(i * in + j)] += sum;
      }
    }
    auto d_dy = upload(dy), d_x = upload(x);
    GemmParams params{out, in, rows, {d_dy.data(), dtype(), Transpose::yes}, {d_x.data(), dtype(), Transpose::no},
                      d_c.data(), DType::f32, 1.0f, 1.0f};
    gpu_->gemm(params);
  }
  const std::vector<float> got = download(d_c, DType::f32).values();
  for (std::size_t e = 0; e < want.size(); ++e) {
    // The inputs are what the comment says: fp32 holds the value, bf16 does not.
    ASSERT_EQ(static_cast<double>(static_cast<float>(want[e])), want[e]) << e;
    ASSERT_NE(static_cast<double>(f32_from_bf16(bf16_from_f32(static_cast<float>(want[e])))), want[e]) << e;
    ASSERT_EQ(static_cast<double>(got[e]), want[e])
        << "element " << e << " of the main gradient after " << microbatches << " microbatches (exact, seed " << kSeed
        << ")";
  }
}

TEST_P(CudaOps, SquaredNormExactOnDyadicValuesAndDeterministic) {
  std::mt19937 generator(kSeed);
  const std::int64_t count = 100003, block_elements = 4096;
  // Squares of k/256 (|k| <= 4096) are exact in double and so are their sums in any order.
  const std::vector<float> values = dyadic(generator, count, 4096, 8);
  std::vector<double> host_sums(static_cast<std::size_t>(squared_norm_blocks(count, block_elements)));
  squared_norm_host({values.data(), host_sums.data(), count, block_elements});
  auto d_values = upload(values);
  Buffer<double> d_sums(*gpu_, static_cast<std::int64_t>(host_sums.size()));
  gpu_->squared_norm({d_values.data(), d_sums.data(), count, block_elements});
  Verdict verdict = compare_bits("squared_norm", as_bytes(host_sums), as_bytes(d_sums.download()), 8);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  // The scalar path (a base 4 bytes past 16-byte alignment, block_elements not a multiple of 4)
  // and the float4 path with the shared-memory staging on blocks of kNormBlockElements: exact too.
  for (const auto& [skip, elements] : {std::pair<std::int64_t, std::int64_t>{1, block_elements},
                                       std::pair<std::int64_t, std::int64_t>{0, 1023},
                                       std::pair<std::int64_t, std::int64_t>{0, kNormBlockElements}}) {
    const std::int64_t part = count - skip;
    std::vector<double> part_host(static_cast<std::size_t>(squared_norm_blocks(part, elements)));
    squared_norm_host({values.data() + skip, part_host.data(), part, elements});
    Buffer<double> part_sums(*gpu_, static_cast<std::int64_t>(part_host.size()));
    gpu_->squared_norm({d_values.data() + skip, part_sums.data(), part, elements});
    verdict = compare_bits("squared_norm skip " + std::to_string(skip) + " block " + std::to_string(elements),
                           as_bytes(part_host), as_bytes(part_sums.download()), 8);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
  // Non-dyadic values: run to run the same bits.
  const std::vector<float> noisy = uniform(generator, count, -3.0f, 3.0f);
  d_values.upload(noisy);
  gpu_->squared_norm({d_values.data(), d_sums.data(), count, block_elements});
  const auto first = d_sums.download();
  gpu_->squared_norm({d_values.data(), d_sums.data(), count, block_elements});
  verdict = compare_bits("squared_norm run to run", as_bytes(first), as_bytes(d_sums.download()), 8);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(CudaOps, AdamwAndScaleAreTheHostsBitForBitAcrossManyDecaySegments) {
  std::mt19937 generator(kSeed);
  // 150 segments (more than one launch's 64) of lengths 1..40, alternating decay.
  std::vector<DecaySegment> segments;
  std::int64_t count = 0;
  for (int s = 0; s < 150; ++s) {
    const std::int64_t length = 1 + (s * 7) % 40;
    segments.push_back({count, length, s % 2 == 0});
    count += length;
  }
  const std::vector<float> params = uniform(generator, count, -1.0f, 1.0f);
  const std::vector<float> grads = uniform(generator, count, -1e-2f, 1e-2f);
  const std::vector<float> m = uniform(generator, count, -1e-3f, 1e-3f);
  std::vector<float> v = uniform(generator, count, 0.0f, 1e-5f);
  AdamwHyper hyper;
  hyper.lr = 3e-4f;
  hyper.weight_decay = 0.1f;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.95f;
  hyper.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
  hyper.one_minus_beta2 = static_cast<float>(1.0 - 0.95);
  hyper.bias_correction1 = static_cast<float>(1.0 - 0.9 * 0.9 * 0.9);  // t = 3
  hyper.bias_correction2 = static_cast<float>(1.0 - 0.95 * 0.95 * 0.95);
  std::vector<float> host_p = params, host_m = m, host_v = v;
  HostArray host_compute(dtype(), count);
  adamw_host({host_p.data(), host_m.data(), host_v.data(), grads.data(),
              dtype() == DType::bf16 ? host_compute.data() : nullptr, dtype(), count, segments.data(),
              static_cast<std::int64_t>(segments.size()), hyper});
  auto d_p = upload(params), d_m = upload(m), d_v = upload(v), d_g = upload(grads);
  Buffer<std::uint8_t> d_compute(*gpu_, count * dtype_bytes(dtype()));
  gpu_->adamw({d_p.data(), d_m.data(), d_v.data(), d_g.data(), dtype() == DType::bf16 ? d_compute.data() : nullptr,
               dtype(), count, segments.data(), static_cast<std::int64_t>(segments.size()), hyper});
  for (const auto& [name, host, device] : {std::tuple{"adamw params", &host_p, &d_p}, std::tuple{"adamw m", &host_m, &d_m},
                                           std::tuple{"adamw v", &host_v, &d_v}}) {
    const Verdict verdict = compare_bits(name, as_bytes(*host), as_bytes(device->download()), 4);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
  if (dtype() == DType::bf16) {
    const Verdict verdict = compare_bits("adamw compute copy", host_compute.bytes, d_compute.download(), 2);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
  // Segments that do not tile the range are refused, as on the host.
  std::vector<DecaySegment> gap = {{0, 3, true}, {4, count - 4, false}};
  EXPECT_THROW(gpu_->adamw({d_p.data(), d_m.data(), d_v.data(), d_g.data(), nullptr, DType::f32, count, gap.data(), 2, hyper}),
               std::invalid_argument);

  std::vector<float> host_scaled = grads;
  scale_host({host_scaled.data(), count, 0.375f});
  gpu_->scale({d_g.data(), count, 0.375f});
  const Verdict verdict = compare_bits("scale", as_bytes(host_scaled), as_bytes(d_g.download()), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

// The cuda lane: the work's ops go to a second stream (the backend's current stream while the
// work is issued), after the ops issued before; a wait orders the ops issued after it behind the
// work; the backend's own stream is back once submit returns.
TEST(StreamLane, WorkRunsOnASecondStreamBetweenTheComputeOpsItIsOrderedWith) {
  if (tandem::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device answers (" << tandem::cuda::device_description(0) << ")";
  const auto gpu = production::make_backend(production::Device::cuda, 0);
  const std::unique_ptr<CommLane> lane = gpu->make_comm_lane(true);
  EXPECT_STREQ(lane->description(), "second cuda stream");
  constexpr std::int64_t kCount = std::int64_t{1} << 22;  // long enough to overlap for real
  std::vector<float> ones(static_cast<std::size_t>(kCount), 1.0f);
  production::Buffer<float> a(*gpu, kCount);
  production::Buffer<float> b(*gpu, kCount);
  production::Buffer<float> sum(*gpu, kCount);
  b.upload(ones);
  void* compute_stream = gpu->cuda_stream();
  // Issued before the work: a = 1 + 1 on the compute stream.
  gpu->add(production::AddParams{b.data(), b.data(), a.data(), kCount, production::DType::f32});
  void* work_stream = nullptr;
  const CommLane::Ticket ticket = lane->submit([&] {
    work_stream = gpu->cuda_stream();
    gpu->add(production::AddParams{a.data(), b.data(), sum.data(), kCount, production::DType::f32});  // 3
  });
  EXPECT_NE(work_stream, compute_stream);
  EXPECT_EQ(gpu->cuda_stream(), compute_stream);
  lane->wait(ticket);
  // Issued after the wait: sum = sum + sum on the compute stream, so 6 only if the work ran first.
  gpu->add(production::AddParams{sum.data(), sum.data(), sum.data(), kCount, production::DType::f32});
  const std::vector<float> out = sum.download();
  std::int64_t wrong = 0;
  for (const float value : out) wrong += value != 6.0f;
  EXPECT_EQ(wrong, 0) << "elements that did not see the compute -> lane -> compute order";
}

}  // namespace
}  // namespace tandem::production
