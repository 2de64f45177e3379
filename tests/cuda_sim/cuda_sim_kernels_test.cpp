// The shipped CUDA kernels (production/kernels/*.cu, through their *_cuda entry points) run on
// cuda-sim against their host twins, with the comparison class and bound the device is held to in
// tests/production_cuda_ops_test.cpp (tests/support/op_comparison.hpp): exact where the interface
// promises the host's roundings, within the derived bound elsewhere, and deterministic run to run.
// ctest runs every test in the forward, reverse and a seeded random thread order
// (TANDEM_CUDA_SIM_ORDER), so a kernel that lacks a barrier fails here before it reaches a GPU.
// Device memory is host memory here: cuda-sim has no cudaMalloc yet (docs/CUDA-SIM.md "Not yet").
// Not yet here: attention (its kernels need dynamic shared memory and the tensor-core PTX) and
// the GEMM (cuBLASLt's stand-in).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <tuple>
#include <utility>

#include "production/kernels/cross_entropy.hpp"
#include "production/kernels/elementwise.hpp"
#include "production/kernels/embedding.hpp"
#include "production/kernels/optimizer.hpp"
#include "production/kernels/rmsnorm.hpp"
#include "production/kernels/rope.hpp"
#include "production/kernels/swiglu.hpp"
#include "tests/support/op_comparison.hpp"

namespace tandem::production {
namespace {

using namespace op_comparison;
static_assert(!kSemanticBuild, "cuda-sim's kernels run in fp32, as on the device");

class SimKernels : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    cudaDeviceReset();
    launch_.workspace = workspace_.data();
    launch_.workspace_bytes = static_cast<std::int64_t>(workspace_.size());
  }
  // No kernel faulted: every launch's error is checked by its *_cuda entry point (it throws).
  void TearDown() override { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }
  DType dtype() const { return GetParam(); }
  int element_bytes() const { return static_cast<int>(dtype_bytes(dtype())); }

  std::vector<std::uint8_t> workspace_ = std::vector<std::uint8_t>(1 << 20);
  CudaLaunch launch_;
};

INSTANTIATE_TEST_SUITE_P(Dtypes, SimKernels, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return info.param == DType::f32 ? std::string("f32") : std::string("bf16"); });

TEST_P(SimKernels, ConvertAddBiasAreExactAndBiasGradSumsInTheHostsOrder) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 37, width = 29, count = rows * width;  // not a multiple of a block
  std::vector<float> a = uniform(generator, count, -4.0f, 4.0f);
  a[0] = 1.0f + 0x1p-8f;  // a bf16 tie
  a[1] = std::numeric_limits<float>::quiet_NaN();
  a[2] = std::numeric_limits<float>::infinity();
  a[3] = -0.0f;
  a[4] = 0x1p-130f;
  const HostArray a32(DType::f32, a);
  HostArray host_converted(dtype(), count), sim_converted(dtype(), count);
  convert_host({a32.data(), host_converted.data(), count, DType::f32, dtype()});
  convert_cuda({a32.data(), sim_converted.data(), count, DType::f32, dtype()}, launch_);
  Verdict verdict = compare_bits("convert", host_converted.bytes, sim_converted.bytes, element_bytes());
  EXPECT_TRUE(verdict.ok) << verdict.report;

  const HostArray hb(dtype(), uniform(generator, count, -4.0f, 4.0f)), hbias(dtype(), uniform(generator, width, -1.0f, 1.0f));
  HostArray host_sum(dtype(), uniform(generator, count, -4.0f, 4.0f));
  HostArray sim_sum = host_sum;
  const std::vector<float> initial_bias_grad = uniform(generator, width, -1.0f, 1.0f);
  std::vector<float> host_bias_grad = initial_bias_grad, sim_bias_grad = initial_bias_grad;
  add_host({host_sum.data(), hb.data(), host_sum.data(), count, dtype()});
  bias_add_host({host_sum.data(), hbias.data(), rows, width, dtype()});
  bias_grad_host({host_sum.data(), host_bias_grad.data(), rows, width, dtype()});
  add_cuda({sim_sum.data(), hb.data(), sim_sum.data(), count, dtype()}, launch_);
  bias_add_cuda({sim_sum.data(), hbias.data(), rows, width, dtype()}, launch_);
  bias_grad_cuda({sim_sum.data(), sim_bias_grad.data(), rows, width, dtype()}, launch_);
  verdict = compare_bits("add + bias_add", host_sum.bytes, sim_sum.bytes, element_bytes());
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("bias_grad", as_bytes(host_bias_grad), as_bytes(sim_bias_grad), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(SimKernels, EmbeddingForwardCopiesAndBackwardAddsInTheHostsOrder) {
  std::mt19937 generator(kSeed);
  const std::int64_t vocab = 50, width = 24, rows = 300;  // more rows than a block: the rank kernel's tiles
  std::uniform_int_distribution<std::int32_t> token(0, 9);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows));
  for (auto& t : tokens) t = token(generator) * 5;  // long runs of repeats
  const HostArray table(dtype(), uniform(generator, vocab * width, -1.0f, 1.0f));
  const HostArray output_grad(dtype(), uniform(generator, rows * width, -1.0f, 1.0f));
  const std::vector<float> initial_grad = uniform(generator, vocab * width, -1.0f, 1.0f);
  HostArray host_out(dtype(), rows * width), sim_out(dtype(), rows * width);
  embedding_forward_host({tokens.data(), table.data(), host_out.data(), rows, width, dtype()});
  embedding_forward_cuda({tokens.data(), table.data(), sim_out.data(), rows, width, dtype()}, launch_);
  Verdict verdict = compare_bits("embedding forward", host_out.bytes, sim_out.bytes, element_bytes());
  EXPECT_TRUE(verdict.ok) << verdict.report;
  std::vector<float> host_grad = initial_grad, sim_grad = initial_grad;
  embedding_backward_host({tokens.data(), output_grad.data(), host_grad.data(), rows, width, vocab, dtype()});
  embedding_backward_cuda({tokens.data(), output_grad.data(), sim_grad.data(), rows, width, vocab, dtype()}, launch_);
  verdict = compare_bits("embedding backward", as_bytes(host_grad), as_bytes(sim_grad), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(SimKernels, RopeRotationIsTheHostsBitForBitOnTheSameTable) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 64, head_dim = 16, heads = 3, half = head_dim / 2;
  std::vector<std::int32_t> positions(static_cast<std::size_t>(rows));
  for (std::int64_t t = 0; t < rows; ++t) positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 977) % 9000);
  std::vector<float> host_cos(static_cast<std::size_t>(rows * half)), host_sin(host_cos.size());
  std::vector<float> sim_cos(host_cos.size()), sim_sin(host_cos.size());
  rope_table_host({positions.data(), host_cos.data(), host_sin.data(), rows, head_dim, 10000.0});
  rope_table_cuda({positions.data(), sim_cos.data(), sim_sin.data(), rows, head_dim, 10000.0}, launch_);
  // The same C library's pow, cos and sin on both sides here (the device's own are within the
  // bound production_cuda_ops_test states): the same bits.
  Verdict verdict = compare_bits("rope cosines", as_bytes(host_cos), as_bytes(sim_cos), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("rope sines", as_bytes(host_sin), as_bytes(sim_sin), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  HostArray host_values(dtype(), uniform(generator, rows * heads * head_dim, -2.0f, 2.0f));
  HostArray sim_values = host_values;
  rope_forward_host({host_values.data(), host_cos.data(), host_sin.data(), rows, heads, head_dim, dtype()});
  rope_forward_cuda({sim_values.data(), host_cos.data(), host_sin.data(), rows, heads, head_dim, dtype()}, launch_);
  verdict = compare_bits("rope forward", host_values.bytes, sim_values.bytes, element_bytes());
  EXPECT_TRUE(verdict.ok) << verdict.report;
  rope_backward_host({host_values.data(), host_cos.data(), host_sin.data(), rows, heads, head_dim, dtype()});
  rope_backward_cuda({sim_values.data(), host_cos.data(), host_sin.data(), rows, heads, head_dim, dtype()}, launch_);
  verdict = compare_bits("rope backward", host_values.bytes, sim_values.bytes, element_bytes());
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(SimKernels, SwigluWithinTheBoundOfTwoExpImplementations) {
  std::mt19937 generator(kSeed);
  const std::int64_t count = 4099;
  const HostArray gate(dtype(), uniform(generator, count, -12.0f, 12.0f));
  const HostArray up(dtype(), uniform(generator, count, -3.0f, 3.0f));
  const HostArray hidden_grad(dtype(), uniform(generator, count, -3.0f, 3.0f));
  HostArray host_hidden(dtype(), count), host_gate_grad(dtype(), count), host_up_grad(dtype(), count);
  HostArray sim_hidden(dtype(), count), sim_gate_grad(dtype(), count), sim_up_grad(dtype(), count);
  swiglu_forward_host({gate.data(), up.data(), host_hidden.data(), count, dtype()});
  swiglu_backward_host({gate.data(), up.data(), hidden_grad.data(), host_gate_grad.data(), host_up_grad.data(), count, dtype()});
  swiglu_forward_cuda({gate.data(), up.data(), sim_hidden.data(), count, dtype()}, launch_);
  swiglu_backward_cuda({gate.data(), up.data(), hidden_grad.data(), sim_gate_grad.data(), sim_up_grad.data(), count, dtype()},
                       launch_);
  // The bounds production_cuda_ops_test derives for the device (its expf within 2 ulp): 16u
  // |hidden|, 16 (|g| + 2) u |dh up| for gate_grad, 16u |up_grad| (+ the bf16 straddle).
  const auto g = gate.values(), u = up.values(), dh = hidden_grad.values();
  const std::vector<float> hidden = host_hidden.values(), gate_grad = host_gate_grad.values(), up_grad = host_up_grad.values();
  Verdict verdict = compare_within("swiglu hidden", hidden, sim_hidden.values(), [&](std::size_t i) {
    return 16.0 * kU * std::fabs(hidden[i]) + store_slack(dtype(), hidden[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_within("swiglu gate_grad", gate_grad, sim_gate_grad.values(), [&](std::size_t i) {
    return 16.0 * (std::fabs(g[i]) + 2.0) * kU * std::fabs(dh[i] * u[i]) + store_slack(dtype(), gate_grad[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_within("swiglu up_grad", up_grad, sim_up_grad.values(), [&](std::size_t i) {
    return 16.0 * kU * std::fabs(up_grad[i]) + store_slack(dtype(), up_grad[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(SimKernels, RmsnormForwardExactOnExactSumsAndBackwardWithinTheReductionBound) {
  std::mt19937 generator(kSeed);
  const std::int64_t rows = 100, width = 64;
  // x = k/16, |k| <= 64: the sums of squares are exact in any order (production_cuda_ops_test).
  const HostArray input(dtype(), dyadic(generator, rows * width, 64, 4));
  const HostArray weight(dtype(), dyadic(generator, width, 16, 3));
  const HostArray output_grad(dtype(), dyadic(generator, rows * width, 32, 4));
  const HostArray initial_input_grad(dtype(), dyadic(generator, rows * width, 32, 4));
  HostArray host_out(dtype(), rows * width), sim_out(dtype(), rows * width);
  std::vector<float> host_inverse_rms(static_cast<std::size_t>(rows)), sim_inverse_rms(host_inverse_rms.size());
  rmsnorm_forward_host({input.data(), weight.data(), host_out.data(), host_inverse_rms.data(), rows, width, 1e-5f, dtype()});
  rmsnorm_forward_cuda({input.data(), weight.data(), sim_out.data(), sim_inverse_rms.data(), rows, width, 1e-5f, dtype()},
                       launch_);
  Verdict verdict = compare_bits("rmsnorm inverse_rms", as_bytes(host_inverse_rms), as_bytes(sim_inverse_rms), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
  verdict = compare_bits("rmsnorm forward", host_out.bytes, sim_out.bytes, element_bytes());
  EXPECT_TRUE(verdict.ok) << verdict.report;
  for (const bool accumulate : {false, true}) {
    HostArray host_input_grad = initial_input_grad, sim_input_grad = initial_input_grad;
    std::vector<float> host_weight_grad(static_cast<std::size_t>(width), 0.25f), sim_weight_grad = host_weight_grad;
    rmsnorm_backward_host({input.data(), weight.data(), host_inverse_rms.data(), output_grad.data(), host_input_grad.data(),
                           host_weight_grad.data(), rows, width, accumulate, dtype()});
    rmsnorm_backward_cuda({input.data(), weight.data(), host_inverse_rms.data(), output_grad.data(), sim_input_grad.data(),
                           sim_weight_grad.data(), rows, width, accumulate, dtype()},
                          launch_);
    verdict = compare_bits("rmsnorm input_grad", host_input_grad.bytes, sim_input_grad.bytes, element_bytes());
    EXPECT_TRUE(verdict.ok) << verdict.report << " (accumulate " << accumulate << ")";
    // Two summation orders of the same rounded terms: 2 gamma_{rows+1} (0.25 + sum |dy x r|).
    const std::vector<float> dy = output_grad.values(), x = input.values();
    verdict = compare_within("rmsnorm weight_grad", host_weight_grad, sim_weight_grad, [&](std::size_t j) {
      double magnitude = 0.25;
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::size_t i = static_cast<std::size_t>(row * width) + j;
        magnitude += std::fabs(static_cast<double>(dy[i]) * x[i] * host_inverse_rms[static_cast<std::size_t>(row)]);
      }
      const double n = static_cast<double>(rows + 1);
      return 2.0 * n * kU / (1.0 - n * kU) * magnitude;
    });
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
}

TEST_P(SimKernels, CrossEntropyWithinTheBoundAndMaskedRowsExactlyZero) {
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
  std::vector<float> host_losses(static_cast<std::size_t>(rows)), sim_losses(host_losses.size());
  HostArray host_grad(dtype(), rows * vocab), sim_grad(dtype(), rows * vocab);
  cross_entropy_host({logits.data(), labels.data(), mask.data(), host_losses.data(), host_grad.data(), rows, vocab, loss_scale, dtype()});
  cross_entropy_cuda({logits.data(), labels.data(), mask.data(), sim_losses.data(), sim_grad.data(), rows, vocab, loss_scale, dtype()},
                     launch_);
  // production_cuda_ops_test's bound: the row sums of V terms in two orders, two expf and logf.
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
  Verdict verdict = compare_within("cross-entropy row losses", host_losses, sim_losses, [&](std::size_t r) {
    return lse_bound[r] + 2.0 * kU * std::fabs(host_losses[r]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
  const std::vector<float> host_grad_values = host_grad.values();
  verdict = compare_within("cross-entropy logits_grad", host_grad_values, sim_grad.values(), [&](std::size_t i) {
    const std::size_t r = i / static_cast<std::size_t>(vocab);
    if (mask[r] == 0) return 0.0;  // exactly zero in both
    const double lse = static_cast<double>(host_losses[r]) + logits[r * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(labels[r])];
    const double p = std::exp(static_cast<double>(logits[i]) - lse);
    const double relative = lse_bound[r] + 2.0 * kU * std::fabs(logits[i] - lse) + 6.0 * kU;
    return loss_scale * (p * relative + 4.0 * kU * (p + 1.0)) + store_slack(dtype(), host_grad_values[i]);
  });
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

TEST_P(SimKernels, SquaredNormExactOnDyadicValuesOnTheVectorAndScalarPaths) {
  std::mt19937 generator(kSeed);
  const std::int64_t count = 100003;
  const std::vector<float> values = dyadic(generator, count, 4096, 8);  // squares and sums exact in double
  // alignas(16) storage: the float4 path needs the base aligned as cudaMalloc's is.
  std::vector<float4> aligned(static_cast<std::size_t>((count + 3) / 4 + 1));
  float* base = &aligned[0].x;
  std::copy(values.begin(), values.end(), base);
  // The float4 path, a base 4 bytes past alignment (scalar), blocks not a multiple of 4 (scalar),
  // and blocks of production's kNormBlockElements (gradient_exchange.hpp: 1024, the staged path).
  const std::int64_t norm_block_elements = 1024;
  for (const auto& [skip, elements] : {std::pair<std::int64_t, std::int64_t>{0, 4096}, std::pair<std::int64_t, std::int64_t>{1, 4096},
                                       std::pair<std::int64_t, std::int64_t>{0, 1023},
                                       std::pair<std::int64_t, std::int64_t>{0, norm_block_elements}}) {
    const std::int64_t part = count - skip;
    std::vector<double> host_sums(static_cast<std::size_t>(squared_norm_blocks(part, elements))), sim_sums(host_sums.size());
    squared_norm_host({base + skip, host_sums.data(), part, elements});
    squared_norm_cuda({base + skip, sim_sums.data(), part, elements}, launch_);
    const Verdict verdict = compare_bits("squared_norm skip " + std::to_string(skip) + " block " + std::to_string(elements),
                                         as_bytes(host_sums), as_bytes(sim_sums), 8);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
}

TEST_P(SimKernels, AdamwAndScaleAreTheHostsBitForBitAcrossManyDecaySegments) {
  std::mt19937 generator(kSeed);
  std::vector<DecaySegment> segments;  // 150 segments (more than one launch's 64), alternating decay
  std::int64_t count = 0;
  for (int s = 0; s < 150; ++s) {
    const std::int64_t length = 1 + (s * 7) % 40;
    segments.push_back({count, length, s % 2 == 0});
    count += length;
  }
  const std::vector<float> params = uniform(generator, count, -1.0f, 1.0f);
  const std::vector<float> grads = uniform(generator, count, -1e-2f, 1e-2f);
  const std::vector<float> m = uniform(generator, count, -1e-3f, 1e-3f);
  const std::vector<float> v = uniform(generator, count, 0.0f, 1e-5f);
  AdamwHyper hyper;
  hyper.lr = 3e-4f;
  hyper.weight_decay = 0.1f;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.95f;
  hyper.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
  hyper.one_minus_beta2 = static_cast<float>(1.0 - 0.95);
  hyper.bias_correction1 = static_cast<float>(1.0 - 0.9 * 0.9 * 0.9);  // t = 3
  hyper.bias_correction2 = static_cast<float>(1.0 - 0.95 * 0.95 * 0.95);
  std::vector<float> host_p = params, host_m = m, host_v = v, sim_p = params, sim_m = m, sim_v = v;
  HostArray host_compute(dtype(), count), sim_compute(dtype(), count);
  const bool copy = dtype() == DType::bf16;
  adamw_host({host_p.data(), host_m.data(), host_v.data(), grads.data(), copy ? host_compute.data() : nullptr, dtype(), count,
              segments.data(), static_cast<std::int64_t>(segments.size()), hyper});
  adamw_cuda({sim_p.data(), sim_m.data(), sim_v.data(), grads.data(), copy ? sim_compute.data() : nullptr, dtype(), count,
              segments.data(), static_cast<std::int64_t>(segments.size()), hyper},
             launch_);
  for (const auto& [name, host, sim] : {std::tuple{"adamw params", &host_p, &sim_p}, std::tuple{"adamw m", &host_m, &sim_m},
                                        std::tuple{"adamw v", &host_v, &sim_v}}) {
    const Verdict verdict = compare_bits(name, as_bytes(*host), as_bytes(*sim), 4);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
  if (copy) {
    const Verdict verdict = compare_bits("adamw compute copy", host_compute.bytes, sim_compute.bytes, 2);
    EXPECT_TRUE(verdict.ok) << verdict.report;
  }
  std::vector<float> host_scaled = grads, sim_scaled = grads;
  scale_host({host_scaled.data(), count, 0.375f});
  scale_cuda({sim_scaled.data(), count, 0.375f}, launch_);
  const Verdict verdict = compare_bits("scale", as_bytes(host_scaled), as_bytes(sim_scaled), 4);
  EXPECT_TRUE(verdict.ok) << verdict.report;
}

}  // namespace
}  // namespace tandem::production
