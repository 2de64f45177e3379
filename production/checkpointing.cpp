// Production trainer state <-> checkpoint (checkpointing.hpp), through the shared main-state
// conversion (core/checkpoint/main_state.hpp) and the sharded format (core/checkpoint/sharded.hpp).
#include "production/checkpointing.hpp"

#include "core/checkpoint/main_state.hpp"
#include "core/checkpoint/sharded.hpp"
#include "production/collectives/collectives.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

constexpr const char* kEngine = "production";

nlohmann::json extra_of(const Trainer& trainer) {
  return {{"compute_precision", trainer.compute_dtype() == DType::bf16 ? "bf16" : "fp32"}};
}

}  // namespace

checkpoint::CheckpointState make_checkpoint_state(const Trainer& trainer) {
  checkpoint::CheckpointState out =
      checkpoint::make_main_checkpoint(kEngine, trainer.config(), trainer.layout(), trainer.host_state());
  out.extra = extra_of(trainer);
  return out;
}

void restore_checkpoint_state(Trainer& trainer, const checkpoint::CheckpointState& saved) {
  trainer.restore(checkpoint::read_main_checkpoint<Real>(kEngine, trainer.config(), trainer.layout(), saved));
}

std::filesystem::path save_trainer_checkpoint(const Trainer& trainer, const std::filesystem::path& save_dir,
                                              const checkpoint::SaveHooks& hooks) {
  Collectives& collectives = trainer.collectives();
  if (collectives.size() == 1) return checkpoint::save_checkpoint(save_dir, make_checkpoint_state(trainer), hooks);
  checkpoint::CheckpointState state =
      checkpoint::main_checkpoint_metadata<Real>(kEngine, trainer.config(), trainer.counters());
  state.extra = extra_of(trainer);
  const checkpoint::RankExchange ranks{collectives.rank(), collectives.size(), [&collectives](const std::string& text) {
                                         return all_gather_strings(collectives, text);
                                       }};
  return checkpoint::save_sharded_checkpoint(save_dir, state, trainer.layout(), trainer.shard_pieces(), ranks, hooks);
}

std::vector<checkpoint::SettingChange> resume_trainer_from(Trainer& trainer, const std::filesystem::path& load_dir) {
  const std::filesystem::path directory = checkpoint::resolve_checkpoint_directory(load_dir);
  const checkpoint::CheckpointState saved = checkpoint::load_checkpoint(directory, {.iteration = {}, .read_optimizer = false, .read_tensors = false});
  auto changes = checkpoint::check_main_checkpoint<Real>(kEngine, trainer.config(), saved);
  trainer.restore(checkpoint::read_main_state_pieces(directory, trainer.layout(), trainer.state_ranges()),
                  saved.counters);
  return changes;
}

}  // namespace tandem::production
