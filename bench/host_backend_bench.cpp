// How fast the cpu backend is, as ratios on this machine (issue "A cpu backend four times faster
// without changing a bit"):
//   gemm   the shipped host GEMM (register-blocked) and the ordered statement of its arithmetic
//          (the kernel it replaced) at the two models' shapes, in GFLOP/s, against OpenBLAS's
//          single-threaded sgemm as the ceiling (when built with it: Debian's libopenblas-dev);
//   train  a training iteration of the production trainer on the cpu backend, with the shipped
//          kernels and with the ordered ones, for the demo's model (2 layers, d 64, seq 64,
//          16 samples) and a larger one (4 layers, d 256, seq 256, 4 samples): seconds per
//          iteration, tokens/s and the speedup; both runs must end on the same loss bits.
// Run it pinned to one core in an optimized build: `taskset -c 0 build/bench/host_backend_bench`.
//
//   host_backend_bench [gemm|train|all] [--iterations N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef TANDEM_HAVE_CBLAS
#include <cblas.h>
#endif

#include "core/config.hpp"
#include "core/init.hpp"
#include "production/kernels/gemm.hpp"
#include "production/trainer.hpp"
#include "tests/support/synthetic_data.hpp"

namespace tandem {
namespace {

using production::DType;
using production::GemmOperand;
using production::GemmParams;
using production::Transpose;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The best of `repeats` timings of `run` (after one untimed call), in seconds.
template <class Run>
double best_seconds(int repeats, Run&& run) {
  run();
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

struct GemmShape {
  const char* what;
  std::int64_t m, n, k;
  Transpose a, b;
};

void bench_gemm() {
  // The linear layers' three GEMMs (production/model.cpp): forward x W^T, input gradient dY W,
  // weight gradient dY^T x; rows = mbs x seq.
  const std::vector<GemmShape> shapes = {
      {"demo forward  [256 x 64] x [128 x 64]^T", 256, 128, 64, Transpose::no, Transpose::yes},
      {"demo wgrad    [256 x 128]^T x [256 x 64]", 128, 64, 256, Transpose::yes, Transpose::no},
      {"demo logits   [256 x 64] x [384 x 64]^T", 256, 384, 64, Transpose::no, Transpose::yes},
      {"large forward [1024 x 256] x [640 x 256]^T", 1024, 640, 256, Transpose::no, Transpose::yes},
      {"large dgrad   [1024 x 640] x [640 x 256]", 1024, 256, 640, Transpose::no, Transpose::no},
      {"large wgrad   [1024 x 640]^T x [1024 x 256]", 640, 256, 1024, Transpose::yes, Transpose::no},
      {"large logits  [1024 x 256] x [384 x 256]^T", 1024, 384, 256, Transpose::no, Transpose::yes},
  };
#ifdef TANDEM_HAVE_CBLAS
  openblas_set_num_threads(1);
  std::printf("gemm: GFLOP/s on one thread; ceiling: OpenBLAS sgemm (single-threaded)\n");
#else
  std::printf("gemm: GFLOP/s on one thread; no ceiling: built without OpenBLAS (apt-get install libopenblas-dev, "
              "then configure again)\n");
#endif
  std::printf("%-46s %9s %9s %9s %8s %9s\n", "shape", "ordered", "blocked", "openblas", "speedup", "/ceiling");
  for (const GemmShape& shape : shapes) {
    std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k)), b(static_cast<std::size_t>(shape.k * shape.n));
    std::vector<float> c(static_cast<std::size_t>(shape.m * shape.n));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f;
    GemmParams params;
    params.m = shape.m;
    params.n = shape.n;
    params.k = shape.k;
    params.a = GemmOperand{a.data(), DType::f32, shape.a};
    params.b = GemmOperand{b.data(), DType::f32, shape.b};
    params.c = c.data();
    const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
    const double ordered = flops / best_seconds(3, [&] { production::gemm_host_ordered(params); }) / 1e9;
    const double blocked = flops / best_seconds(5, [&] { production::gemm_host(params); }) / 1e9;
    double ceiling = 0.0;
#ifdef TANDEM_HAVE_CBLAS
    const auto lda = static_cast<int>(shape.a == Transpose::no ? shape.k : shape.m);
    const auto ldb = static_cast<int>(shape.b == Transpose::no ? shape.n : shape.k);
    ceiling = flops / best_seconds(5, [&] {
                cblas_sgemm(CblasRowMajor, shape.a == Transpose::no ? CblasNoTrans : CblasTrans,
                            shape.b == Transpose::no ? CblasNoTrans : CblasTrans, static_cast<int>(shape.m),
                            static_cast<int>(shape.n), static_cast<int>(shape.k), 1.0f, a.data(), lda, b.data(), ldb,
                            0.0f, c.data(), static_cast<int>(shape.n));
              }) / 1e9;
#endif
    std::printf("%-46s %9.2f %9.2f %9.2f %7.2fx %9.2f\n", shape.what, ordered, blocked, ceiling, blocked / ordered,
                ceiling > 0 ? blocked / ceiling : 0.0);
  }
}

struct TrainModel {
  const char* what;
  std::int64_t layers, width, heads, ffn, seq, micro_batch, global_batch;
};

RunConfig train_config(const TrainModel& model) {
  RunConfig config;
  config.model.num_layers = model.layers;
  config.model.hidden_size = model.width;
  config.model.num_attention_heads = model.heads;
  config.model.num_query_groups = model.heads;
  config.model.ffn_hidden_size = model.ffn;
  config.model.seq_length = model.seq;
  config.model.vocab_size = 258;
  config.model.padded_vocab_size = 384;
  config.batch.micro_batch_size = model.micro_batch;
  config.batch.global_batch_size = model.global_batch;
  config.schedule.lr = 1e-3;
  config.schedule.lr_warmup_samples = 0;
  config.schedule.train_samples = 1000 * model.global_batch;
  config.schedule.lr_decay_samples = config.schedule.train_samples;
  return config;
}

// Seconds per iteration (the best of `iterations` after one warm-up) and the last loss.
std::pair<double, double> time_training(const RunConfig& config, production::HostKernels kernels, int iterations) {
  testing::StreamSamples samples;
  samples.stream = testing::document_stream({300, 50, 700, 120, 2000, 30, 400}, 256, 3);
  samples.seq_length = config.model.seq_length;
  production::ProductionOptions options;
  options.device = production::Device::cpu;
  options.host_kernels = kernels;
  production::Trainer trainer(config, samples, options);
  double loss = trainer.run_iteration().loss;
  double best = 1e300;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    loss = trainer.run_iteration().loss;
    best = std::min(best, seconds_since(start));
  }
  return {best, loss};
}

int bench_train(int iterations) {
  std::printf("train: seconds per iteration of the production trainer on the cpu backend (best of %d)\n", iterations);
  std::printf("%-44s %10s %10s %11s %8s\n", "model", "ordered s", "fast s", "fast tok/s", "speedup");
  int failures = 0;
  for (const TrainModel& model : {TrainModel{"demo: 2 layers, d 64, seq 64, 16 samples", 2, 64, 4, 128, 64, 4, 16},
                                  TrainModel{"larger: 4 layers, d 256, seq 256, 4 samples", 4, 256, 4, 640, 256, 1, 4}}) {
    const RunConfig config = train_config(model);
    const auto [ordered_seconds, ordered_loss] = time_training(config, production::HostKernels::ordered, iterations);
    const auto [fast_seconds, fast_loss] = time_training(config, production::HostKernels::fast, iterations);
    const double tokens = static_cast<double>(model.global_batch * model.seq);
    std::printf("%-44s %10.4f %10.4f %11.0f %7.2fx\n", model.what, ordered_seconds, fast_seconds, tokens / fast_seconds,
                ordered_seconds / fast_seconds);
    if (std::memcmp(&ordered_loss, &fast_loss, sizeof(double)) != 0) {
      std::printf("error: the two kernels' last losses differ (%.17g vs %.17g): the fast kernels changed a bit\n",
                  ordered_loss, fast_loss);
      ++failures;
    }
  }
  return failures;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  std::string which = "all";
  int iterations = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--iterations" && i + 1 < argc) {
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || value < 1) {
        std::fprintf(stderr, "error: --iterations %s: must be a whole number >= 1\n", argv[i]);
        return 2;
      }
      iterations = static_cast<int>(value);
    } else if (argument == "gemm" || argument == "train" || argument == "all") {
      which = argument;
    } else {
      std::fprintf(stderr, "usage: %s [gemm|train|all] [--iterations N]\n", argv[0]);
      return 2;
    }
  }
  if (which != "train") tandem::bench_gemm();
  if (which != "gemm") return tandem::bench_train(iterations) == 0 ? 0 : 1;
  return 0;
}
