// `tandem train [ARGS] [--engine production|reference] [--device cuda|cpu]`: trains with the same
// Megatron-style options as `tandem plan` (SPEC 12). The production engine (the default) is the
// fast twin, on the cuda backend when a device answers, else on the cpu backend, on one rank or
// on the data-parallel ranks mpirun/srun started; the reference engine is the exact CPU twin.
#include <iostream>
#include <ostream>
#include <memory>
#include <sstream>

#include "cli/command.hpp"
#include "cli/ranks.hpp"
#include "core/args.hpp"
#include "core/model_layout.hpp"
#include "core/train/exit_signal.hpp"
#include "production/backend.hpp"
#include "production/collectives/mpi.hpp"
#include "production/collectives/nccl.hpp"
#include "production/cuda/device.hpp"
#include "production/run.hpp"
#include "reference/run.hpp"

namespace tandem::cli {
namespace {

struct TrainCommandState {
  RunArguments run;
  TrainOptions options;
  std::vector<std::int64_t> nonfinite_iterations;
  std::vector<std::int64_t> nonfinite_loss_iterations;
};

int train(const TrainCommandState& state, const production::MpiSession& session) {
  LaunchContext launch;
  launch.allow_zero_train_samples = true;  // SPEC 12: --train-samples 0 --save writes iter 0
  if (session.active()) launch.launched_world_size = session.world_size();
  const RunConfig config = build_run_config(state.run, launch);
  if (session.rank() == 0) {
    for (const std::string& warning : config.argument_warnings) std::cerr << "warning: " << warning << "\n";
  }
  TrainOptions options = state.options;
  // More audited elements than the model has would log every element every iteration (51 MB for 4
  // iterations of a tiny model at --audit-params 1e12).
  const std::int64_t parameters = make_model_layout(config.model).total_elements;
  if (options.audit_params > parameters) {
    throw ConfigError({ConfigIssue{"--audit-params", std::to_string(options.audit_params),
                                   "is more than the model's " + std::to_string(parameters) + " parameters",
                                   "give at most " + std::to_string(parameters) + " (a few dozen suffice for tandem audit)"}});
  }
  // Installed again (it was installed before MPI started, in the command's run): the launcher's
  // MPI initialization must not have replaced it.
  if (options.exit_signal_handler) install_exit_signal_handler();
  options.test_nonfinite_gradient_iterations = {state.nonfinite_iterations.begin(),
                                                state.nonfinite_iterations.end()};
  options.test_nonfinite_loss_iterations = {state.nonfinite_loss_iterations.begin(),
                                            state.nonfinite_loss_iterations.end()};
  if (options.engine == "production") {
    if (config.parallel.world_size != session.world_size()) {
      std::cerr << "error: --tensor-model-parallel-size " << config.parallel.tensor_parallel
                << " x --data-parallel-size " << config.parallel.data_parallel << " = "
                << config.parallel.world_size << " ranks: the production engine runs one rank per process and "
                << session.world_size() << " were launched; fix: start it with mpirun -np "
                << config.parallel.world_size << " (or srun -n " << config.parallel.world_size
                << "), or use --engine reference, which emulates DP in one process\n";
      return 2;
    }
    const production::RankSetup ranks = production::launched_rank_setup(session, config);
    // Rank 0 speaks for the run; the others' progress would repeat it.
    std::ostream null_stream(nullptr);
    std::ostream& out = ranks.rank == 0 ? std::cout : null_stream;
    const auto summary = production::run_production_training(config, options, out, ranks);
    if (summary.iterations > 0 && ranks.rank == 0) {
      std::cout << "loss " << summary.first_loss << " -> " << summary.last_loss << " over "
                << summary.iterations << " iterations (drop "
                << summary.first_loss - summary.last_loss << "), skipped updates "
                << summary.skipped_updates << " [production, "
                << production::to_string(summary.device) << "]\n";
    }
    return 0;
  }
  if (session.world_size() > 1) {
    std::cerr << "error: --engine reference runs in one process (it emulates data parallelism "
                 "with --data-parallel-size); fix: start it without mpirun/srun\n";
    return 2;
  }
  if (options.device.empty()) options.device = "cpu";  // the reference's only device
  if (options.device == "cuda") {
    std::cerr << "error: --device cuda: the reference engine runs on the CPU only (it is the "
                 "exact twin); fix: use --device cpu or drop --device\n";
    return 2;
  }
  const auto summary = reference::run_reference_training(config, options, std::cout);
  if (summary.iterations > 0) {
    std::cout << "loss " << summary.first_loss << " -> " << summary.last_loss << " over "
              << summary.iterations << " iterations (drop " << summary.first_loss - summary.last_loss
              << "), skipped updates " << summary.skipped_updates << "\n";
  }
  return 0;
}

Command add_train_command(CLI::App& parent) {
  auto state = std::make_shared<TrainCommandState>();
  CLI::App* sub = parent.add_subcommand(
      "train", "Train with the production engine (default) or the reference engine (the exact CPU "
               "twin); logs JSON Lines, writes checkpoints, resumes bit-exactly (SPEC 9, 12). "
               "Started by mpirun or srun, each process is one data-parallel rank of the "
               "production engine");
  add_run_options(*sub, state->run);
  auto& options = state->options;
  const std::string group = "Training";
  sub->add_option("--engine", options.engine,
                  "production (the fast twin: cuda, or the same code on cpu) | reference (the exact CPU "
                  "twin) (default: production)")
      ->check(CLI::IsMember({"reference", "production"}))->group(group);
  sub->add_option("--device", options.device,
                  "cuda | cpu (default: cuda when a device answers and the cuda backend is built, "
                  "else cpu; the reference runs on cpu only)")
      ->check(CLI::IsMember({"cuda", "cpu"}))->group(group);
  sub->add_option("--reference-precision", options.reference_precision,
                  "double | float50 (50 significant digits, for golden numbers) (default: double)")
      ->check(CLI::IsMember({"double", "float50"}))->group(group);
  sub->add_option("--log", options.log_path,
                  "JSON Lines log: a header record, then one record per iteration "
                  "(default: SAVE/log.jsonl with --save, else none)")->group(group);
  sub->add_option("--audit-params", options.audit_params,
                  "parameter elements (chosen by --seed from both decay groups) whose AdamW "
                  "inputs and result every iteration record carries, for `tandem audit` "
                  "(default: 0)")
      ->check(non_negative())->group(group);
  sub->add_option("--max-consecutive-skips", options.max_consecutive_skips,
                  "stop with an error after this many skipped updates in a row, after a final "
                  "checkpoint (updates; default: 10)")
      ->check(at_least_one())->group(group);
  sub->add_option("--data-cache", options.data_cache,
                  "directory the embedded corpus is built into when no --data-path is given "
                  "(default: $TMPDIR/tandem-default-corpus)")->group(group);
  sub->add_option("--exit-interval", options.exit_interval,
                  "stop after the iteration that is a multiple of this, saving a checkpoint "
                  "with --save (Megatron's option; iterations; default: 0 = run to the end)")
      ->check(non_negative())->group(group);
  sub->add_flag("--exit-signal-handler", options.exit_signal_handler,
                "on SIGTERM (Slurm's warning before the time limit, scancel) or SIGINT, finish the "
                "iteration, save a checkpoint with --save and exit 0; any rank's signal stops every "
                "rank (Megatron's option). Under mpirun send SIGUSR1 to mpirun (it forwards it and "
                "keeps the ranks; a SIGTERM to mpirun kills them), or SIGTERM to the ranks")->group(group);
  sub->add_option("--exit-duration-in-mins", options.exit_duration_minutes,
                  "stop, saving a checkpoint with --save, after the first iteration that ends this "
                  "long after the start (minutes, fractions allowed; Megatron's option; default: 0 = "
                  "never)")
      ->check(non_negative())->group(group);
  sub->add_flag("--log-pipeline-timeline", options.log_pipeline_timeline,
                "with --pipeline-model-parallel-size > 1: time every forward and backward pass of "
                "every stage and log each iteration's timeline (a pipeline_timeline record with "
                "the measured idle fraction beside the plan's; `tandem timeline LOG --svg FILE` "
                "draws it) (production engine)")->group(group);
  sub->add_flag("--quiet", options.quiet, "no progress line per iteration")->group(group);
  sub->add_flag("--verbose", options.verbose,
                "also print how the backend computes: on cpu the vector path the processor's features "
                "chose (avx512, avx2 or baseline; TANDEM_HOST_SIMD=NAME picks one) and the threads per rank")
      ->group(group);
  sub->add_option("--cpu-threads", options.cpu_threads,
                  "threads per rank of the cpu backend: a GEMM's output tiles and attention's (sample, "
                  "group) pairs are split among them, each computed whole by one thread, so every "
                  "count gives the same bits (default: the CPUs this process may use, shared among the "
                  "ranks on its node, at least 1)")
      ->check(at_least_one())->group(group);
  // Test-only (hidden): make the reduced gradient of these iterations NaN (SPEC 8 tests).
  sub->add_option("--test-nonfinite-gradient-iterations", state->nonfinite_iterations)
      ->delimiter(',')->group("");
  // Test-only (hidden): make the global loss of these iterations NaN (SPEC 8's other condition).
  sub->add_option("--test-nonfinite-loss-iterations", state->nonfinite_loss_iterations)
      ->delimiter(',')->group("");

  Command command;
  command.app = sub;
  command.run = [state]() {
    // First, before MPI, the configuration and the data: a stop signal during the startup (a
    // Slurm job's time limit may come that early) is held until the first point where the run
    // can stop, the end of its first iteration, instead of killing the rank.
    if (state->options.exit_signal_handler) install_exit_signal_handler();
    // Under mpirun/srun every rank runs this; a process started alone is one rank without MPI.
    production::MpiSession session;
    return run_as_ranks(session, [&] { return train(*state, session); });
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(40, add_train_command);

}  // namespace tandem::cli
