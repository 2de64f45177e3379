// Reference trainer state <-> checkpoint (checkpointing.hpp), through the shared main-state
// conversion (core/checkpoint/main_state.hpp).
#include "reference/checkpointing.hpp"

#include "core/checkpoint/main_state.hpp"

namespace tandem::reference {

checkpoint::CheckpointState make_checkpoint_state(const Trainer<double>& trainer) {
  return checkpoint::make_main_checkpoint("reference", trainer.config(), trainer.layout(),
                                          trainer.state());
}

void restore_checkpoint_state(Trainer<double>& trainer, const checkpoint::CheckpointState& saved) {
  trainer.state() = checkpoint::read_main_checkpoint<double>("reference", trainer.config(),
                                                             trainer.layout(), saved);
}

}  // namespace tandem::reference
