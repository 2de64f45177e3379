// Megatron's tensor-parallel split of the model (docs/PRODUCTION.md "Tensor parallelism"): which
// parameter tensors a TP rank holds a block of, and where its local parameter buffer sits in the
// full one (core/model_layout.hpp, the checkpoint's flat layout).
//
//   tensor                      split     rank t of TP holds
//   embed_tokens, lm_head       rows      vocabulary rows [t V/TP, (t+1) V/TP)     (vocab-parallel)
//   q_proj (and its bias)       rows      query heads [t H/TP, (t+1) H/TP), hd rows each (column-parallel)
//   k_proj, v_proj (and biases) rows      key/value groups [t G/TP, (t+1) G/TP)   (column-parallel);
//                                         with G < TP the one group t / (TP/G), whole, on each
//                                         of the TP/G ranks that share it (replicated, Megatron 0.19)
//   gate_proj, up_proj (biases) rows      hidden units [t F/TP, (t+1) F/TP)       (column-parallel)
//   o_proj                      columns   the inputs of its heads                 (row-parallel)
//   down_proj                   columns   the inputs of its hidden units          (row-parallel)
//   norms, o/down biases        none      the whole tensor (replicated)
// A rank t's query heads use exactly the groups it holds (head j uses group j / (H/G)), so
// attention needs no exchange. The local buffer holds the same tensors, under the same names and
// in the same order, with the local shapes; every TP rank's local layout is the same.
//
// Pipeline parallelism (core/pipeline_layout.hpp): a rank of pipeline stage p holds only its
// stage's tensors (the embedding on stage 0; its chunks' layers; the final norm and output layer
// on the last stage); every other tensor keeps its index with no elements, so each stage indexes
// tensors as the full layout does. With tied embeddings the last stage (PP > 1) also holds the
// embedding, its own copy as the output layer: the two copies' gradients are summed over the
// embedding group, and stage 0 counts and saves the elements (SPEC 6: every element once).
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/model_layout.hpp"
#include "core/pipeline_layout.hpp"
#include "core/train/main_state.hpp"
#include "production/arithmetic.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

enum class TensorSplit { replicated, rows, columns };

// A rank's block of one full tensor, viewed as [rows, columns] (a 1-D tensor of n elements is
// [n, 1]); row-major in both the full and the local buffer.
struct TensorShard {
  TensorSplit split = TensorSplit::replicated;
  std::int64_t full_rows = 0;
  std::int64_t full_columns = 0;
  std::int64_t row_begin = 0;     // of the block, in the full tensor
  std::int64_t rows = 0;
  std::int64_t column_begin = 0;
  std::int64_t columns = 0;
};

class TensorParallelLayout {
 public:
  TensorParallelLayout() = default;
  // Rank `rank` of `size` TP ranks. Throws std::invalid_argument naming the field when H, G, F or
  // the padded vocabulary is not divisible by `size`.
  TensorParallelLayout(const ModelConfig& config, int size, int rank);
  // The same on pipeline rank `stage` of `stages` (the class comment).
  TensorParallelLayout(const ModelConfig& config, int size, int rank, const PipelineStages& stages,
                       std::int64_t stage);

  int size() const { return size_; }
  int rank() const { return rank_; }
  std::int64_t pipeline_stage() const { return stage_; }
  std::int64_t pipeline_size() const { return pipeline_size_; }
  // Whether this rank holds elements of full tensor `tensor` (its stage's tensors).
  bool holds(std::int64_t tensor) const { return local_.tensors.at(static_cast<std::size_t>(tensor)).numel > 0; }
  // PP > 1 with tied embeddings, on the first or the last stage: the local flat range of its copy
  // of the embedding (the embedding group sums the two copies' gradients); empty otherwise.
  std::vector<FlatRange> tied_embedding_ranges() const;
  // Whether this rank counts and saves the embedding's elements: not the last stage's tied copy.
  bool counts_embedding() const { return !tied_copy_; }
  const ModelLayout& full() const { return full_; }    // TP = 1's layout (checkpoints, exports)
  const ModelLayout& local() const { return local_; }  // this rank's parameters
  const TensorShard& shard(std::int64_t tensor) const { return shards_.at(static_cast<std::size_t>(tensor)); }

  // This rank's widths: query heads, key/value groups, MLP hidden units, vocabulary rows (and the
  // first vocabulary row it holds).
  std::int64_t heads() const { return heads_; }
  std::int64_t groups() const { return groups_; }
  std::int64_t ffn() const { return ffn_; }
  std::int64_t vocab_rows() const { return vocab_rows_; }
  std::int64_t vocab_begin() const { return vocab_begin_; }

  // The full buffer's flat ranges that the local flat range `local` holds, in increasing order
  // (local order is full order): one per row of a column-split tensor's block, one per run of
  // whole rows otherwise.
  std::vector<FlatRange> full_ranges(const FlatRange& local) const;
  // The local flat index of the whole model's flat element `full`, or -1 when this rank does not
  // hold it (a replicated tensor's elements are held by every rank).
  std::int64_t local_index(std::int64_t full) const;
  // The local flat ranges of the replicated tensors (norm weights, row-parallel biases), in
  // order: with sequence parallelism their gradients are partial per rank and are summed over
  // TP; the norm counts them on TP rank 0 only (SPEC 6: every element once).
  std::vector<FlatRange> replicated_ranges() const;

  // G < TP: how many TP ranks hold each key/value group (TP/G; 1 when G >= TP), whether this rank
  // is the first of them (it counts and saves their elements: SPEC 6, every element once), and
  // the local flat ranges of those tensors. Each holder computes its group's keys and values
  // alike, but its gradient only from its own query heads: the holders' gradients are summed
  // (production/trainer_gradients.cpp).
  int kv_sharing() const { return kv_sharing_; }
  bool first_kv_holder() const { return rank_ % kv_sharing_ == 0; }
  std::int64_t kv_group_begin() const { return kv_group_begin_; }  // the first group it holds
  std::vector<FlatRange> kv_shared_ranges() const;

  // This rank's initial parameters [local().total_elements]: each element the full tensor's
  // value at its full index (core/init.hpp), so every TP size starts from the same weights.
  std::vector<Real> initial_parameters(const ModelConfig& config, std::uint64_t seed) const;

 private:
  int size_ = 1;
  int rank_ = 0;
  std::int64_t stage_ = 0;
  std::int64_t pipeline_size_ = 1;
  bool tied_copy_ = false;  // the last stage's copy of a tied embedding (PP > 1)
  ModelLayout full_;
  ModelLayout local_;
  std::vector<TensorShard> shards_;  // [tensors]
  std::int64_t heads_ = 0;
  std::int64_t groups_ = 0;
  std::int64_t ffn_ = 0;
  std::int64_t vocab_rows_ = 0;
  std::int64_t vocab_begin_ = 0;
  int kv_sharing_ = 1;
  std::int64_t kv_group_begin_ = 0;
  std::vector<std::int64_t> kv_shared_;  // tensors whose rows the TP/G holders share (G < TP)
};

}  // namespace tandem::production
