// Benchmarks of the cuda backend's ops, each printed as a ratio against a ceiling measured in the
// same run (docs/PERFORMANCE.md, CUDA section, says how to read them):
//   update    — fused AdamW and the squared-norm partial sums vs a device-to-device copy's
//               bandwidth (bytes read + written; target >= 85%);
//   gemm      — cuBLASLt at the model's linear shapes (forward, input gradient, weight gradient)
//               in TFLOP/s vs a large square bf16 GEMM (8192^3) through the same gemm_cuda;
//   attention — the document-masked attention at seq 8192, head dim 128, bf16 (the tensor-core
//               kernels, attention_tensor_core.cu): one document and a packed mix, TFLOP/s of
//               unmasked work (causal pairs inside documents only) and its ratio to the
//               FlashAttention-2-level target of 300 TFLOP/s forward+backward;
//   train     — the production Trainer end to end, not an op: on cuda a ~1B Llama-style model at
//               seq 8192 in bf16 on packed synthetic documents, tokens/s, model TFLOP/s (the
//               records' FLOP convention, docs/PRODUCTION.md "Throughput"), MFU against the
//               backend's peak (target 40%) and the ratio to the square GEMM of the same run, and
//               the device memory it held; with --device cpu the production tests' tiny model on
//               the cpu backend against the host GEMM's FLOP/s (so CI runs this mode too). Any
//               `tandem train` option after the mode overrides the preset (the last value wins).
// Usage: cuda_production_bench [update|gemm|attention|all] (default all: every op benchmark)
//        cuda_production_bench train [--device cuda|cpu] [--warmups N] [--iterations N] [options]
// Skips with a message and exit 0 when no CUDA device answers (train --device cpu always runs).
// Op times are medians of repeated runs, each timed on the host between two synchronizations of
// the backend's stream after a warm-up (the launch overhead, ~10 us, is inside each time); train
// times are the iteration records' own (the trainer synchronizes before it stops its clock).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/run_options.hpp"
#include "core/args.hpp"
#include "core/model_layout.hpp"
#include "production/backend.hpp"
#include "production/cuda/device.hpp"
#include "production/cuda/gemm_cublaslt.hpp"
#include "production/trainer.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace {

using namespace tandem;
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
  DType ab_dtype = DType::bf16;  // both inputs
  int warmups = 3;               // untimed runs, then the median of `repeats`
  int repeats = 20;
};

double bench_gemm_case(Backend& gpu, const GemmCase& c, double ceiling) {
  const std::int64_t a_rows = c.m, b_cols = c.n;
  auto a = random_buffer(gpu, a_rows * c.k, c.ab_dtype, 1.0f, 11);
  auto b = random_buffer(gpu, c.k * b_cols, c.ab_dtype, 1.0f, 12);
  auto out = random_buffer(gpu, c.m * c.n, c.c_dtype, 1.0f, 13);
  const GemmParams params{c.m, c.n, c.k, {a.data(), c.ab_dtype, c.ta}, {b.data(), c.ab_dtype, c.tb},
                          out.data(), c.c_dtype, 1.0f, c.beta};
  const double seconds = median_seconds(gpu, c.warmups, c.repeats, [&] { gpu.gemm(params); });
  const double flops = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) / seconds;
  std::printf("gemm     %-28s m=%-6lld n=%-6lld k=%-6lld %8.3f ms %7.1f TFLOP/s", c.name.c_str(),
              static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k), seconds * 1e3,
              flops / 1e12);
  if (ceiling > 0) std::printf(" = %5.1f%% of the square GEMM", 100.0 * flops / ceiling);
  std::printf("\n");
  return flops;
}

// The practical GEMM ceiling in FLOP/s: the square 8192^3 bf16 GEMM through the same gemm_cuda
// the model's GEMMs take.
double square_gemm_ceiling(Backend& gpu) {
  const double ceiling = bench_gemm_case(gpu, {"square bf16->bf16 (ceiling)", 8192, 8192, 8192, Transpose::no, Transpose::no, DType::bf16, 0.0f}, 0.0);
  std::printf("ceiling  square GEMM %.1f TFLOP/s (practical bf16 ceiling ~800 on an H200; datasheet dense 989)\n", ceiling / 1e12);
  return ceiling;
}

// A Llama-3-8B-like layer (d 4096, F 14336, H 32, G 8, hd 128, V 128256) on 8192 tokens.
double bench_gemm(Backend& gpu) {
  const double ceiling = square_gemm_ceiling(gpu);
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

// --- train: the production Trainer end to end (docs/PERFORMANCE.md "End-to-end MFU") ---

// The issue's MFU model: TinyLlama-1.1B's widths (d 2048, F 5632, 22 layers, vocabulary 32,000)
// with 16 heads of 128 in 4 groups, at sequence 8192.
ModelConfig one_billion_model() {
  ModelConfig model;
  model.num_layers = 22;
  model.hidden_size = 2048;
  model.ffn_hidden_size = 5632;
  model.num_attention_heads = 16;
  model.num_query_groups = 4;
  model.vocab_size = 32000;  // a multiple of 128: the padded vocabulary is the same
  model.seq_length = 8192;
  return model;
}

// What one train benchmark runs.
struct TrainBench {
  Device device = Device::cuda;
  int warmups = 2;      // untimed iterations first (cuBLASLt's algorithm choices, first touches)
  int iterations = 5;   // timed iterations; the summary is their median
  std::vector<std::string> run_arguments;  // `tandem train` options after the preset (the last wins)
};

// A model as `tandem train` options, so the benchmark's run is built and validated by the code
// that builds the command line's (core/args.hpp build_run_config), and any option can override.
std::vector<std::string> model_arguments(const ModelConfig& model) {
  const auto text = [](std::int64_t value) { return std::to_string(value); };
  return {"--num-layers", text(model.num_layers), "--hidden-size", text(model.hidden_size),
          "--ffn-hidden-size", text(model.ffn_hidden_size), "--num-attention-heads",
          text(model.num_attention_heads), "--group-query-attention", "--num-query-groups",
          text(model.num_query_groups), "--vocab-size", text(model.vocab_size), "--seq-length",
          text(model.seq_length)};
}

// The preset of `device`, then the user's options, then the iteration count the run needs.
std::vector<std::string> train_arguments(const TrainBench& bench) {
  std::vector<std::string> arguments;
  if (bench.device == Device::cuda) {
    arguments = model_arguments(one_billion_model());
    for (const char* option : {"--micro-batch-size", "1", "--global-batch-size", "4", "--bf16"}) arguments.emplace_back(option);
  } else {
    // The production tests' tiny model, the configuration their bounds verify on this backend.
    arguments = model_arguments(testing::tiny_production_model());
    for (const char* option : {"--micro-batch-size", "2", "--global-batch-size", "8"}) arguments.emplace_back(option);
  }
  for (const char* option : {"--lr", "3e-4", "--min-lr", "3e-5", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine",
                             "--clip-grad", "1.0", "--weight-decay", "0.1", "--adam-beta2", "0.95"}) {
    arguments.emplace_back(option);
  }
  arguments.insert(arguments.end(), bench.run_arguments.begin(), bench.run_arguments.end());
  arguments.emplace_back("--train-iters");
  arguments.push_back(std::to_string(bench.warmups + bench.iterations));
  return arguments;
}

// Throws CLI::ParseError or ConfigError (main prints them and exits 2).
// Packed windows for the cuda run: a repeating stream of documents of mixed lengths (EOD
// included), cut by concat packing (SPEC 2), so each window holds several documents and the
// document-masked attention runs. Ids are drawn from the whole vocabulary: EOD (256) and pad (257)
// also occur by chance, about once per 16,000 tokens; the counts printed come from the samples.
testing::StreamSamples packed_samples(const ModelConfig& model) {
  testing::StreamSamples samples;
  samples.stream = testing::document_stream({3000, 1500, 700, 5200, 260, 2200, 900, 120, 4100, 1800, 60, 2600, 1100, 400},
                                            static_cast<std::int32_t>(model.vocab_size), 1);
  samples.seq_length = model.seq_length;
  return samples;
}

// Documents per window (positions where one starts: attention_start[t] == t) and the unmasked
// attention pairs as a share of a causal window's seq (seq + 1) / 2, over the windows a run reads.
void print_data_mix(const SampleProvider& samples, std::int64_t windows, std::int64_t seq) {
  std::int64_t fewest = std::numeric_limits<std::int64_t>::max(), most = 0;
  double pairs = 0;
  for (std::int64_t index = 0; index < windows; ++index) {
    const Sample sample = samples(index);
    std::int64_t documents = 0;
    for (std::size_t t = 0; t < sample.attention_start.size(); ++t) {
      documents += sample.attention_start[t] == static_cast<std::int32_t>(t) ? 1 : 0;
      pairs += static_cast<double>(static_cast<std::int64_t>(t) - sample.attention_start[t] + 1);
    }
    fewest = std::min(fewest, documents);
    most = std::max(most, documents);
  }
  const double causal = static_cast<double>(windows) * static_cast<double>(seq) * static_cast<double>(seq + 1) / 2.0;
  std::printf("data     %lld synthetic packed windows: %lld-%lld documents each, unmasked attention pairs %.1f%% of causal\n",
              static_cast<long long>(windows), static_cast<long long>(fewest), static_cast<long long>(most),
              100.0 * pairs / causal);
}

// Peak resident memory of this process (VmHWM in /proc/self/status), bytes; 0 when unreadable.
std::int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  }
  return 0;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// The issue's end-to-end target, and what Megatron-class systems reach (docs/PERFORMANCE.md).
constexpr double kMfuTarget = 0.40;

// The median (of an even count, the mean of the middle two).
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2.0;
}

// Trains `config` on `samples` for the warm-up and timed iterations and prints each record and the
// medians; `ceiling` is the square GEMM's FLOP/s measured on the same device in this run.
// "22 layers, d 2048, ...: 1123117056 parameters; bf16 compute, global batch 4 as 4 microbatches of 1".
std::string describe_run(const RunConfig& config) {
  const ModelConfig& model = config.model;
  char text[512];
  std::snprintf(text, sizeof(text),
                "%lld layers, d %lld, ffn %lld, %lld heads of %lld in %lld groups, vocabulary %lld, seq %lld: "
                "%lld parameters; %s compute, global batch %lld as %lld microbatches of %lld",
                static_cast<long long>(model.num_layers), static_cast<long long>(model.hidden_size),
                static_cast<long long>(model.ffn_hidden_size), static_cast<long long>(model.num_attention_heads),
                static_cast<long long>(model.head_dim()), static_cast<long long>(model.num_query_groups),
                static_cast<long long>(model.padded_vocab_size), static_cast<long long>(model.seq_length),
                static_cast<long long>(make_model_layout(model).total_elements), config.optimizer.bf16 ? "bf16" : "fp32",
                static_cast<long long>(config.batch.global_batch_size),
                static_cast<long long>(config.microbatches_per_replica()),
                static_cast<long long>(config.batch.micro_batch_size));
  return text;
}

void run_train(const TrainBench& bench, const RunConfig& config, const SampleProvider& samples, double ceiling) {
  const ModelLayout layout = make_model_layout(config.model);
  const ModelConfig& model = config.model;
  std::printf("config   %s\n", nlohmann::json(config).dump().c_str());
  std::printf("model    %s\n", describe_run(config).c_str());
  print_data_mix(samples, (bench.warmups + bench.iterations) * config.batch.global_batch_size, model.seq_length);

  const bool cuda = bench.device == Device::cuda;
  const std::int64_t used_before = cuda ? tandem::cuda::device_memory(0).used_bytes() : 0;
  ProductionOptions options;
  options.device = bench.device;
  const auto constructing = std::chrono::steady_clock::now();
  Trainer trainer(config, samples, options);
  trainer.backend().synchronize();
  const double construction_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - constructing).count();
  const std::int64_t used_built = cuda ? tandem::cuda::device_memory(0).used_bytes() : 0;
  std::printf("train    trainer built in %.1f s (the host draws every initial weight, SPEC 4)\n", construction_seconds);
  const double peak = trainer.backend().peak_flops_per_second(trainer.compute_dtype());

  std::vector<double> tokens_per_second, model_flops_per_second, mfu;
  for (int i = 0; i < bench.warmups + bench.iterations; ++i) {
    const IterationRecord record = trainer.run_iteration();
    const bool timed = i >= bench.warmups;
    const double flops_per_second = record.model_flops.value_or(0.0) / record.seconds;
    std::printf("train    iteration %lld (%s) loss %.4f | %.3f s | %.0f tokens/s | %.3g model TFLOP/s",
                static_cast<long long>(record.iteration), timed ? "timed" : "warm-up", record.loss, record.seconds,
                record.tokens_per_second, flops_per_second / 1e12);
    if (record.mfu) std::printf(" | MFU %.1f%%", 100.0 * *record.mfu);
    std::printf(" | %.3f of the square GEMM\n", flops_per_second / ceiling);
    if (!timed) continue;
    tokens_per_second.push_back(record.tokens_per_second);
    model_flops_per_second.push_back(flops_per_second);
    if (record.mfu) mfu.push_back(*record.mfu);
  }

  nlohmann::json summary = {{"device", to_string(bench.device)},
                            {"description", trainer.backend().description()},
                            {"parameters", layout.total_elements},
                            {"num_layers", model.num_layers},
                            {"seq_length", model.seq_length},
                            {"global_batch_size", config.batch.global_batch_size},
                            {"micro_batch_size", config.batch.micro_batch_size},
                            {"compute", config.optimizer.bf16 ? "bf16" : "fp32"},
                            {"timed_iterations", bench.iterations},
                            {"median_tokens_per_second", median(tokens_per_second)},
                            {"median_model_flops_per_second", median(model_flops_per_second)},
                            {"gemm_ceiling_flops_per_second", ceiling},
                            {"median_ratio_to_gemm", median(model_flops_per_second) / ceiling},
                            {"median_mfu", nullptr},
                            {"peak_flops_per_second", nullptr},
                            {"mfu_target", kMfuTarget}};
  std::printf("train    median of %d timed iterations: %.0f tokens/s | %.3g model TFLOP/s | %.3f of the square GEMM's %.3g TFLOP/s",
              bench.iterations, median(tokens_per_second), median(model_flops_per_second) / 1e12,
              median(model_flops_per_second) / ceiling, ceiling / 1e12);
  if (!mfu.empty()) {
    summary["median_mfu"] = median(mfu);
    summary["peak_flops_per_second"] = peak;
    std::printf(" | MFU %.1f%% of the %.0f TFLOP/s peak (target %.0f%%; Megatron-class 45-48%%)\n", 100.0 * median(mfu),
                peak / 1e12, 100.0 * kMfuTarget);
  } else {
    std::printf(" | MFU: none (this backend reports no peak)\n");
  }
  if (cuda) {
    const tandem::cuda::DeviceMemory after = tandem::cuda::device_memory(0);
    // Every buffer is cudaMalloc'd when the trainer is built (no caching allocator, cuBLASLt's
    // workspace fixed), so what is held after the iterations is the run's peak.
    std::printf("memory   device: %.2f GiB used before the trainer, %.2f GiB once built, %.2f GiB after the iterations "
                "(the trainer's peak: %.2f GiB) of %.2f GiB\n",
                static_cast<double>(used_before) / kGiB, static_cast<double>(used_built) / kGiB,
                static_cast<double>(after.used_bytes()) / kGiB,
                static_cast<double>(std::max(used_built, after.used_bytes()) - used_before) / kGiB,
                static_cast<double>(after.total_bytes) / kGiB);
    summary["device_memory_peak_bytes"] = std::max(used_built, after.used_bytes()) - used_before;
    summary["device_memory_total_bytes"] = after.total_bytes;
  }
  std::printf("memory   host: peak resident %.2f GiB\n", static_cast<double>(peak_resident_bytes()) / kGiB);
  summary["host_peak_resident_bytes"] = peak_resident_bytes();
  std::printf("train-json %s\n", summary.dump().c_str());
}

bool out_of_device_memory(const std::exception& error) {
  return std::string(error.what()).find("cudaErrorMemoryAllocation") != std::string::npos;
}

// The train mode: the square GEMM ceiling of the device, then the run; on cuda a model that does
// not fit is said so and retried with half the layers (printed: the figures are of what ran).
int bench_train(TrainBench bench) {
  RunConfig config = tandem::bench::run_config_from_options(train_arguments(bench), "cuda_production_bench train");  // validated even where nothing runs
  if (bench.device == Device::cuda && tandem::cuda::device_count() == 0) {
    std::printf("skip: no CUDA device answers (%s); nothing measured (it would train %s)\n",
                tandem::cuda::device_description(0).c_str(), describe_run(config).c_str());
    return 0;
  }
  double ceiling = 0;
  {
    const std::unique_ptr<Backend> backend = make_backend(bench.device, 0);
    std::printf("device   %s\n", backend->description().c_str());
    if (bench.device == Device::cuda) {
      ceiling = square_gemm_ceiling(*backend);
    } else {
      // The host twin's plain loops peak where the panels sit in cache, which depends on the
      // size: the ceiling is the fastest of a few squares in the run's compute type.
      const DType dtype = config.optimizer.bf16 ? DType::bf16 : DType::f32;
      for (const std::int64_t size : {32, 64, 128, 256}) {
        const GemmCase square{"square host", size, size, size, Transpose::no, Transpose::no, dtype, 0.0f, dtype, 2, 20};
        ceiling = std::max(ceiling, bench_gemm_case(*backend, square, 0.0));
      }
      std::printf("ceiling  the fastest square host GEMM: %.3g GFLOP/s\n", ceiling / 1e9);
    }
  }
  testing::StreamSamples tiny = testing::tiny_production_samples();
  tiny.seq_length = config.model.seq_length;  // follows a --seq-length override
  const SampleProvider samples = bench.device == Device::cuda ? SampleProvider(packed_samples(config.model)) : SampleProvider(tiny);
  for (;;) {
    try {
      run_train(bench, config, samples, ceiling);
      return 0;
    } catch (const std::runtime_error& error) {
      if (!out_of_device_memory(error) || config.model.num_layers == 1) throw;
      const std::int64_t fewer = config.model.num_layers / 2;
      std::printf("train    DOES NOT FIT: %lld layers: %s\n"
                  "train    falling back to %lld layers: every figure below is of that smaller model\n",
                  static_cast<long long>(config.model.num_layers), error.what(), static_cast<long long>(fewer));
      bench.run_arguments.emplace_back("--num-layers");
      bench.run_arguments.push_back(std::to_string(fewer));
      config = tandem::bench::run_config_from_options(train_arguments(bench), "cuda_production_bench train");
    }
  }
}

}  // namespace

// "train [--device cuda|cpu] [--warmups N] [--iterations N] [tandem train options...]".
int train_main(int argc, char** argv) {
  TrainBench bench;
  bool iterations_given = false;
  for (int i = 2; i < argc; ++i) {
    const std::string argument = argv[i];
    const bool has_value = i + 1 < argc;
    if (argument == "--device" && has_value) {
      const std::string device = argv[++i];
      if (device != "cuda" && device != "cpu") {
        std::fprintf(stderr, "error: --device = %s: the train benchmark runs on cuda or cpu; fix: --device cuda or --device cpu\n", device.c_str());
        return 2;
      }
      bench.device = device == "cuda" ? Device::cuda : Device::cpu;
    } else if ((argument == "--iterations" || argument == "--warmups") && has_value) {
      const std::string text = argv[++i];
      const int least = argument == "--iterations" ? 1 : 0;
      int value = -1;
      const auto [end, failure] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (failure != std::errc() || end != text.data() + text.size() || value < least) {
        std::fprintf(stderr, "error: %s = %s: must be an integer >= %d; fix: e.g. %s %d\n", argument.c_str(),
                     text.c_str(), least, argument.c_str(), least + 2);
        return 2;
      }
      (argument == "--iterations" ? bench.iterations : bench.warmups) = value;
      iterations_given = iterations_given || argument == "--iterations";
    } else {
      bench.run_arguments.push_back(argument);  // a `tandem train` option
    }
  }
  if (bench.device == Device::cpu && !iterations_given) bench.iterations = 20;  // milliseconds each
  try {
    return bench_train(bench);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 2;
  } catch (const ConfigError& error) {
    std::fprintf(stderr, "%s\n", format_issues(error.issues()).c_str());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (which == "train") return train_main(argc, argv);
  if (which != "all" && which != "update" && which != "gemm" && which != "attention") {
    std::fprintf(stderr, "usage: %s [update|gemm|attention|all]\n"
                         "       %s train [--device cuda|cpu] [--warmups N] [--iterations N] [tandem train options...]\n",
                 argv[0], argv[0]);
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
