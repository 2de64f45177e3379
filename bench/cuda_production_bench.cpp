// Benchmarks of the cuda backend's ops, each printed as a ratio against a ceiling measured in the
// same run (docs/PERFORMANCE.md, CUDA section, says how to read them):
//   update    — fused AdamW and the squared-norm partial sums vs a device-to-device copy's
//               bandwidth (bytes read + written; target >= 85%);
//   gemm      — cuBLASLt at the model's linear shapes (forward, input gradient, weight gradient)
//               in TFLOP/s vs a large square bf16 GEMM (8192^3) through the same gemm_cuda;
//   attention — the document-masked attention at seq 8192, head dim 128, bf16 (the tensor-core
//               kernels, attention_tensor_core.cu): one document and a packed mix, TFLOP/s of
//               unmasked work (causal pairs inside documents only) and its ratio to the
//               FlashAttention-2-level target of 300 TFLOP/s forward+backward.
// Usage: cuda_production_bench [update|gemm|attention|all] (default all). Skips with a message and
// exit 0 when no CUDA device answers. Times are medians of repeated runs, each timed on the host
// between two synchronizations of the backend's stream after a warm-up (the launch overhead,
// ~10 us, is inside each time).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "production/backend.hpp"
#include "production/cuda/device.hpp"
#include "production/cuda/gemm_cublaslt.hpp"
#include "production/trainer.hpp"

namespace {

using namespace tandem::production;

// Median seconds of `repeats` runs of `body` after `warmups` untimed ones.
double median_seconds(Backend& gpu, int warmups, int repeats, const std::function<void()>& body) {
  for (int i = 0; i < warmups; ++i) body();
  gpu.synchronize();
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    gpu.synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Random (never zero: METHOD.md) fp32 values from a fixed LCG, uploaded; bf16 when asked.
std::vector<std::uint8_t> random_bytes(std::int64_t count, DType dtype, float amplitude, std::uint64_t seed) {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(count * dtype_bytes(dtype)));
  std::uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (std::int64_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float unit = static_cast<float>(state >> 40) * 0x1p-24f;  // [0, 1)
    store_from_f32(bytes.data(), dtype, i, amplitude * (2.0f * unit - 1.0f));
  }
  return bytes;
}

Buffer<std::uint8_t> random_buffer(Backend& gpu, std::int64_t count, DType dtype, float amplitude, std::uint64_t seed) {
  Buffer<std::uint8_t> buffer(gpu, count * dtype_bytes(dtype));
  buffer.upload(random_bytes(count, dtype, amplitude, seed));
  return buffer;
}

// The device-to-device copy ceiling in bytes/s (read + write), 1 GiB each way.
double copy_bandwidth(Backend& gpu) {
  const std::int64_t bytes = std::int64_t{1} << 30;
  auto source = random_buffer(gpu, bytes / 4, DType::f32, 1.0f, 1);
  Buffer<std::uint8_t> destination(gpu, bytes);
  const double seconds = median_seconds(gpu, 3, 20, [&] { gpu.copy(destination.data(), source.data(), bytes); });
  const double bandwidth = 2.0 * static_cast<double>(bytes) / seconds;
  std::printf("ceiling  device-to-device copy 1 GiB: %.3f ms, %.0f GB/s (read + write)\n", seconds * 1e3, bandwidth / 1e9);
  return bandwidth;
}

void bench_update(Backend& gpu) {
  const double ceiling = copy_bandwidth(gpu);
  const std::int64_t count = std::int64_t{1} << 28;  // 268M parameters: 1 GiB per fp32 array
  auto params = random_buffer(gpu, count, DType::f32, 1.0f, 2);
  auto exp_avg = random_buffer(gpu, count, DType::f32, 1e-3f, 3);
  auto exp_avg_sq = random_buffer(gpu, count, DType::f32, 1e-6f, 4);
  auto grads = random_buffer(gpu, count, DType::f32, 1e-2f, 5);
  Buffer<std::uint8_t> compute(gpu, count * 2);
  // Alternating decay segments as a model's flat buffer has them (a matrix, then a norm).
  std::vector<DecaySegment> segments;
  for (std::int64_t begin = 0; begin < count;) {
    const std::int64_t length = std::min<std::int64_t>(count - begin, segments.size() % 2 == 0 ? 16777216 - 4096 : 4096);
    segments.push_back({begin, length, segments.size() % 2 == 0});
    begin += length;
  }
  AdamwHyper hyper;
  hyper.lr = 1e-4f;
  hyper.weight_decay = 0.1f;
  hyper.bias_correction1 = 0.1f;
  hyper.bias_correction2 = 0.001f;
  AdamwParams adamw{reinterpret_cast<float*>(params.data()), reinterpret_cast<float*>(exp_avg.data()),
                    reinterpret_cast<float*>(exp_avg_sq.data()), reinterpret_cast<const float*>(grads.data()),
                    compute.data(), DType::bf16, count, segments.data(), static_cast<std::int64_t>(segments.size()), hyper};
  const double adamw_seconds = median_seconds(gpu, 2, 10, [&] { gpu.adamw(adamw); });
  const double adamw_bytes = static_cast<double>(count) * (4.0 * 4 + 3.0 * 4 + 2);  // p m v g in; p m v out; bf16 out
  std::printf("adamw    %lld elements, %zu segments, bf16 copy: %.3f ms, %.0f GB/s = %.1f%% of the copy (target >= 85%%)\n",
              static_cast<long long>(count), segments.size(), adamw_seconds * 1e3, adamw_bytes / adamw_seconds / 1e9,
              100.0 * adamw_bytes / adamw_seconds / ceiling);
  // The trainer's block (kNormBlockElements, the shard alignment) first, then larger ones.
  for (const std::int64_t block_elements : {kNormBlockElements, std::int64_t{1} << 16, std::int64_t{1} << 20}) {
    Buffer<double> sums(gpu, squared_norm_blocks(count, block_elements));
    const SquaredNormParams norm{reinterpret_cast<const float*>(grads.data()), sums.data(), count, block_elements};
    const double seconds = median_seconds(gpu, 2, 10, [&] { gpu.squared_norm(norm); });
    const double bytes = static_cast<double>(count) * 4.0;
    std::printf("sq-norm  %lld elements, blocks of %lld: %.3f ms, %.0f GB/s = %.1f%% of the copy (target >= 85%%)\n",
                static_cast<long long>(count), static_cast<long long>(block_elements), seconds * 1e3,
                bytes / seconds / 1e9, 100.0 * bytes / seconds / ceiling);
  }
}

struct GemmCase {
  std::string name;
  std::int64_t m, n, k;
  Transpose ta, tb;
  DType c_dtype;
  float beta;
};

double bench_gemm_case(Backend& gpu, const GemmCase& c, double ceiling) {
  const std::int64_t a_rows = c.m, b_cols = c.n;
  auto a = random_buffer(gpu, a_rows * c.k, DType::bf16, 1.0f, 11);
  auto b = random_buffer(gpu, c.k * b_cols, DType::bf16, 1.0f, 12);
  auto out = random_buffer(gpu, c.m * c.n, c.c_dtype, 1.0f, 13);
  const GemmParams params{c.m, c.n, c.k, {a.data(), DType::bf16, c.ta}, {b.data(), DType::bf16, c.tb},
                          out.data(), c.c_dtype, 1.0f, c.beta};
  const double seconds = median_seconds(gpu, 3, 20, [&] { gpu.gemm(params); });
  const double flops = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) / seconds;
  std::printf("gemm     %-28s m=%-6lld n=%-6lld k=%-6lld %8.3f ms %7.1f TFLOP/s", c.name.c_str(),
              static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k), seconds * 1e3,
              flops / 1e12);
  if (ceiling > 0) std::printf(" = %5.1f%% of the square GEMM", 100.0 * flops / ceiling);
  std::printf("\n");
  return flops;
}

// A Llama-3-8B-like layer (d 4096, F 14336, H 32, G 8, hd 128, V 128256) on 8192 tokens.
double bench_gemm(Backend& gpu) {
  const double ceiling = bench_gemm_case(gpu, {"square bf16->bf16 (ceiling)", 8192, 8192, 8192, Transpose::no, Transpose::no, DType::bf16, 0.0f}, 0.0);
  std::printf("ceiling  square GEMM %.1f TFLOP/s (practical bf16 ceiling ~800 on an H200; datasheet dense 989)\n", ceiling / 1e12);
  const std::int64_t tokens = 8192, d = 4096, f = 14336, qkv = (32 + 2 * 8) * 128, vocab = 128256, chunk = 1024;
  const std::vector<GemmCase> cases = {
      {"qkv forward", tokens, qkv, d, Transpose::no, Transpose::yes, DType::bf16, 0.0f},
      {"qkv input grad", tokens, d, qkv, Transpose::no, Transpose::no, DType::bf16, 0.0f},
      {"qkv weight grad (+= f32)", qkv, d, tokens, Transpose::yes, Transpose::no, DType::f32, 1.0f},
      {"attn out forward", tokens, d, d, Transpose::no, Transpose::yes, DType::bf16, 0.0f},
      {"attn out weight grad", d, d, tokens, Transpose::yes, Transpose::no, DType::f32, 1.0f},
      {"gate|up forward", tokens, f, d, Transpose::no, Transpose::yes, DType::bf16, 0.0f},
      {"gate|up input grad", tokens, d, f, Transpose::no, Transpose::no, DType::bf16, 0.0f},
      {"gate|up weight grad", f, d, tokens, Transpose::yes, Transpose::no, DType::f32, 1.0f},
      {"down forward", tokens, d, f, Transpose::no, Transpose::yes, DType::bf16, 0.0f},
      {"down weight grad", d, f, tokens, Transpose::yes, Transpose::no, DType::f32, 1.0f},
      {"logits chunk forward (f32)", chunk, vocab, d, Transpose::no, Transpose::yes, DType::f32, 0.0f},
      {"logits chunk input grad", chunk, d, vocab, Transpose::no, Transpose::no, DType::bf16, 0.0f},
      {"output weight grad", vocab, d, chunk, Transpose::yes, Transpose::no, DType::f32, 1.0f},
  };
  for (const GemmCase& c : cases) bench_gemm_case(gpu, c, ceiling);
  std::printf("gemm algorithms chosen (%s):\n%s", tandem::cuda::gemm_policy().c_str(), tandem::cuda::gemm_algorithm_log().c_str());
  return ceiling;
}

// docs/PERFORMANCE.md: forward+backward TFLOP/s of unmasked work FlashAttention-2 reaches on H100.
constexpr double kAttentionTargetFlops = 300e12;

void bench_attention(Backend& gpu, double gemm_ceiling) {
  const AttentionShape shape{1, 8192, 32, 8, 128};
  const std::int64_t rows = shape.samples * shape.seq;
  const std::int64_t q_width = shape.heads * shape.head_dim, kv_width = shape.groups * shape.head_dim;
  auto query = random_buffer(gpu, rows * q_width, DType::bf16, 1.0f, 21);
  auto key = random_buffer(gpu, rows * kv_width, DType::bf16, 1.0f, 22);
  auto value = random_buffer(gpu, rows * kv_width, DType::bf16, 1.0f, 23);
  auto context_grad = random_buffer(gpu, rows * q_width, DType::bf16, 1.0f, 24);
  Buffer<std::uint8_t> context(gpu, rows * q_width * 2), dq(gpu, rows * q_width * 2), dk(gpu, rows * kv_width * 2),
      dv(gpu, rows * kv_width * 2);
  Buffer<float> logsumexp(gpu, rows * shape.heads);
  const float scale = static_cast<float>(1.0 / std::sqrt(128.0));
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> layouts = {
      {"one document of 8192", {8192}},
      {"packed 4096+2048+1024+512+256+128+128", {4096, 2048, 1024, 512, 256, 128, 128}},
  };
  for (const auto& [name, documents] : layouts) {
    std::vector<std::int32_t> starts;
    double pairs = 0;  // allowed (t, s) pairs per head: the unmasked work
    for (const std::int64_t length : documents) {
      const auto first = static_cast<std::int32_t>(starts.size());
      for (std::int64_t t = 0; t < length; ++t) starts.push_back(first);
      pairs += static_cast<double>(length) * static_cast<double>(length + 1) / 2.0;
    }
    Buffer<std::int32_t> attention_start(gpu, rows);
    attention_start.upload(starts);
    const AttentionForwardParams forward{query.data(), key.data(), value.data(), attention_start.data(), context.data(),
                                         logsumexp.data(), shape, scale, DType::bf16};
    const AttentionBackwardParams backward{query.data(), key.data(), value.data(), context.data(), logsumexp.data(),
                                           context_grad.data(), attention_start.data(), dq.data(), dk.data(), dv.data(),
                                           shape, scale, DType::bf16};
    const double forward_seconds = median_seconds(gpu, 1, 5, [&] { gpu.attention_forward(forward); });
    const double backward_seconds = median_seconds(gpu, 1, 5, [&] { gpu.attention_backward(backward); });
    // FlashAttention's accounting: forward 2 matrix products (4 hd flops a pair), backward 5 (10 hd).
    const double heads_pairs = pairs * static_cast<double>(shape.heads);
    const double forward_flops = 4.0 * 128.0 * heads_pairs, backward_flops = 10.0 * 128.0 * heads_pairs;
    const double total = (forward_flops + backward_flops) / (forward_seconds + backward_seconds);
    std::printf("attention bf16 tensor cores %-40s fwd %8.3f ms %6.1f TFLOP/s | bwd %8.3f ms %6.1f TFLOP/s | fwd+bwd %6.1f TFLOP/s",
                name.c_str(), forward_seconds * 1e3, forward_flops / forward_seconds / 1e12, backward_seconds * 1e3,
                backward_flops / backward_seconds / 1e12, total / 1e12);
    std::printf(" = %4.2f of the %.0f TFLOP/s target", total / kAttentionTargetFlops, kAttentionTargetFlops / 1e12);
    if (gemm_ceiling > 0) std::printf(", %5.1f%% of the square GEMM", 100.0 * total / gemm_ceiling);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (which != "all" && which != "update" && which != "gemm" && which != "attention") {
    std::fprintf(stderr, "usage: %s [update|gemm|attention|all]\n", argv[0]);
    return 2;
  }
  if (tandem::cuda::device_count() == 0) {
    std::printf("skip: no CUDA device answers (%s); nothing measured\n", tandem::cuda::device_description(0).c_str());
    return 0;
  }
  try {
    const std::unique_ptr<Backend> gpu = make_cuda_backend(0);
    std::printf("device   %s\n", gpu->description().c_str());
    if (which == "all" || which == "update") bench_update(*gpu);
    double gemm_ceiling = 0;
    if (which == "all" || which == "gemm") gemm_ceiling = bench_gemm(*gpu);
    if (which == "all" || which == "attention") bench_attention(*gpu, gemm_ceiling);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
