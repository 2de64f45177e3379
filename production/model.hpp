// The production decoder (SPEC 4, 5) over backend ops: one microbatch's forward, chunked fused
// cross-entropy and backward, adding fp32 weight gradients into the main-gradient buffer. The
// same computation as reference/model.cpp, batched over the microbatch's samples (rows =
// mbs x seq), with activations in the compute dtype and every GEMM accumulating in fp32.
//
// Tensor parallelism (DecoderOptions::tensor_parallel; production/tensor_parallel.hpp): this
// rank's blocks of the weights, Megatron's column- and row-parallel layers, the vocabulary-
// parallel embedding and cross-entropy, and the exchanges of tensor_parallel_comm.hpp:
//   - without sequence parallelism the residual stream and the norms are whole on every TP rank
//     (computed alike, bit for bit); the row-parallel outputs and the column-parallel input
//     gradients are summed over TP (all-reduce);
//   - with --sequence-parallel the residual stream, the norms and the residual adds hold this
//     rank's part of the rows (rows / TP consecutive rows: with mbs 1 exactly Megatron's s / TP
//     positions); a column-parallel layer all-gathers its input (again in backward, for its
//     weight gradient: only the part is kept), a row-parallel layer reduce-scatters its output,
//     and the backward does the reverse. The replicated weights' gradients (norms, row-parallel
//     biases) are then partial per rank: the trainer sums them over TP.
//
// Pipeline parallelism (DecoderOptions::pipeline): this rank runs the layers of its stage's model
// chunks (core/pipeline_layout.hpp), one chunk of one microbatch at a time, in the order the
// trainer's schedule gives (core/pipeline_schedule.hpp). A chunk that does not start the
// model reads the residual stream the trainer received into stream(), and one that does not end
// it leaves its output there to send; the backward reads and leaves the stream's gradient in
// stream_grad() the same way (with sequence parallelism each TP rank's part). Each microbatch in
// flight keeps its inputs and its layers' activations in an activation slot.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "core/pipeline_layout.hpp"
#include "production/arithmetic.hpp"
#include "production/backend.hpp"
#include "production/collectives/collectives.hpp"
#include "production/step_hooks.hpp"
#include "production/tensor_parallel.hpp"
#include "production/tensor_parallel_comm.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// What one block's forward keeps for its backward (rows = mbs x seq; stream rows = rows, or
// rows / TP with sequence parallelism; H, G, F: this TP rank's heads, groups, hidden units).
struct BlockActivations {
  ComputeBuffer block_input;    // [stream rows, d] residual stream entering the block
  Buffer<Real> attn_inverse_rms;  // [stream rows]
  ComputeBuffer attn_normed;    // [stream rows, d]
  ComputeBuffer query;          // [rows, H*hd] after RoPE
  ComputeBuffer key;            // [rows, G*hd] after RoPE
  ComputeBuffer value;          // [rows, G*hd]
  ComputeBuffer context;        // [rows, H*hd] attention output
  Buffer<Real> logsumexp;      // [rows, H]
  ComputeBuffer mid;            // [stream rows, d] after the attention residual add
  Buffer<Real> mlp_inverse_rms;  // [stream rows]
  ComputeBuffer mlp_normed;     // [stream rows, d]
  ComputeBuffer gate;           // [rows, F]
  ComputeBuffer up;             // [rows, F]
  ComputeBuffer hidden;         // [rows, F] silu(gate) * up
};

struct DecoderOptions {
  std::int64_t micro_batch_size = 1;  // samples per microbatch
  // Rows of fp32 logits alive at once in the fused cross-entropy; 0 = as many as fit in
  // kLogitsChunkBytes (default_logits_chunk_rows, core/model_layout.hpp).
  std::int64_t logits_chunk_rows = 0;
  DType compute = DType::f32;
  // Tensor parallelism: this rank's split and its TP group's exchanges (both null: TP = 1; both
  // must outlive the model), and Megatron's --sequence-parallel.
  const TensorParallelLayout* tensor_parallel = nullptr;
  TensorParallelComm* tensor_parallel_comm = nullptr;
  bool sequence_parallel = false;
  // Pipeline parallelism: the stages (null: PP = 1; must outlive the model) and this rank's stage;
  // how many microbatches the schedule keeps in flight at once (activation slots: their inputs),
  // and how many (microbatch, model chunk) pairs (chunk slots: a chunk's layers' activations;
  // core/pipeline_schedule.hpp chunk_activation_slots). With one chunk a rank the two are equal.
  const PipelineStages* pipeline = nullptr;
  std::int64_t pipeline_stage = 0;
  std::int64_t activation_slots = 1;
  std::int64_t chunk_slots = 1;
  // Megatron's full recomputation (core/config.hpp RecomputeConfig): a recomputed group of layers
  // keeps only its input in the slot; its backward first reruns the group's forward into scratch
  // activations (recomputed_), bit for bit the first forward's. Selective stores what none does.
  RecomputeConfig recompute;
  // The trainer's hook points (step_hooks.hpp) for tensor parallelism's negative controls; null:
  // the identity.
  const StepHooks* hooks = nullptr;
};

// Where the trainer's overlap (trainer.hpp) meets the model: flat ranges [begin, end) of the
// parameter buffer, each a stage of the model (the embedding; one layer's tensors; the final norm
// and an untied output projection), reported in the order the model reaches them.
struct ModelHooks {
  // The forward is about to read the compute weights of [begin, end) for the first time.
  std::function<void(std::int64_t begin, std::int64_t end)> before_weights;
  // The backward has added its last contribution to the main gradients of [begin, end).
  std::function<void(std::int64_t begin, std::int64_t end)> gradients_done;
};

class DecoderModel {
 public:
  DecoderModel(const ModelConfig& config, const ModelLayout& layout, Backend& backend,
               const DecoderOptions& options);

  // One microbatch's passes, in the order the trainer's schedule gives (pipeline_schedule.hpp;
  // with one stage: begin, forward, backward per microbatch): the inputs of `samples` into
  // activation slot `slot` (a malformed sample throws std::invalid_argument, as the reference);
  // one model chunk's forward of that slot's microbatch (the input in stream() unless the chunk
  // starts the model; the output left in stream()), keeping its layers' activations in chunk slot
  // `chunk_slot` until the same chunk's backward; the loss alone (evaluation, through the
  // loss-only cross-entropy: the same row losses bit for bit, no gradient touched; the chunk that
  // ends the model, right after its forward); and one chunk's backward, which adds
  // d(loss_scale x masked CE sum)/d(weights) into main_grads [N] (with the loss and row_losses
  // [mbs*seq] first when it ends the model, else from the gradient in stream_grad(); the input's
  // gradient left in stream_grad() unless it starts the model). compute_weights is the flat
  // compute-typed weight buffer [N].
  void begin_microbatch(const std::vector<Sample>& samples, std::int64_t slot);
  void forward_chunk(const void* compute_weights, std::int64_t slot, std::int64_t chunk, std::int64_t chunk_slot);
  void chunk_loss(const void* compute_weights, std::int64_t slot, Real* row_losses);
  void backward_chunk(const void* compute_weights, std::int64_t slot, std::int64_t chunk, std::int64_t chunk_slot,
                      Real loss_scale, Real* main_grads, Real* row_losses);
  // This rank's part of the residual stream and of its gradient, [stream rows, d] each: what
  // pipeline stages send and receive (stream_bytes() bytes).
  void* stream() { return stream_.data(); }
  void* stream_grad() { return stream_grad_.data(); }
  std::int64_t stream_bytes() const;
  std::int64_t activation_slots() const { return static_cast<std::int64_t>(slots_.size()); }
  std::int64_t chunk_slots() const { return static_cast<std::int64_t>(chunk_slots_.size()); }
  std::int64_t chunks() const { return pipeline_ ? pipeline_->virtual_stages() : 1; }
  bool starts_model(std::int64_t chunk) const;
  bool ends_model(std::int64_t chunk) const;

  // Called by the passes until replaced; empty functions are skipped.
  void set_hooks(ModelHooks hooks) { hooks_ = std::move(hooks); }

  std::int64_t rows() const { return rows_; }
  std::int64_t logits_chunk_rows() const { return chunk_rows_; }
  // Bytes of backend memory the model keeps from a layer's forward for its backward (one whole
  // BlockActivations, as without recomputation); what every chunk slot's layers keep plus the
  // recompute scratch (the plan's activations without the logits); and in all (activations,
  // inputs, scratch): docs/PRODUCTION.md "Memory".
  std::int64_t activation_bytes_per_layer() const;
  std::int64_t stored_activation_bytes() const;
  std::int64_t allocated_bytes() const { return allocated_bytes_; }

 private:
  // One microbatch's inputs, read by every chunk's passes.
  struct ActivationSlot {
    Buffer<std::int32_t> tokens;           // [rows]
    Buffer<std::int32_t> labels;           // [rows]
    Buffer<std::uint8_t> loss_mask;        // [rows]
    Buffer<std::int32_t> positions;        // [rows]
    Buffer<std::int32_t> attention_start;  // [rows] within each sample
    Buffer<Real> rope_cosines;            // [rows, hd/2]
    Buffer<Real> rope_sines;              // [rows, hd/2]
  };
  // What one model chunk's layers keep from a microbatch's forward for its backward, by the
  // layer's place in its chunk (the chunks of a rank share the recomputation's pattern).
  struct ChunkSlot {
    std::vector<BlockActivations> blocks;  // [this rank's largest chunk's layers]
  };
  ActivationSlot& current() { return slots_[static_cast<std::size_t>(slot_)]; }  // the pass's slot
  // The pass's chunk slot's activations of `layer` (a layer of the pass's chunk).
  BlockActivations& stored(std::int64_t chunk, std::size_t layer);
  // One layer's forward from stream_ (kept in block.block_input) into stream_, keeping what its
  // backward reads in `block`; `announce`: report the layer's weights to the hooks (not when
  // recomputing: the weights were read before).
  void layer_forward(const void* weights, std::size_t layer, BlockActivations& block, bool announce);
  // Full recomputation: whether `layer` (of `chunk`) keeps only its group's input, and the
  // activations its forward and backward use (the slot's, or the recompute scratch).
  bool recomputed(std::int64_t chunk, std::size_t layer) const;
  BlockActivations& activations_of(std::int64_t chunk, std::size_t layer);
  // Reruns the forward of the recompute group that ends at `layer` from the group's kept input.
  void recompute_group(const void* weights, std::int64_t chunk, std::size_t layer);
  void use_slot(std::int64_t slot);
  void use_chunk_slot(std::int64_t chunk_slot);
  // main_grads == nullptr: the loss alone (chunk_loss).
  void loss_and_output_backward(const void* weights, Real loss_scale, Real* main_grads,
                                Real* row_losses);


  // Linear layers in PyTorch's convention, y = x W^T + b, on `rows_` rows.
  struct Linear {
    std::int64_t weight = -1;  // tensor index in the layout
    std::int64_t bias = -1;    // -1: no bias
    std::int64_t in = 0;
    std::int64_t out = 0;
  };
  void linear_forward(const void* weights, const Linear& linear, const void* input, void* output);
  // input_grad = (accumulate ? input_grad : 0) + output_grad W (in input_grad_dtype); W and b
  // gradients += into main. The bias gradient sums `bias_rows` rows of `bias_output_grad`.
  void linear_backward(const void* weights, const Linear& linear, const void* input,
                       const void* output_grad, void* input_grad, bool accumulate,
                       Real* main_grads, DType input_grad_dtype);
  void linear_backward(const void* weights, const Linear& linear, const void* input,
                       const void* output_grad, void* input_grad, bool accumulate, Real* main_grads) {
    linear_backward(weights, linear, input, output_grad, input_grad, accumulate, main_grads, compute_);
  }

  // This rank's layers of model chunk `chunk` (all layers with PP 1).
  LayerRange chunk_layers(std::int64_t chunk) const;

  // Tensor parallelism (tp_ > 1; the class comment).
  bool tensor_parallel() const { return tp_ != nullptr && tp_->size() > 1; }
  // The whole rows of a stream-rows tensor [stream rows, d] for a column-parallel layer: the
  // tensor itself, or (sequence parallel) its parts all-gathered into gathered_.
  const void* whole_rows(const void* stream_part);
  // fp32 partial_ [rows, d] summed over TP into `output` [stream rows, d] (compute dtype):
  // reduce-scattered with sequence parallelism, else all-reduced.
  void reduce_partial_into(void* output, int sums = 1);
  // A row-parallel layer's forward: output [stream rows, d] = sum over TP of input W^T (+ b).
  void row_parallel_forward(const void* weights, const Linear& linear, const void* input, void* output);
  // The embedding's forward into stream_ (vocabulary-parallel with TP).
  void embed(const void* weights);
  // The output projection's input [rows, d] from final_normed_ (gathered with SP).
  const void* output_projection_input();
  // The fused or vocabulary-parallel cross-entropy of one chunk of logits_.
  void chunk_cross_entropy(std::int64_t first, std::int64_t chunk, Real loss_scale, void* logits_grad,
                           Real* row_losses);
  const void* weight_at(const void* weights, std::int64_t tensor_index) const;
  // The hooks' ranges: the embedding, layer `layer`, and the tail (final norm onwards).
  struct FlatSpan {
    std::int64_t begin = 0;
    std::int64_t end = 0;
  };
  FlatSpan embedding_span() const;
  FlatSpan layer_span(std::size_t layer) const;
  FlatSpan tail_span() const;
  // (A span of another pipeline stage's tensors is empty here: nothing to report.)
  void before_weights(FlatSpan span) const {
    if (hooks_.before_weights && span.begin < span.end) hooks_.before_weights(span.begin, span.end);
  }
  void gradients_done(FlatSpan span) const {
    if (hooks_.gradients_done && span.begin < span.end) hooks_.gradients_done(span.begin, span.end);
  }

  ModelHooks hooks_;
  ModelConfig config_;
  const PipelineStages* pipeline_ = nullptr;
  std::int64_t stage_ = 0;
  TensorParallelComm* tp_ = nullptr;
  bool sequence_parallel_ = false;
  const StepHooks* step_hooks_ = nullptr;
  std::int64_t heads_ = 0;        // this rank's query heads
  std::int64_t groups_ = 0;       // its key/value groups
  std::int64_t ffn_ = 0;          // its MLP hidden units
  std::int64_t vocab_ = 0;        // its vocabulary rows
  std::int64_t vocab_begin_ = 0;  // its first
  std::int64_t stream_rows_ = 0;  // rows of the residual stream on this rank
  std::int64_t allocated_bytes_ = 0;
  ModelLayout layout_;  // a copy: the model never dangles when its owner moves
  Backend& backend_;
  DType compute_;
  std::int64_t micro_batch_size_ = 1;
  std::int64_t seq_ = 0;
  std::int64_t rows_ = 0;        // mbs x seq (every position of the microbatch)
  std::int64_t chunk_rows_ = 0;  // fused cross-entropy chunk
  Real epsilon_ = 0.0f;         // --norm-epsilon as fp32
  Real attention_scale_ = 0.0f; // 1/sqrt(hd) as fp32

  std::vector<ActivationSlot> slots_;  // [activation slots]
  std::vector<ChunkSlot> chunk_slots_;  // [chunk slots]
  std::int64_t chunk_slot_ = 0;         // the chunk slot of the pass in progress
  RecomputeConfig recompute_;
  std::vector<BlockActivations> recomputed_;  // [largest recompute group] scratch (full recompute)
  std::int64_t slot_ = 0;               // the slot of the pass in progress
  ComputeBuffer stream_;                  // [stream rows, d] residual stream (final norm's input)
  ComputeBuffer branch_;                  // [stream rows, d] o_proj / down_proj output before the add
  Buffer<Real> final_inverse_rms_;       // [stream rows]
  ComputeBuffer final_normed_;            // [stream rows, d]
  Buffer<Real> logits_;                  // [chunk, V] fp32 (V: this rank's vocabulary rows)
  ComputeBuffer logits_grad_;             // [chunk, V] compute dtype (bf16 only; f32 aliases logits_)

  // Tensor parallelism's scratch (TP > 1).
  ComputeBuffer gathered_;      // [rows, d] whole rows of a stream tensor (sequence parallel)
  ComputeBuffer embedded_;      // [rows, d] this rank's part of the embedding's sum
  Buffer<Real> partial_;       // [rows, d] fp32 partial of a sum over TP
  Buffer<Real> reduced_;       // [stream rows, d] fp32 reduce-scatter result (sequence parallel)
  Buffer<Real> ce_maxima_;     // [TP, chunk] the vocabulary-parallel cross-entropy's exchanges
  Buffer<Real> ce_normalizers_;  // [TP, chunk]
  Buffer<Real> ce_targets_;    // [TP, chunk]
  Buffer<Real> ce_row_stats_;  // [chunk]
  Buffer<Real> ce_row_targets_;  // [chunk]

  // Backward scratch.
  ComputeBuffer stream_grad_;   // [stream rows, d]
  ComputeBuffer normed_grad_;   // [stream rows, d]
  ComputeBuffer context_grad_;  // [rows, H*hd]
  ComputeBuffer query_grad_;    // [rows, H*hd]
  ComputeBuffer key_grad_;      // [rows, G*hd]
  ComputeBuffer value_grad_;    // [rows, G*hd]
  ComputeBuffer hidden_grad_;   // [rows, F]
  ComputeBuffer gate_grad_;     // [rows, F]
  ComputeBuffer up_grad_;       // [rows, F]
};

}  // namespace tandem::production
