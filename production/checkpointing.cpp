// Production trainer state <-> checkpoint (checkpointing.hpp), through the shared main-state
// conversion (core/checkpoint/main_state.hpp) plus the compute precision.
#include "production/checkpointing.hpp"

#include "core/checkpoint/main_state.hpp"

namespace tandem::production {

checkpoint::CheckpointState make_checkpoint_state(const Trainer& trainer) {
  checkpoint::CheckpointState out = checkpoint::make_main_checkpoint(
      "production", trainer.config(), trainer.layout(), trainer.host_state());
  out.extra = {{"compute_precision", trainer.compute_dtype() == DType::bf16 ? "bf16" : "fp32"}};
  return out;
}

void restore_checkpoint_state(Trainer& trainer, const checkpoint::CheckpointState& saved) {
  trainer.restore(checkpoint::read_main_checkpoint<float>("production", trainer.config(),
                                                          trainer.layout(), saved));
}

}  // namespace tandem::production
