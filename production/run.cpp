// The production run (run.hpp): data -> backend -> resume -> header -> iterations -> checkpoints,
// step for step as reference/run.cpp.
#include "production/run.hpp"

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <optional>
#include <ostream>
#include <span>
#include <vector>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/data/tokenizer.hpp"
#include "core/config_issue.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/save_lock.hpp"
#include "core/data/training_data.hpp"
#include "core/host_memory.hpp"
#include "core/planner.hpp"
#include "core/train/audit_selection.hpp"
#include "core/train/records.hpp"
#include "core/train/run_support.hpp"
#include "production/checkpointing.hpp"
#include "production/collectives/collectives.hpp"
#include "production/collectives/mpi.hpp"
#include "production/collectives/nccl.hpp"
#include "production/collectives/staged.hpp"
#include "core/rank_grid.hpp"
#include "core/run_layout.hpp"
#include "production/cuda/device.hpp"
#include "production/kernels/gemm.hpp"
#include "production/kernels/host_workers.hpp"
#include "production/trainer.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

Device choose_device(const std::string& requested) {
  if (requested == "cpu") return Device::cpu;
  if (requested == "cuda") return Device::cuda;
  if (requested.empty()) {
    return cuda_backend_built() && tandem::cuda::device_count() > 0 ? Device::cuda : Device::cpu;
  }
  throw std::runtime_error("--device " + requested + ": must be cuda or cpu");
}

RankSetup launched_rank_setup(const MpiSession& session, const RunConfig& config) {
  RankSetup ranks;
  if (!session.active()) return ranks;
  ranks.layout = std::make_shared<const RunLayout>(config);
  const RankGrid& grid = ranks.layout->grid;
  if (grid.world_size() != session.world_size()) {
    throw std::invalid_argument("the launcher started " + std::to_string(session.world_size()) + " ranks for the grid " +
                                grid.describe());
  }
  ranks.rank = session.rank();
  ranks.local_rank = session.local_rank();
  ranks.local_size = session.local_size();
  // Each group's factory is collective over every rank (MPI_Comm_split), and the Trainer calls
  // them in the same order on every rank (trainer.hpp).
  const bool share_devices = ranks.local_size > tandem::cuda::device_count();
  const auto on_device = [share_devices](Backend& backend, std::shared_ptr<Collectives> host) {
    if (!host || backend.device() != Device::cuda) return host;  // null: a group this rank is not in
    return share_devices ? make_host_staged_collectives(backend, std::move(host))
                         : make_nccl_collectives(backend, std::move(host));
  };
  const auto group = [layout = ranks.layout, on_device](RankGroupKind kind) -> CollectivesFactory {
    return [layout, kind, on_device](Backend& backend) {
      return on_device(backend, make_mpi_group_collectives(layout->grid, kind));
    };
  };
  ranks.collectives = group(RankGroupKind::data);
  ranks.tensor_parallel = group(RankGroupKind::tensor);
  ranks.pipeline = group(RankGroupKind::pipeline);
  ranks.embedding = group(RankGroupKind::embedding);
  ranks.world = [on_device](Backend& backend) { return on_device(backend, make_mpi_collectives()); };
  ranks.barrier = [&session] { session.barrier(); };
  ranks.all_gather_text = [](const std::string& text) {
    const std::shared_ptr<Collectives> world = make_mpi_collectives();
    return all_gather_strings(*world, text);
  };
  return ranks;
}

namespace {

// {"type":"pipeline_timeline"} (docs/PRODUCTION.md "Pipeline parallelism"): every stage's passes
// as [kind, microbatch, chunk, start, end] (seconds from the iteration's common start), each
// stage's busy time, the idle fraction measured and the plan's.
nlohmann::json timeline_record(const PipelineTimeline& timeline, const RunConfig& config, double plan) {
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t stage = 0; stage < timeline.stages.size(); ++stage) {
    nlohmann::json passes = nlohmann::json::array();
    for (const TimedPass& timed : timeline.stages[stage]) {
      passes.push_back({timed.pass.forward ? "F" : "B", timed.pass.microbatch, timed.pass.chunk, timed.start, timed.end});
    }
    stages.push_back({{"stage", stage}, {"busy_seconds", timeline.busy(stage)}, {"passes", std::move(passes)}});
  }
  return {{"type", "pipeline_timeline"},
          {"iteration", timeline.iteration},
          {"pipeline_stages", config.parallel.pipeline_parallel},
          {"model_chunks_per_rank", config.parallel.virtual_pipeline_stages},
          {"microbatches_per_replica", config.microbatches_per_replica()},
          {"span_seconds", timeline.span()},
          {"idle_fraction", timeline.idle_fraction()},
          {"plan_idle_fraction", plan},
          {"stages", std::move(stages)}};
}

// "stage 0: the embedding, layers 0-1" ... for the log header.
std::vector<std::string> pipeline_stage_texts(const PipelineStages& stages) {
  std::vector<std::string> out;
  for (std::int64_t stage = 0; stage < stages.pipeline_size(); ++stage) {
    out.push_back("stage " + std::to_string(stage) + ": " +
                  (PipelineStages::holds_embedding(stage, 0) ? "the embedding, " : "") + stages.describe(stage) +
                  (stages.holds_output(stage, stages.virtual_stages() - 1) ? ", the final norm, output layer and loss"
                                                                           : ""));
  }
  return out;
}

// Bytes this machine can give a rank now: the device's free memory on cuda, the rank's share of
// MemAvailable (/proc/meminfo) among the node's `ranks_here` on cpu; nothing when it cannot tell.
std::optional<double> available_bytes(Device device, int device_index, int ranks_here) {
  if (device == Device::cuda) {
    const tandem::cuda::DeviceMemory memory = tandem::cuda::device_memory(device_index);
    return memory.total_bytes > 0 ? std::optional<double>(static_cast<double>(memory.free_bytes)) : std::nullopt;
  }
  return host_share_bytes(ranks_here);
}

// Refuses in milliseconds a run whose memory cannot fit (a 10^8-position sequence ran 12 s and
// took 6.4 GiB before std::bad_alloc): the plan's model state, stored activations and working buffers per rank
// (core/planner.hpp, which counts tandem's own trainer) are a lower bound of what the trainer
// allocates; the rank's share of what is available must hold them.
std::optional<ConfigIssue> memory_shortfall(const RunConfig& config, const RunLayout& layout, Device device,
                                            int device_index, int ranks_here) {
  const std::optional<double> share = available_bytes(device, device_index, ranks_here);
  if (!share) return std::nullopt;
  const Plan plan = make_plan(config, layout, PlanOptions{});
  const StageMemory& stage = plan.memory.stages.front();
  constexpr double kGib = 1024.0 * 1024.0 * 1024.0;
  const double needed = plan.memory.peak_gib * kGib;
  if (needed <= *share) return std::nullopt;
  // What grows with the sequence (stored activations and the working buffers) against the model state.
  const double sequence_gib = stage.activations_gib + stage.working_gib;
  const bool activations_dominate = sequence_gib >= stage.total_gib - sequence_gib;
  const std::string numbers =
      "needs at least " + gib_text(needed) + " GiB a rank (" + gib_text(stage.activations_gib * kGib) +
      " GiB of stored activations, " + gib_text(stage.working_gib * kGib) + " GiB of working buffers, " +
      gib_text((stage.total_gib - sequence_gib) * kGib) + " GiB of weights, gradients and optimizer state), and " +
      (device == Device::cpu ? host_share_text(*share, ranks_here)
                             : "the device has " + gib_text(*share) + " GiB available");
  if (activations_dominate) {
    return ConfigIssue{"--seq-length", std::to_string(config.model.seq_length),
                       "with --micro-batch-size " + std::to_string(config.batch.micro_batch_size) + " the run " + numbers,
                       "shorten --seq-length or --micro-batch-size, or add tensor-parallel ranks"};
  }
  return ConfigIssue{"--hidden-size", std::to_string(config.model.hidden_size),
                     "with --num-layers " + std::to_string(config.model.num_layers) + " the model " + numbers,
                     "a smaller model, tensor-parallel ranks or --use-distributed-optimizer"};
}

// --cpu-threads, or by default the CPUs this process may use (its affinity mask) shared evenly among
// the ranks on its node, at least one each: 8 ranks on 2 cores get 1 thread each, 1 rank gets 2.
int cpu_threads_for(const TrainOptions& options, int local_ranks) {
  if (options.cpu_threads > 0) return static_cast<int>(options.cpu_threads);
  return std::max(1, usable_cpu_count() / std::max(1, local_ranks));
}

}  // namespace

RunSummary run_production_training(const RunConfig& config, const TrainOptions& options,
                                   std::ostream& out, const RankSetup& ranks) {
  // Rank 0 builds the embedded corpus (when it is used) before the others look for it.
  const bool lead = ranks.rank == 0;
  std::vector<DataPathEntry> data_path;
  if (lead) data_path = data::resolve_data_path(config, options.data_cache);
  ranks.barrier();
  if (!lead) data_path = data::resolve_data_path(config, options.data_cache);
  const auto source = data::open_training_samples_at(data_path, config);
  // The validation split (docs/DATA.md section 12), opened only when the run evaluates.
  SampleProvider validation;
  if (config.evaluation.evaluates()) {
    const auto valid = data::open_training_samples_at(data_path, config, data::DatasetSplit::valid);
    validation = [valid](std::int64_t index) { return valid->sample(index); };
  }
  ProductionOptions production;
  production.layout = ranks.layout ? ranks.layout : std::make_shared<const RunLayout>(config);
  production.device = choose_device(options.device);
  production.pipeline_timeline = options.log_pipeline_timeline;
  production.cpu_threads = cpu_threads_for(options, ranks.local_size);
  // A node with more ranks than devices puts several ranks on each (their collectives are staged
  // through host memory: launched_rank_setup); one rank per device otherwise.
  if (production.device == Device::cuda) {
    const int devices = tandem::cuda::device_count();
    production.device_index = devices > 0 ? ranks.local_rank % devices : ranks.local_rank;
    if (devices > 0 && ranks.local_size > devices && ranks.rank == 0) {
      out << "note: " << ranks.local_size << " ranks on this node share " << devices
          << " device(s): their exchanges are staged through host memory over MPI (NCCL refuses two ranks "
             "on one device); correct, and slower than NCCL\n";
    }
  }
  production.collectives = ranks.collectives;
  production.tensor_parallel = ranks.tensor_parallel;
  production.world = ranks.world;
  production.pipeline = ranks.pipeline;
  production.embedding = ranks.embedding;
  FaultSchedule faults;
  faults.nonfinite_gradient_iterations = options.test_nonfinite_gradient_iterations;
  faults.nonfinite_loss_iterations = options.test_nonfinite_loss_iterations;
  production.hooks = make_test_hooks(faults);
  // Every rank decides on the same verdict (each reads its own free memory): one refusal ends all.
  const std::optional<ConfigIssue> shortfall =
      memory_shortfall(config, *production.layout, production.device, production.device_index, ranks.local_size);
  for (const std::string& refusal : ranks.all_gather_text(shortfall ? format_issues({*shortfall}) : std::string())) {
    if (refusal.empty()) continue;
    throw ConfigError({shortfall ? *shortfall
                                 : ConfigIssue{"memory", "another rank", refusal, "see that rank's numbers above"}});
  }
  Trainer trainer(config, [source](std::int64_t index) { return source->sample(index); }, production);

  // One run at a time in a --save directory (core/checkpoint/save_lock.hpp): rank 0 holds the
  // lock; every rank learns whether it got it, so a refusal ends every rank alike (exit 2).
  std::optional<checkpoint::SaveLock> save_lock;
  std::string lock_refused;
  if (lead && !config.checkpoint.save.empty()) {
    try {
      save_lock.emplace(config.checkpoint.save);
    } catch (const ConfigError& error) {
      lock_refused = error.issues().front().rule;
    }
  }
  const std::vector<std::string> refusals = all_gather_strings(trainer.collectives(), lock_refused);
  if (!refusals.front().empty()) {
    throw ConfigError({ConfigIssue{"--save", config.checkpoint.save, refusals.front(),
                                   "wait for that run to end, or give this run a --save directory of its own"}});
  }

  std::int64_t resumed_iteration = 0;
  std::vector<std::string> resume_changes;
  if (resumes_from_load(config, out)) {
    resume_changes = describe_resume_changes(resume_trainer_from(trainer, config.checkpoint.load));
    resumed_iteration = trainer.counters().iteration;
    out << "resumed from " << config.checkpoint.load << " at iteration " << resumed_iteration << "\n";
    for (const std::string& change : resume_changes) out << "note: " << change << "\n";
  }
  require_save_not_ahead(config, resumed_iteration);
  const bool saving = !config.checkpoint.save.empty();
  // One rank writes the whole state; several write a shard each (production/checkpointing.hpp);
  // all return once it is in place.
  auto save = [&]() {
    const auto path = save_trainer_checkpoint(trainer, config.checkpoint.save);
    if (lead) out << "saved checkpoint " << path.string() << "\n";
  };

  const std::string log_path = lead ? resolve_log_path(config, options) : std::string();
  const std::string compute_precision = config.optimizer.bf16 ? "bf16" : "fp32";
  JsonlLog log;
  if (!log_path.empty()) {
    log = JsonlLog(log_path, resumed_iteration > 0);
    const HeaderIdentity identity{"production", to_string(production.device),
                                  trainer.backend().description(), "fp32", compute_precision};
    nlohmann::json extra = {
        {"throughput", {{"flops_convention",
                         "6 x matrix parameters (output projection included, embedding lookup "
                         "excluded) per position + 12 x layers x H x hd per unmasked attention "
                         "pair (docs/PRODUCTION.md)"},
                        {"peak_flops_per_second",
                         trainer.backend().peak_flops_per_second(trainer.compute_dtype())}}},
        {"memory",
         {{"activation_bytes_per_layer", trainer.model().activation_bytes_per_layer()},
          {"model_bytes", trainer.model().allocated_bytes()},
          {"bytes_in_use", trainer.backend().bytes_in_use()},
          {"convention", "bytes held in this rank's backend buffers (docs/PRODUCTION.md \"Memory\")"}}},
        {"tensor_parallel",
         {{"ranks", trainer.tensor_parallel_group().size()},
          {"collectives", trainer.tensor_parallel_group().description()},
          {"sequence_parallel", trainer.sequence_parallel()}}},
        {"pipeline_parallel",
         {{"ranks", trainer.pipeline_group().size()},
          {"collectives", trainer.pipeline_group().description()},
          {"model_chunks_per_rank", trainer.pipeline_stages().virtual_stages()},
          {"stages", pipeline_stage_texts(trainer.pipeline_stages())},
          {"schedule", trainer.pipeline_group().size() == 1 ? "none"
                       : trainer.pipeline_stages().virtual_stages() == 1
                           ? "1F1B (Megatron's, not interleaved)"
                           : "interleaved 1F1B (Megatron's, groups of " +
                                 std::to_string(trainer.pipeline_group().size()) + " microbatches)"},
          {"activation_slots", trainer.model().activation_slots()},
          {"chunk_slots", trainer.model().chunk_slots()}}},
        {"data_parallel",
         {{"ranks", trainer.replicas().size()},
          {"collectives", trainer.replicas().description()},
          {"optimizer", trainer.distributed_optimizer()
                            ? "distributed (each rank holds its shard)"
                            : config.parallel.use_distributed_optimizer
                                  ? "distributed, one rank (it holds the whole state)"
                                  : "replicated"},
          {"gradient_buckets", trainer.shards().buckets.size()},
          {"bucket_elements", trainer.shards().buckets.front().elements},
          {"rank_elements", trainer.shards().rank_elements()},
          {"overlap", {{"grad_reduce", trainer.overlaps_grad_reduce()},
                       {"param_gather", trainer.overlaps_param_gather()},
                       {"lane", trainer.overlaps_grad_reduce() ? trainer.lane_description() : "none"}}}}}};
    extra.update(resume_header_fields(config, resume_changes));
    log.write(header_record(identity, config, trainer.layout(),
                            data::data_description(*source, config, config.data.data_path.empty()),
                            resumed_iteration, extra));
  }
  if (options.audit_params > 0) {
    trainer.set_audit_elements(audit_elements(trainer.layout(), options.audit_params, config.data.seed));
  }

  const std::int64_t total_iterations = config.train_updates();
  out << "production trainer (" << to_string(production.device) << ": "
      << trainer.backend().description() << "; main fp32, compute " << compute_precision << "): "
      << trainer.layout().total_elements << " parameters, " << total_iterations
      << " iterations of " << config.batch.global_batch_size << " samples x "
      << config.model.seq_length << " tokens";
  if (trainer.tensor_parallel_group().size() > 1) {
    out << " on " << trainer.tensor_parallel_group().size() << " tensor-parallel ranks ("
        << trainer.tensor_parallel_group().description()
        << (trainer.sequence_parallel() ? "; sequence parallel" : "") << ")";
    if (trainer.replicas().size() > 1 || trainer.pipeline_group().size() > 1) out << " x";
  }
  if (trainer.pipeline_group().size() > 1) {
    out << " on " << trainer.pipeline_group().size() << " pipeline stages ("
        << trainer.pipeline_group().description() << ")";
    if (trainer.replicas().size() > 1) out << " x";
  }
  if (trainer.replicas().size() > 1) {
    out << " on " << trainer.replicas().size() << " data-parallel ranks ("
        << trainer.replicas().description() << "; "
        << (trainer.distributed_optimizer() ? "distributed" : "replicated") << " optimizer)";
  }
  if (options.verbose && production.device == Device::cpu) {
    out << "\ncpu kernels: " << host_simd_name(host_simd()) << " vector path (the widest of avx512, avx2, baseline this processor has"
        << (std::getenv("TANDEM_HOST_SIMD") != nullptr ? "; chosen by TANDEM_HOST_SIMD" : "") << "), "
        << production.cpu_threads << (production.cpu_threads == 1 ? " thread" : " threads") << " per rank ("
        << (options.cpu_threads > 0 ? "--cpu-threads" : std::to_string(usable_cpu_count()) + " usable CPUs / " +
                                                              std::to_string(ranks.local_size) + " rank(s) on this node")
        << "); the same bits for every path and thread count";
  }
  out << "\ndata: " << source->summary() << "\n"
      << "tokenizer: " << data::tokenizer_summary(config.tokenizer, config.model.vocab_size) << "\n"
      << evaluation_summary(config);

  IterationDriver driver;
  driver.run_iteration = [&trainer] { return trainer.run_iteration(); };
  driver.counters = [&trainer] { return trainer.counters(); };
  if (saving) driver.save = save;
  if (validation) {
    driver.evaluate = [&trainer, &validation, &config] {
      return trainer.evaluate(validation, config.evaluation.eval_iters);
    };
  }
  if (trainer.pipeline_group().size() > 1 && options.log_pipeline_timeline) {
    driver.after_iteration = [&trainer, &config, &log, &out, &options] {
      const PipelineTimeline& timeline = *trainer.last_timeline();
      const double plan = pipeline_bubble_fraction(config.parallel.pipeline_parallel,
                                                   config.microbatches_per_replica(),
                                                   config.parallel.virtual_pipeline_stages);
      if (log.is_open()) log.write(timeline_record(timeline, config, plan));
      if (!options.quiet) {
        out << "  pipeline: " << std::fixed << std::setprecision(1) << 100.0 * timeline.idle_fraction()
            << "% idle over " << timeline.stages.size() << " stages x " << std::setprecision(3) << timeline.span()
            << " s (plan's bubble " << std::setprecision(1) << 100.0 * plan << "%)\n"
            << std::defaultfloat << std::setprecision(6) << std::flush;
      }
    };
  }
  driver.any_rank = [&trainer](bool flag) {
    const double mine = flag ? 1.0 : 0.0;
    const std::vector<double> all = all_gather_values(trainer.collectives(), std::span(&mine, 1));
    return std::any_of(all.begin(), all.end(), [](double value) { return value != 0.0; });
  };
  RunSummary summary;
  static_cast<tandem::RunSummary&>(summary) =
      drive_iterations(config, options, resumed_iteration, driver, log, out);
  summary.device = production.device;
  out << "memory: " << trainer.model().activation_bytes_per_layer() << " bytes of activations per layer and "
      << "microbatch, peak " << trainer.backend().peak_bytes_in_use() << " bytes in this rank's buffers\n";
  return summary;
}

}  // namespace tandem::production
