// How fast the cpu backend is, as ratios measured side by side on this machine (issues "A cpu
// backend four times faster without changing a bit" and 28):
//   gemm   the shipped host GEMM (register-blocked) on each vector path the processor has
//          (baseline, avx2, avx512) beside the ordered statement of its arithmetic (the kernel it
//          replaced) at the two models' shapes, in GFLOP/s, against OpenBLAS's single-threaded
//          sgemm as the ceiling (when built with it: Debian's libopenblas-dev);
//   train  a training iteration of the production trainer on the cpu backend: the ordered
//          kernels, the shipped ones on 1 thread and on --threads N (default 2), for the demo's
//          model (2 layers, d 64, seq 64, 16 samples) and a larger one (4 layers, d 256, seq 256,
//          4 samples): seconds per iteration, tokens/s and the ratios; every run must end on the
//          same loss bits. With --pytorch, the same models, loop and shapes in PyTorch fp32
//          (bench/torch_train_step.py, Debian's python3-torch) on 1 and N threads beside them;
//   guard  what CI runs (ctest HostKernelsBeatTheOrderedOnes): every blocked GEMM path at every
//          shape, and the demo's training iteration, against the ordered kernels, timed in turns;
//          exits 1 when a shipped kernel is slower than the one it replaces.
// bench/cpu_bench.sh runs it as docs/PERFORMANCE.md reports it (pinned, with OpenBLAS for torch).
//
//   host_backend_bench [gemm|train|guard|all] [--iterations N] [--threads N] [--pytorch]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef TANDEM_HAVE_CBLAS
#include <cblas.h>
#endif

#include "core/config.hpp"
#include "core/init.hpp"
#include "production/kernels/gemm.hpp"
#include "production/kernels/host_workers.hpp"
#include "production/trainer.hpp"
#include "tests/support/synthetic_data.hpp"

namespace tandem {
namespace {

using production::DType;
using production::GemmOperand;
using production::GemmParams;
using production::HostSimd;
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

// The processor's name (/proc/cpuinfo's "model name"), the build type and the vector path taken.
void print_machine() {
  std::string cpu = "unknown processor";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::string paths;
  for (const HostSimd simd : production::kHostSimds) {
    if (production::host_gemm_has(simd)) paths += std::string(paths.empty() ? "" : ", ") + production::host_simd_name(simd);
  }
  std::printf("machine: %s, %d usable CPUs; build type %s; vector paths %s; shipped path %s\n", cpu.c_str(),
              production::usable_cpu_count(), TANDEM_BUILD_TYPE, paths.c_str(),
              production::host_simd_name(production::host_simd()));
}

struct GemmShape {
  const char* what;
  std::int64_t m, n, k;
  Transpose a, b;
};

// The linear layers' three GEMMs (production/model.cpp): forward x W^T, input gradient dY W,
// weight gradient dY^T x; rows = mbs x seq.
const std::vector<GemmShape>& gemm_shapes() {
  static const std::vector<GemmShape> shapes = {
      {"demo forward  [256 x 64] x [128 x 64]^T", 256, 128, 64, Transpose::no, Transpose::yes},
      {"demo wgrad    [256 x 128]^T x [256 x 64]", 128, 64, 256, Transpose::yes, Transpose::no},
      {"demo logits   [256 x 64] x [384 x 64]^T", 256, 384, 64, Transpose::no, Transpose::yes},
      {"large forward [1024 x 256] x [640 x 256]^T", 1024, 640, 256, Transpose::no, Transpose::yes},
      {"large dgrad   [1024 x 640] x [640 x 256]", 1024, 256, 640, Transpose::no, Transpose::no},
      {"large wgrad   [1024 x 640]^T x [1024 x 256]", 640, 256, 1024, Transpose::yes, Transpose::no},
      {"large logits  [1024 x 256] x [384 x 256]^T", 1024, 384, 256, Transpose::no, Transpose::yes},
  };
  return shapes;
}

// A shape's operands (deterministic values in [-0.5, 0.5)) and its parameters.
struct GemmCase {
  std::vector<float> a, b, c;
  GemmParams params;
  double flops = 0;
  explicit GemmCase(const GemmShape& shape)
      : a(static_cast<std::size_t>(shape.m * shape.k)), b(static_cast<std::size_t>(shape.k * shape.n)),
        c(static_cast<std::size_t>(shape.m * shape.n)) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f;
    params.m = shape.m;
    params.n = shape.n;
    params.k = shape.k;
    params.a = GemmOperand{a.data(), DType::f32, shape.a};
    params.b = GemmOperand{b.data(), DType::f32, shape.b};
    params.c = c.data();
    flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
  }
};

void bench_gemm() {
#ifdef TANDEM_HAVE_CBLAS
  openblas_set_num_threads(1);
  std::printf("gemm: GFLOP/s on one thread; ceiling: OpenBLAS sgemm (single-threaded, with FMA)\n");
#else
  std::printf("gemm: GFLOP/s on one thread; no ceiling: built without OpenBLAS (apt-get install libopenblas-dev, "
              "then configure again)\n");
#endif
  std::printf("%-46s %8s %9s %9s %9s %9s %8s %9s\n", "shape", "ordered", "baseline", "avx2", "avx512", "openblas",
              "speedup", "/ceiling");
  for (const GemmShape& shape : gemm_shapes()) {
    GemmCase gemm(shape);
    const GemmParams& params = gemm.params;
    const double ordered = gemm.flops / best_seconds(3, [&] { production::gemm_host_ordered(params); }) / 1e9;
    double paths[3] = {0, 0, 0};
    for (const HostSimd simd : production::kHostSimds) {
      if (!production::host_gemm_has(simd)) continue;
      paths[static_cast<int>(simd)] =
          gemm.flops / best_seconds(5, [&] { production::gemm_host_with(params, simd); }) / 1e9;
    }
    const double shipped = paths[static_cast<int>(production::host_simd())];
    double ceiling = 0.0;
#ifdef TANDEM_HAVE_CBLAS
    const auto lda = static_cast<int>(shape.a == Transpose::no ? shape.k : shape.m);
    const auto ldb = static_cast<int>(shape.b == Transpose::no ? shape.n : shape.k);
    ceiling = gemm.flops / best_seconds(5, [&] {
                cblas_sgemm(CblasRowMajor, shape.a == Transpose::no ? CblasNoTrans : CblasTrans,
                            shape.b == Transpose::no ? CblasNoTrans : CblasTrans, static_cast<int>(shape.m),
                            static_cast<int>(shape.n), static_cast<int>(shape.k), 1.0f, gemm.a.data(), lda,
                            gemm.b.data(), ldb, 0.0f, gemm.c.data(), static_cast<int>(shape.n));
              }) / 1e9;
#endif
    std::printf("%-46s %8.2f %9.2f %9.2f %9.2f %9.2f %7.2fx %9.2f\n", shape.what, ordered, paths[0], paths[1],
                paths[2], ceiling, shipped / ordered, ceiling > 0 ? shipped / ceiling : 0.0);
  }
}

struct TrainModel {
  const char* name;  // as bench/torch_train_step.py names it
  const char* what;
  std::int64_t layers, width, heads, ffn, seq, micro_batch, global_batch;
};

const TrainModel kDemo{"demo", "demo: 2 layers, d 64, seq 64, 16 samples", 2, 64, 4, 128, 64, 4, 16};
const TrainModel kLarger{"larger", "larger: 4 layers, d 256, seq 256, 4 samples", 4, 256, 4, 640, 256, 1, 4};

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

// One trainer of `model` on the cpu backend with `kernels` on `threads` threads.
struct TimedTrainer {
  testing::StreamSamples samples;
  std::unique_ptr<production::Trainer> trainer;
  double loss = 0;
  TimedTrainer(const TrainModel& model, production::HostKernels kernels, int threads) {
    samples.stream = testing::document_stream({300, 50, 700, 120, 2000, 30, 400}, 256, 3);
    samples.seq_length = model.seq;
    production::ProductionOptions options;
    options.device = production::Device::cpu;
    options.host_kernels = kernels;
    options.cpu_threads = threads;
    trainer = std::make_unique<production::Trainer>(train_config(model), samples, options);
  }
  double iteration_seconds() {
    const auto start = std::chrono::steady_clock::now();
    loss = trainer->run_iteration().loss;
    return seconds_since(start);
  }
};

// Seconds per iteration (the best of `iterations` after one warm-up) and the last loss.
std::pair<double, double> time_training(const TrainModel& model, production::HostKernels kernels, int threads,
                                        int iterations) {
  TimedTrainer timed(model, kernels, threads);
  timed.iteration_seconds();
  double best = 1e300;
  for (int i = 0; i < iterations; ++i) best = std::min(best, timed.iteration_seconds());
  return {best, timed.loss};
}

// bench/torch_train_step.py's seconds per iteration of `model` on `threads` threads; 0 when it
// cannot run (it says why on stderr).
double pytorch_seconds(const TrainModel& model, int threads, int iterations, std::string& blas) {
  const std::string command = "/usr/bin/python3 " TANDEM_SOURCE_DIR "/bench/torch_train_step.py --json --model " +
                              std::string(model.name) + " --threads " + std::to_string(threads) +
                              " --iterations " + std::to_string(iterations);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return 0.0;
  std::string output;
  char buffer[4096];
  for (std::size_t got; (got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, got);
  if (pclose(pipe) != 0 || output.empty()) return 0.0;
  const nlohmann::json line = nlohmann::json::parse(output, nullptr, false);
  if (line.is_discarded() || !line.contains("seconds")) return 0.0;
  blas = line.value("blas", std::string("unknown"));
  return line["seconds"].get<double>();
}

int bench_train(int iterations, int threads, bool pytorch) {
  std::printf("train: seconds per iteration of the production trainer on the cpu backend (best of %d); "
              "fast = the shipped kernels on 1 and on %d threads\n", iterations, threads);
  std::printf("%-44s %9s %9s %9s %10s %8s %9s", "model", "ordered", "fast x1", "fast xN", "tok/s x1", "speedup",
              "xN / x1");
  if (pytorch) std::printf(" %9s %9s %9s %9s", "torch x1", "torch xN", "/torch x1", "/torch xN");
  std::printf("\n");
  int failures = 0;
  std::string blas;
  for (const TrainModel& model : {kDemo, kLarger}) {
    const auto [ordered_seconds, ordered_loss] = time_training(model, production::HostKernels::ordered, 1, iterations);
    const auto [one_seconds, one_loss] = time_training(model, production::HostKernels::fast, 1, iterations);
    const auto [many_seconds, many_loss] = time_training(model, production::HostKernels::fast, threads, iterations);
    const double tokens = static_cast<double>(model.global_batch * model.seq);
    std::printf("%-44s %9.4f %9.4f %9.4f %10.0f %7.2fx %8.2fx", model.what, ordered_seconds, one_seconds,
                many_seconds, tokens / one_seconds, ordered_seconds / one_seconds, one_seconds / many_seconds);
    if (pytorch) {
      const double torch_one = pytorch_seconds(model, 1, iterations, blas);
      const double torch_many = pytorch_seconds(model, threads, iterations, blas);
      if (torch_one > 0 && torch_many > 0) {
        std::printf(" %9.4f %9.4f %8.2fx %8.2fx", torch_one, torch_many, torch_one / one_seconds,
                    torch_many / many_seconds);
      } else {
        std::printf("  (bench/torch_train_step.py did not run: see above)");
      }
    }
    std::printf("\n");
    for (const auto& [what, loss] : {std::pair{"on 1 thread", one_loss}, std::pair{"on N threads", many_loss}}) {
      if (std::memcmp(&ordered_loss, &loss, sizeof(double)) != 0) {
        std::printf("error: the fast kernels %s end on another loss than the ordered ones (%.17g vs %.17g): a bit "
                    "changed\n", what, loss, ordered_loss);
        ++failures;
      }
    }
  }
  if (pytorch) {
    std::printf("torch: bench/torch_train_step.py, fp32, BLAS %s; /torch = torch's seconds / tandem's (> 1: tandem "
                "is faster)\n", blas.empty() ? "unknown" : blas.c_str());
    if (blas.find("openblas") == std::string::npos) {
      std::printf("note: torch did not run on OpenBLAS (Debian's reference BLAS is far slower): bench/cpu_bench.sh "
                  "installs libopenblas0\n");
    }
  }
  return failures;
}

// CI's guard: the shipped kernels against the ordered ones they replace, timed in turns (so that
// a busy machine slows both alike), the best of each. Exits non-zero when one is slower.
int guard() {
  int failures = 0;
  std::printf("guard: shipped kernels / ordered kernels, timed in turns on this machine (must be > 1)\n");
  for (const GemmShape& shape : gemm_shapes()) {
    GemmCase gemm(shape);
    for (const HostSimd simd : production::kHostSimds) {
      if (!production::host_gemm_has(simd)) continue;
      double ordered = 1e300, blocked = 1e300;
      for (int turn = 0; turn < 3; ++turn) {
        ordered = std::min(ordered, best_seconds(1, [&] { production::gemm_host_ordered(gemm.params); }));
        blocked = std::min(blocked, best_seconds(2, [&] { production::gemm_host_with(gemm.params, simd); }));
      }
      const bool slower = blocked >= ordered;
      failures += slower ? 1 : 0;
      std::printf("%-46s %-8s %7.2fx%s\n", shape.what, production::host_simd_name(simd), ordered / blocked,
                  slower ? "  FAIL: the blocked kernel is slower than the ordered one" : "");
    }
  }
  TimedTrainer ordered(kDemo, production::HostKernels::ordered, 1);
  TimedTrainer fast(kDemo, production::HostKernels::fast, 1);
  ordered.iteration_seconds();
  fast.iteration_seconds();
  double ordered_best = 1e300, fast_best = 1e300;
  for (int turn = 0; turn < 3; ++turn) {
    ordered_best = std::min(ordered_best, ordered.iteration_seconds());
    fast_best = std::min(fast_best, fast.iteration_seconds());
  }
  const bool slower = fast_best >= ordered_best;
  failures += slower ? 1 : 0;
  std::printf("%-46s %-8s %7.2fx%s\n", kDemo.what, production::host_simd_name(production::host_simd()),
              ordered_best / fast_best, slower ? "  FAIL: the shipped kernels train slower than the ordered ones" : "");
  if (std::memcmp(&ordered.loss, &fast.loss, sizeof(double)) != 0) {
    std::printf("FAIL: the shipped kernels end on another loss than the ordered ones (%.17g vs %.17g)\n", fast.loss,
                ordered.loss);
    ++failures;
  }
  std::printf("guard: %s\n", failures == 0 ? "pass" : "FAIL");
  return failures;
}

// A whole number >= 1 from argv[i], or exit 2 naming the option.
int whole_number_at_least_one(const char* option, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 4096) {
    std::fprintf(stderr, "error: %s %s: must be a whole number from 1 to 4096\n", option, text);
    std::exit(2);
  }
  return static_cast<int>(value);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  std::string which = "all";
  int iterations = 3;
  int threads = 2;
  bool pytorch = false;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--iterations" && i + 1 < argc) {
      iterations = tandem::whole_number_at_least_one("--iterations", argv[++i]);
    } else if (argument == "--threads" && i + 1 < argc) {
      threads = tandem::whole_number_at_least_one("--threads", argv[++i]);
    } else if (argument == "--pytorch") {
      pytorch = true;
    } else if (argument == "gemm" || argument == "train" || argument == "guard" || argument == "all") {
      which = argument;
    } else {
      std::fprintf(stderr, "usage: %s [gemm|train|guard|all] [--iterations N] [--threads N] [--pytorch]\n", argv[0]);
      return 2;
    }
  }
  tandem::print_machine();
  if (which == "guard") return tandem::guard() == 0 ? 0 : 1;
  if (which != "train") tandem::bench_gemm();
  if (which != "gemm") return tandem::bench_train(iterations, threads, pytorch) == 0 ? 0 : 1;
  return 0;
}
