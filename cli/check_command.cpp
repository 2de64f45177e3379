// `tandem check [ARGS] [--updates N]`: both twins on the user's own small configuration and data
// for N updates, held together by the equivalence harness (equivalence/comparison.hpp). Per update
// and per quantity it prints the two values, the error and the bound; the exit status is the
// verdict (0: every comparison held, 1: one did not, 2: bad input).
//
// The fast twin is the production trainer (cpu backend, cuda with --device cuda, or the cuda
// backend on cuda-sim with --device cuda-sim: the shipped CUDA sources on the CPU, ranks on
// threads, docs/CUDA-SIM.md); with
// --fast-twin reference-double it is the double reference, held against the 50-digit reference;
// with --fast-twin production-semantic it is the production trainer's semantic build (Real =
// double, production/arithmetic.hpp), held to fp64 bounds: a deviation of 1e-9 stands out.
// Each update is teacher-forced: the truth starts it from the fast twin's own state. With --load
// both start from a checkpoint (any engine's) instead of the initialization.
// With --data-parallel-size N the production twin runs N ranks on threads of this process; under
// `mpirun -np N` (or srun) each process is one of its N ranks, exchanging through MPI as
// `tandem train` does, and rank 0 prints the report.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>

#include "cli/command.hpp"
#include "cli/ranks.hpp"
#include "core/args.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/main_state.hpp"
#include "core/checkpoint/resume_check.hpp"
#include "core/host_memory.hpp"
#include "core/data/training_data.hpp"
#include "core/model_layout.hpp"
#include "core/train/train_options.hpp"
#include "equivalence/comparison.hpp"
#include "equivalence/error_bounds.hpp"
#include "equivalence/statistical_bounds.hpp"
#include "equivalence/twin.hpp"
#include "equivalence/verdict.hpp"
#include "production/collectives/mpi.hpp"
#include "reference/run.hpp"

namespace tandem::cli {
namespace {

struct CheckCommandState {
  RunArguments run;
  std::int64_t updates = 3;
  std::string fast_twin = "production";
  std::string device = "cpu";
  std::string data_cache;
  std::size_t lines_per_update = 60;
  // Hold the twins to the rigorous bounds alone (no statistical bound: no finding can be a false
  // alarm of its model, at the price of bounds 10^2 to 10^6 looser, docs/EQUIVALENCE.md).
  bool rigorous_bounds = false;
  std::string test_mutant;  // test-only (hidden): the fast twin is this mutant (of the cuda-sim twin with --device cuda-sim)
};

equivalence::TwinKind fast_twin_kind(const CheckCommandState& state, bool launched_ranks) {
  for (const equivalence::Mutant mutant : equivalence::all_mutants()) {
    if (state.test_mutant != equivalence::to_string(mutant)) continue;
    return state.device == "cuda-sim" ? equivalence::production_cuda_sim_twin(mutant) : equivalence::mutant_twin(mutant);
  }
  if (!state.test_mutant.empty()) {
    throw std::invalid_argument("--test-mutant " + state.test_mutant + ": no such mutant");
  }
  if (state.fast_twin == "reference-double") return equivalence::reference_twin();
  const equivalence::RankTransport transport =
      launched_ranks ? equivalence::RankTransport::mpi : equivalence::RankTransport::threads;
  if (state.fast_twin == "production-semantic") return equivalence::production_semantic_twin(transport);
  if (state.device == "cuda-sim") return equivalence::production_cuda_sim_twin();
  return equivalence::production_twin(state.device == "cuda", transport);
}

int run_check(const CheckCommandState& state, const production::MpiSession& session) {
  LaunchContext launch;
  launch.allow_zero_train_samples = true;
  if (session.active()) launch.launched_world_size = session.world_size();
  RunConfig config = build_run_config(state.run, launch);
  if (session.rank() == 0) {
    for (const std::string& warning : config.argument_warnings) std::cerr << "warning: " << warning << "\n";
  }
  if (!config.checkpoint.save.empty()) {
    if (session.rank() == 0) {
      std::cerr << "error: --save " << config.checkpoint.save
                << ": tandem check writes no checkpoint; fix: drop --save (--load starts the check from a "
                   "checkpoint)\n";
    }
    return 2;
  }
  const bool launched_ranks = session.world_size() > 1;
  if (launched_ranks && (state.fast_twin == "reference-double" || !state.test_mutant.empty())) {
    if (session.rank() == 0) {
      std::cerr << "error: under mpirun/srun only the production twins run as ranks; fix: run "
                   "--fast-twin reference-double (and --test-mutant) in one process\n";
    }
    return 2;
  }
  if (state.device != "cpu" && state.fast_twin != "production") {
    if (session.rank() == 0) {
      std::cerr << "error: --device " << state.device << " with --fast-twin " << state.fast_twin
                << ": only the production twin has a " << state.device << " backend (the semantic build is the "
                << "cpu backend's, production/arithmetic.hpp); fix: drop --device " << state.device << "\n";
    }
    return 2;
  }
  if (state.device == "cuda-sim" && launched_ranks) {
    if (session.rank() == 0) {
      std::cerr << "error: --device cuda-sim under mpirun/srun: cuda-sim runs its ranks on threads of one process "
                   "(NCCL is not simulated yet, docs/CUDA-SIM.md); fix: run one process with "
                   "--tensor/--pipeline/--data-parallel-size\n";
    }
    return 2;
  }
  if (state.fast_twin == "production-semantic" && config.optimizer.bf16 && session.rank() == 0) {
    std::cerr << "warning: --bf16 with --fast-twin production-semantic: the semantic build has no bf16; "
                 "this check runs its compute in fp64\n";
  }
  const equivalence::TwinKind fast = fast_twin_kind(state, launched_ranks);
  std::ostream null_stream(nullptr);
  std::ostream& out = session.rank() == 0 ? std::cout : null_stream;  // rank 0 reports
  // The truth: the 50-digit reference for the double reference; the double reference for
  // production (whose fp32 bound dwarfs double's rounding, at a fraction of the cost).
  const equivalence::TwinKind truth = state.fast_twin == "reference-double" && state.test_mutant.empty()
                                          ? equivalence::reference50_twin()
                                          : equivalence::reference_twin();
  if (fast.max_data_parallel > 0 && config.parallel.data_parallel > fast.max_data_parallel) {
    std::cerr << "error: --data-parallel-size " << config.parallel.data_parallel << ": the "
              << fast.name << " twin runs " << fast.max_data_parallel
              << " rank(s) per process; fix: launch the ranks as processes (mpirun -np "
              << config.parallel.data_parallel << " tandem check ...)\n";
    return 2;
  }

  equivalence::PrecisionPair precisions{equivalence::precision_of(fast, config), truth.precision};
  precisions.rigorous_only = state.rigorous_bounds;
  // The statistical bounds' rounding probe takes 160 bytes a value: refuse a model it cannot hold
  // before anything allocates (every rank alike: each reads the same machine's memory).
  if (!precisions.rigorous_only && equivalence::per_element_bounds_apply(precisions)) {
    const std::optional<double> share = host_share_bytes(session.local_size());
    const double needed = equivalence::statistical_bounds_bytes(config);
    if (share && needed > *share) {
      throw ConfigError({ConfigIssue{
          "--hidden-size", std::to_string(config.model.hidden_size),
          "with --num-layers " + std::to_string(config.model.num_layers) + " and --seq-length " +
              std::to_string(config.model.seq_length) + " the statistical bounds' rounding probe needs " +
              gib_text(needed) + " GiB (160 bytes for each parameter, gradient element and value of one sample's "
              "forward and backward) and " + host_share_text(*share, session.local_size()),
          "add --rigorous-bounds (the worst-case bounds alone, no probe), or check a smaller model"}});
    }
  }

  TrainOptions options;
  options.data_cache = state.data_cache;
  // Rank 0 builds the embedded corpus (when it is used) before the others open it.
  if (session.rank() == 0) data::resolve_data_path(config, options.data_cache);
  session.barrier();
  equivalence::TwinSetup setup;
  setup.config = config;
  setup.samples = reference::open_training_samples(config, options);
  auto truth_twin = truth.make(setup);
  auto fast_twin = fast.make(setup);
  const ModelLayout layout = make_model_layout(config.model);
  // --load: both twins start from the checkpoint's state (any engine's; the fast twin rounds it
  // to its main precision and the truth starts every update from the fast twin's copy).
  std::string loaded;
  if (!config.checkpoint.load.empty()) {
    const checkpoint::CheckpointState saved = checkpoint::load_checkpoint(config.checkpoint.load);
    checkpoint::check_resume_settings(saved.run_config, config);
    const MainState<double> state = checkpoint::read_main_state_widened(layout, saved);
    fast_twin->load_state({state.params, state.exp_avg, state.exp_avg_sq, state.counters});
    truth_twin->load_state(fast_twin->state());
    loaded = config.checkpoint.load + " (" + saved.engine + " engine, " + saved.precision + ") at iteration " +
             std::to_string(saved.counters.iteration);
  }

  out << "tandem check: " << fast_twin->description() << " [fast twin] vs "
            << truth_twin->description() << " [truth], " << state.updates
            << " update(s), each from the fast twin's own state; precision "
            << precisions.under_test.name << " vs " << precisions.reference.name << "\n"
            << "comparisons: counters, lr, wd, step, flags and samples exact; loss, grad_norm, "
               "clip_coeff, gradient, params, exp_avg, exp_avg_sq within derived bounds (worst "
               "element per quantity shown, then each quantity's sharpness: error / bound, "
               "docs/EQUIVALENCE.md): "
            << (precisions.rigorous_only || !equivalence::per_element_bounds_apply(precisions)
                    ? "the rigorous bounds (equivalence/tolerance.hpp, error_bounds.hpp)"
                    : "per value the smaller of the rigorous bounds (equivalence/tolerance.hpp, "
                      "error_bounds.hpp) and the statistical one (statistical_bounds.hpp: a correct "
                      "twin exceeds it with probability 1e-12 under its rounding model; "
                      "--rigorous-bounds leaves it out)")
            << "\n";
  // Users paste their training arguments: say what of them the check leaves out.
  if (config.evaluation.evaluates()) {
    out << "not compared: the validation loss (--eval-iters " << config.evaluation.eval_iters
        << " on the --split validation part); check compares training updates (the engines' "
           "validation losses are held together by tests/evaluation_test.cpp)\n";
  }

  equivalence::Report initial;
  equivalence::compare_states_bitwise(0, "initial ", truth_twin->state(), fast_twin->state(), initial);
  if (loaded.empty()) {
    out << "update 0 (initialization, SPEC 4: bit-identical): " << (initial.ok() ? "ok" : "FAILED") << "\n";
  } else {
    out << "start: the state of " << loaded << "\n";
  }
  if (!initial.ok()) out << initial.text(state.lines_per_update);

  bool ok = initial.ok();
  const std::int64_t first_update = fast_twin->state().counters.iteration + 1;
  for (std::int64_t update = first_update; update < first_update + state.updates; ++update) {
    equivalence::UpdateObservation reference;
    equivalence::UpdateObservation under_test;
    under_test.before = fast_twin->state();
    truth_twin->load_state(under_test.before);  // teacher forcing: the same state
    reference.before = truth_twin->state();
    reference.record = truth_twin->run_iteration();
    reference.after = truth_twin->state();
    reference.gradient = truth_twin->last_gradient();
    reference.batch = equivalence::update_batch(*truth_twin, reference.before, config);
    under_test.record = fast_twin->run_iteration();
    under_test.after = fast_twin->state();
    under_test.gradient = fast_twin->last_gradient();
    equivalence::Report report;
    equivalence::compare_update(update, config, layout, precisions, reference, under_test, report);
    const std::int64_t first = under_test.before.counters.consumed_samples;
    for (std::int64_t index = first; index < first + config.batch.global_batch_size; ++index) {
      equivalence::compare_samples(update, truth_twin->consumed_sample(index),
                                   fast_twin->consumed_sample(index), report);
    }
    out << "-- update " << update << ": " << (report.ok() ? "ok" : "FAILED")
              << " (reference = truth, under test = fast twin)\n"
              << report.text(state.lines_per_update) << report.sharpness_text();
    ok = ok && report.ok();
  }
  out << "verdict: " << (ok ? "the twins agree within every bound" : "the twins DISAGREE")
            << "\n";
  return equivalence::agree_on_verdict(ok) ? 0 : 1;
}

Command add_check_command(CLI::App& parent) {
  auto state = std::make_shared<CheckCommandState>();
  CLI::App* sub = parent.add_subcommand(
      "check", "Run both twins on this configuration and data for N updates and compare them "
               "quantity by quantity against derived bounds; the exit status is the verdict");
  add_run_options(*sub, state->run);
  const std::string group = "Check";
  sub->add_option("--updates", state->updates, "updates to compare (default: 3)")
      ->check(at_least_one())->group(group);
  sub->add_option("--fast-twin", state->fast_twin,
                  "production (the production trainer, held against the double reference) | "
                  "production-semantic (its semantic build, Real = double, held to fp64 bounds) | "
                  "reference-double (held against the 50-digit reference) (default: production)")
      ->check(CLI::IsMember({"production", "production-semantic", "reference-double"}))->group(group);
  sub->add_option("--device", state->device,
                  "the production twin's backend: cpu | cuda | cuda-sim (the cuda backend with the shipped "
                  "CUDA sources run on the CPU, ranks on threads; docs/CUDA-SIM.md) (default: cpu)")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-sim"}))->group(group);
  sub->add_option("--data-cache", state->data_cache,
                  "directory the embedded corpus is built into when no --data-path is given "
                  "(default: $TMPDIR/tandem-default-corpus)")->group(group);
  sub->add_option("--lines-per-update", state->lines_per_update,
                  "most report lines per update (default: 60)")->group(group);
  sub->add_flag("--rigorous-bounds", state->rigorous_bounds,
                "hold the twins to the rigorous bounds alone, without the statistical ones "
                "(which a correct twin exceeds with probability 1e-12 per value under their "
                "rounding model; default: both, the smaller per value; their probe takes 160 bytes "
                "a value, and a model it cannot hold is refused)")->group(group);
  // Test-only (hidden): the fast twin is a deliberately wrong reference, so tests can show that
  // the exit status is the verdict.
  sub->add_option("--test-mutant", state->test_mutant)->group("");

  Command command;
  command.app = sub;
  command.run = [state]() {
    production::MpiSession session;  // MPI when mpirun/srun started this process
    if (session.world_size() > 1) {
      return run_as_ranks(session, [&] { return run_check(*state, session); });
    }
    try {
      return run_check(*state, session);
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& error) {
      std::cerr << "error: " << error.what() << "\n";
      return 2;
    }
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(45, add_check_command);

}  // namespace tandem::cli
