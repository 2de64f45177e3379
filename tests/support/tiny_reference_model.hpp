// The reference-side tests' tiny model (tests/reference_trainer_test.cpp, error_bounds_test.cpp):
// 2 layers, width 16, ffn 32, 4 heads in 2 groups, 16 positions, every other field at its default.
#pragma once

#include "core/config.hpp"

namespace tandem::testing {

inline ModelConfig tiny_reference_model() {
  ModelConfig model;
  model.num_layers = 2;
  model.hidden_size = 16;
  model.ffn_hidden_size = 32;
  model.num_attention_heads = 4;
  model.num_query_groups = 2;
  model.seq_length = 16;
  return model;
}

}  // namespace tandem::testing
