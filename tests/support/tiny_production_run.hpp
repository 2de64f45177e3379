// The production tests' tiny model and data: 2 layers, d 32, ffn 64, 4 heads in 2 groups, seq 32,
// the padded byte vocabulary; documents from 1 token to longer than a window, so windows hold
// EODs at varied places (tests/production_trainer_test.cpp, production_data_parallel_test.cpp).
#pragma once

#include "core/config.hpp"
#include "tests/support/synthetic_data.hpp"

namespace tandem::testing {

inline ModelConfig tiny_production_model() {
  ModelConfig model;
  model.num_layers = 2;
  model.hidden_size = 32;
  model.ffn_hidden_size = 64;
  model.num_attention_heads = 4;
  model.num_query_groups = 2;
  model.seq_length = 32;
  model.padded_vocab_size = 384;
  return model;
}

inline StreamSamples tiny_production_samples() {
  StreamSamples samples;
  samples.stream = document_stream({5, 1, 23, 9, 70, 3, 17, 2, 40, 12}, 200, 7);
  samples.seq_length = 32;
  return samples;
}

}  // namespace tandem::testing
