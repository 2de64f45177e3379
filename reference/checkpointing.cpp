// Reference trainer state <-> checkpoint (checkpointing.hpp), through the shared main-state
// conversion (core/checkpoint/main_state.hpp).
#include "reference/checkpointing.hpp"

#include "core/checkpoint/main_state.hpp"

namespace tandem::reference {

checkpoint::CheckpointState make_checkpoint_state(const Trainer<double>& trainer) {
  return checkpoint::make_main_checkpoint("reference", trainer.config(), trainer.layout(),
                                          trainer.state());
}

std::vector<checkpoint::SettingChange> restore_checkpoint_state(Trainer<double>& trainer,
                                                                const checkpoint::CheckpointState& saved) {
  auto changes = checkpoint::check_main_checkpoint<double>("reference", trainer.config(), saved);
  trainer.state() = checkpoint::read_main_state_widened(trainer.layout(), saved);  // F64: exact
  return changes;
}

}  // namespace tandem::reference
