// Options of `tandem train` beyond the run's configuration (SPEC 12): which engine and device,
// where the log goes, what to audit, when to give up on skipped updates.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

namespace tandem {

struct TrainOptions {
  std::string engine = "production";    // production (the fast twin) | reference (exact CPU twin)
  std::string device;                   // cuda | cpu; empty = cuda when a device answers, else cpu
  std::string reference_precision = "double";  // double | float50 (golden numbers)
  std::string log_path;                 // JSON Lines; empty = SAVE/log.jsonl with --save, else none
  std::int64_t audit_params = 0;        // parameter elements audited per update (SPEC 12)
  std::int64_t max_consecutive_skips = 10;  // SPEC 8: stop after this many skips in a row
  std::string data_cache;               // where the embedded corpus is built; empty = temp dir
  std::int64_t exit_interval = 0;       // Megatron: stop (saving) once iteration % this == 0
  // Megatron: stop (saving) after the iteration during which SIGTERM arrived (exit_signal.hpp),
  // or after the first iteration that ends more than this many minutes after `start` (0 = never).
  bool exit_signal_handler = false;
  double exit_duration_minutes = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool quiet = false;                   // no progress line per iteration
  bool verbose = false;                 // also say how the backend computes (cpu: vector path, threads)
  // The cpu backend's threads per rank; 0 = the CPUs this process may use, shared among the ranks
  // on its node (at least 1). Records are the same bits for every count (SPEC 7's order kept).
  std::int64_t cpu_threads = 0;
  bool log_pipeline_timeline = false;   // PP > 1: a pipeline_timeline record per iteration
  // Test-only: iterations (1-based) whose reduced gradient is made non-finite (SPEC 8 tests).
  std::set<std::int64_t> test_nonfinite_gradient_iterations;
  std::set<std::int64_t> test_nonfinite_loss_iterations;  // the loss becomes NaN (SPEC 8 tests)
};

}  // namespace tandem
