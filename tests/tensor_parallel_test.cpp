// Tensor parallelism's parts on the cpu backend (production/tensor_parallel.hpp,
// tensor_parallel_comm.hpp, the vocabulary-parallel ops of kernels/embedding.hpp and
// cross_entropy.hpp).
//
// Kinds of comparison:
//   - exact: the split tiles the model (every element of the whole model on exactly one TP rank,
//     replicated tensors on all), initial values, the embedding's parts (one term per position is
//     not zero), exchanges of integers, the rank order of sums, one TP rank's cross-entropy
//     against the fused one (the same operations);
//   - approximate: the vocabulary-parallel cross-entropy at 2-4 ranks against the fused one on
//     the whole vocabulary, within the bound derived at the test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/init.hpp"
#include "core/pipeline_layout.hpp"
#include "production/backend.hpp"
#include "production/collectives/thread_group.hpp"
#include "production/tensor_parallel.hpp"
#include "production/tensor_parallel_comm.hpp"

namespace tandem {
namespace {

using production::TensorParallelLayout;
using production::TensorSplit;

// 2 layers, d 16, 4 heads in `groups` groups, F 24, padded vocabulary 384.
ModelConfig small_model(bool bias, bool tied, std::int64_t groups = 4) {
  ModelConfig model;
  model.num_layers = 2;
  model.hidden_size = 16;
  model.num_attention_heads = 4;
  model.num_query_groups = groups;
  model.ffn_hidden_size = 24;
  model.seq_length = 8;
  model.padded_vocab_size = 384;
  model.add_bias_linear = bias;
  model.tie_embeddings = tied;
  return model;
}

TEST(TensorParallelLayout, EveryElementOfTheModelIsOnExactlyOneRankAndReplicatedTensorsOnAll) {
  for (const bool bias : {false, true}) {
    for (const bool tied : {false, true}) {
      for (const int ranks : {1, 2, 4}) {
        const ModelConfig model = small_model(bias, tied);
        const ModelLayout full = make_model_layout(model);
        std::vector<int> holders(static_cast<std::size_t>(full.total_elements), 0);
        for (int rank = 0; rank < ranks; ++rank) {
          const TensorParallelLayout split(model, ranks, rank);
          ASSERT_EQ(split.local().tensors.size(), full.tensors.size());
          std::int64_t local = 0;  // local order is full order: the ranges fill the local buffer in turn
          for (const FlatRange& range : split.full_ranges(FlatRange{0, split.local().total_elements})) {
            for (std::int64_t flat = range.begin; flat < range.begin + range.count; ++flat) {
              ++holders[static_cast<std::size_t>(flat)];
              ASSERT_EQ(split.local_index(flat), local) << "rank " << rank << " element " << flat;
              ++local;
            }
          }
          EXPECT_EQ(local, split.local().total_elements);
        }
        for (std::size_t t = 0; t < full.tensors.size(); ++t) {
          const TensorParallelLayout split(model, ranks, 0);
          const int expected = split.shard(static_cast<std::int64_t>(t)).split == TensorSplit::replicated ? ranks : 1;
          const ParameterTensor& tensor = full.tensors[t];
          for (std::int64_t e = 0; e < tensor.numel; ++e) {
            ASSERT_EQ(holders[static_cast<std::size_t>(tensor.offset + e)], expected)
                << tensor.name << "[" << e << "] at TP " << ranks;
          }
        }
      }
    }
  }
}

TEST(TensorParallelLayout, MegatronsSplitOfEachTensor) {
  const ModelConfig model = small_model(true, false, 2);
  const TensorParallelLayout split(model, 2, 1);
  const ModelLayout& full = split.full();
  const LayerTensorIndices& layer = full.layers[0];
  const std::int64_t hd = model.head_dim();  // 4
  const auto shard = [&](std::int64_t index) { return split.shard(index); };
  // Column-parallel: rows; rank 1 holds heads 2, 3 (hd rows each) and group 1.
  EXPECT_EQ(shard(layer.q_weight).split, TensorSplit::rows);
  EXPECT_EQ(shard(layer.q_weight).row_begin, 2 * hd);
  EXPECT_EQ(shard(layer.q_weight).rows, 2 * hd);
  EXPECT_EQ(shard(layer.k_weight).row_begin, 1 * hd);
  EXPECT_EQ(shard(layer.v_bias).rows, 1 * hd);
  EXPECT_EQ(shard(layer.gate_weight).row_begin, 24 / 2);
  // Row-parallel: columns; their biases whole.
  EXPECT_EQ(shard(layer.o_weight).split, TensorSplit::columns);
  EXPECT_EQ(shard(layer.o_weight).column_begin, 2 * hd);
  EXPECT_EQ(shard(layer.down_weight).columns, 24 / 2);
  EXPECT_EQ(shard(layer.o_bias).split, TensorSplit::replicated);
  EXPECT_EQ(shard(layer.down_bias).split, TensorSplit::replicated);
  EXPECT_EQ(shard(layer.input_norm).split, TensorSplit::replicated);
  // Vocabulary-parallel.
  EXPECT_EQ(shard(full.embedding).row_begin, 384 / 2);
  EXPECT_EQ(shard(full.output).rows, 384 / 2);
  EXPECT_EQ(split.vocab_begin(), 192);
  EXPECT_EQ(split.heads(), 2);
  EXPECT_EQ(split.groups(), 1);
  EXPECT_EQ(split.ffn(), 12);
}

TEST(TensorParallelLayout, EachRanksInitialWeightsAreTheWholeModelsAtTheirIndices) {
  // SPEC 4 / 13: the same seed gives the same full tensors for every TP.
  const ModelConfig model = small_model(true, false);
  const std::vector<float> whole = initial_parameters(model, 77);
  for (const int ranks : {2, 4}) {
    for (int rank = 0; rank < ranks; ++rank) {
      const TensorParallelLayout split(model, ranks, rank);
      const std::vector<float> mine = split.initial_parameters(model, 77);
      std::int64_t local = 0;
      for (const FlatRange& range : split.full_ranges(FlatRange{0, split.local().total_elements})) {
        for (std::int64_t flat = range.begin; flat < range.begin + range.count; ++flat, ++local) {
          ASSERT_EQ(mine[static_cast<std::size_t>(local)], whole[static_cast<std::size_t>(flat)]);
        }
      }
    }
  }
}

// Pipeline stages (the layout's class comment): over TP x PP ranks, every element of the whole
// model is held by exactly the ranks expected (one per TP block; all TP ranks of its stage for a
// replicated tensor; and the last stage's copy of a tied embedding), a stage holds exactly its
// layers' tensors, and the ranks that count an element (SPEC 6: once) cover the model exactly once.
TEST(TensorParallelLayout, PipelineStagesHoldTheirLayersAndCountEveryElementOnce) {
  for (const bool tied : {false, true}) {
    for (const auto& [pipeline, chunks] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}, std::pair{4, 2}}) {
      for (const int ranks : {1, 2}) {
        ModelConfig model = small_model(true, tied, 2);
        model.num_layers = 8;
        const ModelLayout full = make_model_layout(model);
        const PipelineStages stages(PipelineSplit{model.num_layers, pipeline, chunks});
        std::vector<int> holders(static_cast<std::size_t>(full.total_elements), 0);
        std::vector<int> counters(static_cast<std::size_t>(full.total_elements), 0);
        for (int stage = 0; stage < pipeline; ++stage) {
          for (int rank = 0; rank < ranks; ++rank) {
            const TensorParallelLayout split(model, ranks, rank, stages, stage);
            ASSERT_EQ(split.local().tensors.size(), full.tensors.size());
            for (std::size_t layer = 0; layer < full.layers.size(); ++layer) {
              const bool mine = stages.stage_of_layer(static_cast<std::int64_t>(layer)) == stage;
              EXPECT_EQ(split.holds(full.layers[layer].q_weight), mine) << "layer " << layer << " stage " << stage;
              EXPECT_EQ(split.holds(full.layers[layer].post_norm), mine) << "layer " << layer << " stage " << stage;
            }
            const bool last = stage == pipeline - 1;
            EXPECT_EQ(split.holds(full.embedding), stage == 0 || (tied && last));
            EXPECT_EQ(split.holds(full.final_norm), last);
            EXPECT_EQ(split.tied_embedding_ranges().empty(), !(tied && (stage == 0 || last)));
            EXPECT_EQ(split.counts_embedding(), !(tied && last));
            // Which local ranges this rank does not count: TP's replicated copies past rank 0, and
            // the last stage's tied copy.
            std::vector<FlatRange> not_counted = rank == 0 ? std::vector<FlatRange>{} : split.replicated_ranges();
            if (!split.counts_embedding()) {
              for (const FlatRange& range : split.tied_embedding_ranges()) not_counted.push_back(range);
            }
            std::int64_t local = 0;
            for (const FlatRange& range : split.full_ranges(FlatRange{0, split.local().total_elements})) {
              for (std::int64_t flat = range.begin; flat < range.begin + range.count; ++flat, ++local) {
                ASSERT_EQ(split.local_index(flat), local) << "stage " << stage << " rank " << rank;
                ++holders[static_cast<std::size_t>(flat)];
                const bool skipped = std::any_of(not_counted.begin(), not_counted.end(), [&](const FlatRange& r) {
                  return local >= r.begin && local < r.begin + r.count;
                });
                if (!skipped) ++counters[static_cast<std::size_t>(flat)];
              }
            }
            EXPECT_EQ(local, split.local().total_elements);
          }
        }
        for (std::size_t t = 0; t < full.tensors.size(); ++t) {
          const TensorParallelLayout split(model, ranks, 0);
          int expected = split.shard(static_cast<std::int64_t>(t)).split == TensorSplit::replicated ? ranks : 1;
          if (tied && static_cast<std::int64_t>(t) == full.embedding) expected *= 2;  // first and last stage
          const ParameterTensor& tensor = full.tensors[t];
          for (std::int64_t e = 0; e < tensor.numel; ++e) {
            ASSERT_EQ(holders[static_cast<std::size_t>(tensor.offset + e)], expected)
                << tensor.name << "[" << e << "] at TP " << ranks << " PP " << pipeline << " v " << chunks;
            ASSERT_EQ(counters[static_cast<std::size_t>(tensor.offset + e)], 1)
                << tensor.name << "[" << e << "] at TP " << ranks << " PP " << pipeline << " v " << chunks;
          }
        }
      }
    }
  }
}

TEST(TensorParallelLayout, RefusesASplitThatIsNotEven) {
  ModelConfig model = small_model(false, false);
  model.ffn_hidden_size = 26;
  EXPECT_THROW(TensorParallelLayout(model, 4, 0), std::invalid_argument);
  try {
    TensorParallelLayout(model, 4, 0);
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("--ffn-hidden-size"), std::string::npos) << error.what();
  }
}

// --- The exchanges (threads of one process) ---

TEST(TensorParallelComm, SumsInRankOrderAndEveryRankHoldsTheSameBits) {
  // Values whose sum depends on the order of the additions: in rank order ((2^24 + 1) + 1) + ...
  // loses every 1 (round to even), any other order may keep some.
  for (const int ranks : {2, 3, 4}) {
    const auto group = production::make_thread_group(ranks);
    constexpr std::int64_t kCount = 12;  // [ranks x parts] for the reduce-scatter: 12 divides by 2, 3, 4
    std::vector<std::vector<float>> reduced(static_cast<std::size_t>(ranks));
    std::vector<std::vector<float>> scattered(static_cast<std::size_t>(ranks));
    production::run_thread_group(group, [&](int rank) {
      auto backend = production::make_host_backend();
      production::TensorParallelComm comm(*backend, group[static_cast<std::size_t>(rank)], kCount);
      std::vector<float> values(kCount);
      for (std::int64_t i = 0; i < kCount; ++i) values[i] = rank == 0 ? 16777216.0f : 1.0f;  // 2^24, then 1s
      production::Buffer<float> partial(*backend, kCount);
      partial.upload(values);
      production::Buffer<float> shard(*backend, kCount / ranks);
      comm.reduce_scatter(partial.data(), shard.data(), kCount);
      scattered[static_cast<std::size_t>(rank)] = shard.download();
      comm.all_reduce(partial.data(), kCount);
      reduced[static_cast<std::size_t>(rank)] = partial.download();
    });
    const float in_rank_order = [&] {
      float sum = 16777216.0f;
      for (int r = 1; r < ranks; ++r) sum += 1.0f;
      return sum;
    }();
    for (int rank = 0; rank < ranks; ++rank) {
      for (const float value : reduced[static_cast<std::size_t>(rank)]) ASSERT_EQ(value, in_rank_order);
      for (const float value : scattered[static_cast<std::size_t>(rank)]) ASSERT_EQ(value, in_rank_order);
      EXPECT_EQ(scattered[static_cast<std::size_t>(rank)].size(), static_cast<std::size_t>(kCount / ranks));
    }
  }
}

TEST(TensorParallelComm, ReduceScatterHandsEachRankItsPartAndAllGatherRestoresTheWhole) {
  constexpr int kRanks = 3;
  constexpr std::int64_t kParts = 2;  // elements per rank
  const auto group = production::make_thread_group(kRanks);
  std::vector<std::vector<float>> shards(kRanks), wholes(kRanks);
  production::run_thread_group(group, [&](int rank) {
    auto backend = production::make_host_backend();
    production::TensorParallelComm comm(*backend, group[static_cast<std::size_t>(rank)], kRanks * kParts);
    // Rank r contributes 10^r x (i + 1) to element i: every sum is an exact integer.
    std::vector<float> values(kRanks * kParts);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::pow(10.0f, static_cast<float>(rank)) * static_cast<float>(i + 1);
    production::Buffer<float> partial(*backend, kRanks * kParts);
    partial.upload(values);
    production::Buffer<float> shard(*backend, kParts);
    comm.reduce_scatter(partial.data(), shard.data(), kRanks * kParts);
    shards[static_cast<std::size_t>(rank)] = shard.download();
    production::Buffer<float> whole(*backend, kRanks * kParts);
    comm.all_gather(shard.data(), whole.data(), kParts * static_cast<std::int64_t>(sizeof(float)));
    wholes[static_cast<std::size_t>(rank)] = whole.download();
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    for (std::int64_t j = 0; j < kParts; ++j) {
      const auto i = static_cast<float>(rank * kParts + j + 1);
      EXPECT_EQ(shards[static_cast<std::size_t>(rank)][static_cast<std::size_t>(j)], 111.0f * i);  // (1 + 10 + 100) i
    }
    for (std::size_t i = 0; i < wholes[static_cast<std::size_t>(rank)].size(); ++i) {
      EXPECT_EQ(wholes[static_cast<std::size_t>(rank)][i], 111.0f * static_cast<float>(i + 1));
    }
  }
}

// --- The vocabulary-parallel ops (host twins) ---

struct LogitsCase {
  std::int64_t rows = 5;
  std::int64_t vocab = 24;  // divisible by 1, 2, 3, 4
  std::vector<float> logits;       // [rows, vocab]
  std::vector<std::int32_t> labels;
  std::vector<std::uint8_t> mask;
};

LogitsCase logits_case() {
  LogitsCase c;
  for (std::int64_t i = 0; i < c.rows * c.vocab; ++i) {
    c.logits.push_back(static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 6.0));
  }
  c.labels = {0, 23, 11, 12, 5};
  c.mask = {1, 1, 0, 1, 1};
  return c;
}

// rows x vocab: rank r's columns [r V/R, (r+1) V/R) of each row.
std::vector<float> columns_of(const LogitsCase& c, std::int64_t begin, std::int64_t count) {
  std::vector<float> out;
  for (std::int64_t row = 0; row < c.rows; ++row) {
    out.insert(out.end(), c.logits.begin() + row * c.vocab + begin, c.logits.begin() + row * c.vocab + begin + count);
  }
  return out;
}

// The three phases on `ranks` parts, the exchanges done by hand; row losses and the whole
// gradient [rows, vocab] assembled.
void vocab_parallel(const LogitsCase& c, int ranks, std::vector<float>& losses, std::vector<float>& grad) {
  using production::VocabParallelPhase;
  const std::int64_t part = c.vocab / ranks;
  std::vector<std::vector<float>> logits(static_cast<std::size_t>(ranks));
  std::vector<float> maxima(static_cast<std::size_t>(ranks * c.rows));
  std::vector<float> normalizers(maxima.size()), targets(maxima.size());
  auto params = [&](int rank, VocabParallelPhase phase) {
    production::VocabParallelCrossEntropyParams p;
    p.phase = phase;
    p.logits = logits[static_cast<std::size_t>(rank)].data();
    p.labels = c.labels.data();
    p.loss_mask = c.mask.data();
    p.rows = c.rows;
    p.vocab = part;
    p.vocab_begin = rank * part;
    p.ranks = ranks;
    p.maxima = maxima.data();
    p.normalizers = normalizers.data();
    p.targets = targets.data();
    p.loss_scale = 0.25f;
    return p;
  };
  for (int rank = 0; rank < ranks; ++rank) {
    logits[static_cast<std::size_t>(rank)] = columns_of(c, rank * part, part);
    auto p = params(rank, VocabParallelPhase::local_max);
    p.row_stats = maxima.data() + rank * c.rows;
    production::vocab_parallel_cross_entropy_host(p);
  }
  for (int rank = 0; rank < ranks; ++rank) {
    auto p = params(rank, VocabParallelPhase::local_sums);
    p.row_stats = normalizers.data() + rank * c.rows;
    p.row_targets = targets.data() + rank * c.rows;
    production::vocab_parallel_cross_entropy_host(p);
  }
  grad.assign(static_cast<std::size_t>(c.rows * c.vocab), 0.0f);
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<float> row_losses(static_cast<std::size_t>(c.rows));
    std::vector<float> part_grad(static_cast<std::size_t>(c.rows * part));
    auto p = params(rank, VocabParallelPhase::finish);
    p.row_losses = row_losses.data();
    p.logits_grad = part_grad.data();
    production::vocab_parallel_cross_entropy_host(p);
    if (rank == 0) losses = row_losses;
    for (std::size_t i = 0; i < row_losses.size(); ++i) ASSERT_EQ(row_losses[i], losses[i]) << "rank " << rank;
    for (std::int64_t row = 0; row < c.rows; ++row) {
      std::copy_n(part_grad.begin() + row * part, part, grad.begin() + row * c.vocab + rank * part);
    }
  }
}

TEST(VocabParallelCrossEntropy, OneRankIsTheFusedCrossEntropyBitForBit) {
  const LogitsCase c = logits_case();
  std::vector<float> losses, grad;
  vocab_parallel(c, 1, losses, grad);
  std::vector<float> fused_losses(static_cast<std::size_t>(c.rows)), fused_grad(c.logits.size());
  production::CrossEntropyParams fused;
  fused.logits = c.logits.data();
  fused.labels = c.labels.data();
  fused.loss_mask = c.mask.data();
  fused.row_losses = fused_losses.data();
  fused.logits_grad = fused_grad.data();
  fused.rows = c.rows;
  fused.vocab = c.vocab;
  fused.loss_scale = 0.25f;
  production::cross_entropy_host(fused);
  EXPECT_EQ(losses, fused_losses);
  EXPECT_EQ(grad, fused_grad);
}

TEST(VocabParallelCrossEntropy, SeveralRanksAgreeWithTheWholeVocabularyWithinTheBound) {
  // Approximate. The parts only regroup the fp32 sum of V terms exp(z - max) in (0, 1] (the max
  // is exact in any grouping); each grouping errs by at most gamma_V = V u / (1 - V u) of the sum,
  // so the two normalizers differ by at most 2 gamma_V S relative; the log turns that into an
  // absolute 2 gamma_V + u on lse, and lse - z and exp(z - lse) add a rounding each: loss within
  // (2 gamma_V + 3u)(1 + |lse| + |z_label|), each gradient entry within
  // 0.25 (2 gamma_V + 3u)(1 + |lse| + |z|) e^(z - lse) + u.
  const LogitsCase c = logits_case();
  std::vector<float> whole_losses, whole_grad;
  vocab_parallel(c, 1, whole_losses, whole_grad);
  const double u = std::ldexp(1.0, -24);
  const double gamma = static_cast<double>(c.vocab) * u / (1 - static_cast<double>(c.vocab) * u);
  for (const int ranks : {2, 3, 4}) {
    std::vector<float> losses, grad;
    vocab_parallel(c, ranks, losses, grad);
    for (std::int64_t row = 0; row < c.rows; ++row) {
      if (c.mask[static_cast<std::size_t>(row)] == 0) {
        EXPECT_EQ(losses[static_cast<std::size_t>(row)], 0.0f);
        for (std::int64_t v = 0; v < c.vocab; ++v) EXPECT_EQ(grad[static_cast<std::size_t>(row * c.vocab + v)], 0.0f);
        continue;
      }
      const double lse = whole_losses[static_cast<std::size_t>(row)] +
                         c.logits[static_cast<std::size_t>(row * c.vocab + c.labels[static_cast<std::size_t>(row)])];
      const double relative = 2 * gamma + 3 * u;
      const double label = std::fabs(c.logits[static_cast<std::size_t>(row * c.vocab + c.labels[static_cast<std::size_t>(row)])]);
      const double loss_bound = relative * (1 + std::fabs(lse) + label);
      EXPECT_LE(std::fabs(losses[static_cast<std::size_t>(row)] - whole_losses[static_cast<std::size_t>(row)]), loss_bound)
          << "row " << row << " at " << ranks << " ranks";
      for (std::int64_t v = 0; v < c.vocab; ++v) {
        const auto i = static_cast<std::size_t>(row * c.vocab + v);
        const double z = c.logits[i];
        const double bound = 0.25 * relative * (1 + std::fabs(lse) + std::fabs(z)) * std::exp(z - lse) + u;
        EXPECT_LE(std::fabs(grad[i] - whole_grad[i]), bound) << "row " << row << " column " << v << " at " << ranks;
      }
    }
  }
}

TEST(VocabParallelEmbedding, EachRankLooksUpItsRowsAndTheirSumIsTheWholeLookup) {
  constexpr std::int64_t kVocab = 8, kWidth = 3, kRows = 6;
  std::vector<float> table(kVocab * kWidth);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) + 0.5f;
  const std::vector<std::int32_t> tokens = {7, 0, 3, 4, 4, 1};
  std::vector<float> whole(kRows * kWidth), sum(kRows * kWidth, 0.0f);
  production::embedding_forward_host({tokens.data(), table.data(), whole.data(), kRows, kWidth, production::DType::f32});
  std::vector<float> gradient(kRows * kWidth);
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = static_cast<float>(i % 5) - 2.0f;
  std::vector<float> whole_grad(kVocab * kWidth, 0.0f), parts_grad(kVocab * kWidth, 0.0f);
  production::embedding_backward_host({tokens.data(), gradient.data(), whole_grad.data(), kRows, kWidth, kVocab, production::DType::f32});
  constexpr std::int64_t kParts = 2, kPart = kVocab / kParts;
  for (std::int64_t rank = 0; rank < kParts; ++rank) {
    std::vector<float> part(kRows * kWidth, -1.0f);
    production::EmbeddingForwardParams lookup{tokens.data(), table.data() + rank * kPart * kWidth, part.data(), kRows,
                                              kWidth, production::DType::f32};
    lookup.vocab_begin = rank * kPart;
    lookup.vocab_rows = kPart;
    production::embedding_forward_host(lookup);
    for (std::int64_t t = 0; t < kRows; ++t) {
      const bool mine = tokens[static_cast<std::size_t>(t)] / kPart == rank;
      for (std::int64_t j = 0; j < kWidth; ++j) {
        const float value = part[static_cast<std::size_t>(t * kWidth + j)];
        if (!mine) {
          EXPECT_EQ(value, 0.0f) << "token " << tokens[static_cast<std::size_t>(t)] << " on rank " << rank;
        }
        sum[static_cast<std::size_t>(t * kWidth + j)] += value;
      }
    }
    production::EmbeddingBackwardParams backward{tokens.data(), gradient.data(), parts_grad.data() + rank * kPart * kWidth,
                                                 kRows, kWidth, kPart, production::DType::f32};
    backward.vocab_begin = rank * kPart;
    production::embedding_backward_host(backward);
  }
  EXPECT_EQ(sum, whole);
  EXPECT_EQ(parts_grad, whole_grad);
}

}  // namespace
}  // namespace tandem
