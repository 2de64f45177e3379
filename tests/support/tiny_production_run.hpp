// The production tests' tiny model and data: 2 layers, d 32, ffn 64, 4 heads in 2 groups, seq 32,
// the padded byte vocabulary; documents from 1 token to longer than a window, so windows hold
// EODs at varied places (tests/production_trainer_test.cpp, production_data_parallel_test.cpp).
#pragma once

#include <cstdint>

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

// The tiny model on `ranks` data-parallel replicas, mbs 1, the global batch `gbs`, samples for 8
// updates, every other setting at its default: the runs of the data-parallel and evaluation
// tests, which set their optimizer and schedule on top.
inline RunConfig tiny_data_parallel_run(std::int64_t ranks, std::int64_t gbs) {
  RunConfig config;
  config.model = tiny_production_model();
  config.batch.micro_batch_size = 1;
  config.batch.global_batch_size = gbs;
  config.parallel.data_parallel = ranks;
  config.parallel.world_size = ranks;
  config.schedule.train_samples = 8 * gbs;
  config.schedule.lr_decay_samples = 8 * gbs;
  return config;
}

inline StreamSamples tiny_production_samples() {
  StreamSamples samples;
  samples.stream = document_stream({5, 1, 23, 9, 70, 3, 17, 2, 40, 12}, 200, 7);
  samples.seq_length = 32;
  return samples;
}

}  // namespace tandem::testing
