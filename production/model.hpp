// The production decoder (SPEC 4, 5) over backend ops: one microbatch's forward, chunked fused
// cross-entropy and backward, adding fp32 weight gradients into the main-gradient buffer. The
// same computation as reference/model.cpp, batched over the microbatch's samples (rows =
// mbs x seq), with activations in the compute dtype and every GEMM accumulating in fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"
#include "production/backend.hpp"

namespace tandem::production {

// What one block's forward keeps for its backward (rows = mbs x seq).
struct BlockActivations {
  ComputeBuffer block_input;    // [rows, d] residual stream entering the block
  Buffer<float> attn_inverse_rms;  // [rows]
  ComputeBuffer attn_normed;    // [rows, d]
  ComputeBuffer query;          // [rows, H*hd] after RoPE
  ComputeBuffer key;            // [rows, G*hd] after RoPE
  ComputeBuffer value;          // [rows, G*hd]
  ComputeBuffer context;        // [rows, H*hd] attention output
  Buffer<float> logsumexp;      // [rows, H]
  ComputeBuffer mid;            // [rows, d] after the attention residual add
  Buffer<float> mlp_inverse_rms;  // [rows]
  ComputeBuffer mlp_normed;     // [rows, d]
  ComputeBuffer gate;           // [rows, F]
  ComputeBuffer up;             // [rows, F]
  ComputeBuffer hidden;         // [rows, F] silu(gate) * up
};

struct DecoderOptions {
  std::int64_t micro_batch_size = 1;  // samples per microbatch
  // Rows of fp32 logits alive at once in the fused cross-entropy; 0 = as many as fit
  // kLogitsChunkBytes (the full microbatch for small vocabularies).
  std::int64_t logits_chunk_rows = 0;
  DType compute = DType::f32;
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

// 256 MiB of fp32 logits per chunk by default: 512 rows at a 128k vocabulary.
inline constexpr std::int64_t kLogitsChunkBytes = std::int64_t{256} << 20;

class DecoderModel {
 public:
  DecoderModel(const ModelConfig& config, const ModelLayout& layout, Backend& backend,
               const DecoderOptions& options);

  // Adds d(loss_scale x masked CE sum over `samples`)/d(weights) into main_grads [N] and writes
  // each position's masked CE into row_losses [mbs*seq] (0 where the mask is 0). compute_weights
  // is the flat compute-typed weight buffer [N]. Throws std::invalid_argument on a malformed
  // sample (as the reference does).
  void forward_backward(const std::vector<Sample>& samples, const void* compute_weights,
                        float loss_scale, float* main_grads, float* row_losses);

  // Forward only (evaluation): the same row_losses [mbs*seq] as forward_backward, bit for bit,
  // through the loss-only cross-entropy; no gradient is computed or touched.
  void forward_loss(const std::vector<Sample>& samples, const void* compute_weights,
                    float* row_losses);

  // Called by forward_backward and forward_loss until replaced; empty functions are skipped.
  void set_hooks(ModelHooks hooks) { hooks_ = std::move(hooks); }

  std::int64_t rows() const { return rows_; }
  std::int64_t logits_chunk_rows() const { return chunk_rows_; }

 private:
  void upload_inputs(const std::vector<Sample>& samples);
  void forward(const void* weights);
  // main_grads == nullptr: the loss alone (forward_loss).
  void loss_and_output_backward(const void* weights, float loss_scale, float* main_grads,
                                float* row_losses);
  void backward(const void* weights, float* main_grads);

  // Linear layers in PyTorch's convention, y = x W^T + b, on `rows_` rows.
  struct Linear {
    std::int64_t weight = -1;  // tensor index in the layout
    std::int64_t bias = -1;    // -1: no bias
    std::int64_t in = 0;
    std::int64_t out = 0;
  };
  void linear_forward(const void* weights, const Linear& linear, const void* input, void* output);
  // input_grad = (accumulate ? input_grad : 0) + output_grad W; W and b gradients += into main.
  void linear_backward(const void* weights, const Linear& linear, const void* input,
                       const void* output_grad, void* input_grad, bool accumulate,
                       float* main_grads);
  const void* weight_at(const void* weights, std::int64_t tensor_index) const;
  // The hooks' ranges: the embedding, layer `layer`, and the tail (final norm onwards).
  struct FlatSpan {
    std::int64_t begin = 0;
    std::int64_t end = 0;
  };
  FlatSpan embedding_span() const;
  FlatSpan layer_span(std::size_t layer) const;
  FlatSpan tail_span() const;
  void before_weights(FlatSpan span) const {
    if (hooks_.before_weights) hooks_.before_weights(span.begin, span.end);
  }
  void gradients_done(FlatSpan span) const {
    if (hooks_.gradients_done) hooks_.gradients_done(span.begin, span.end);
  }

  ModelHooks hooks_;
  ModelConfig config_;
  ModelLayout layout_;  // a copy: the model never dangles when its owner moves
  Backend& backend_;
  DType compute_;
  std::int64_t micro_batch_size_ = 1;
  std::int64_t seq_ = 0;
  std::int64_t rows_ = 0;        // mbs x seq
  std::int64_t chunk_rows_ = 0;  // fused cross-entropy chunk
  float epsilon_ = 0.0f;         // --norm-epsilon as fp32
  float attention_scale_ = 0.0f; // 1/sqrt(hd) as fp32

  // Inputs of the microbatch.
  Buffer<std::int32_t> tokens_;           // [rows]
  Buffer<std::int32_t> labels_;           // [rows]
  Buffer<std::uint8_t> loss_mask_;        // [rows]
  Buffer<std::int32_t> positions_;        // [rows]
  Buffer<std::int32_t> attention_start_;  // [rows] within each sample
  Buffer<float> rope_cosines_;            // [rows, hd/2]
  Buffer<float> rope_sines_;              // [rows, hd/2]

  std::vector<BlockActivations> blocks_;  // [L]
  ComputeBuffer stream_;                  // [rows, d] residual stream (final norm's input)
  ComputeBuffer branch_;                  // [rows, d] o_proj / down_proj output before the add
  Buffer<float> final_inverse_rms_;       // [rows]
  ComputeBuffer final_normed_;            // [rows, d]
  Buffer<float> logits_;                  // [chunk, V] fp32
  ComputeBuffer logits_grad_;             // [chunk, V] compute dtype (bf16 only; f32 aliases logits_)

  // Backward scratch.
  ComputeBuffer stream_grad_;   // [rows, d]
  ComputeBuffer normed_grad_;   // [rows, d]
  ComputeBuffer context_grad_;  // [rows, H*hd]
  ComputeBuffer query_grad_;    // [rows, H*hd]
  ComputeBuffer key_grad_;      // [rows, G*hd]
  ComputeBuffer value_grad_;    // [rows, G*hd]
  ComputeBuffer hidden_grad_;   // [rows, F]
  ComputeBuffer gate_grad_;     // [rows, F]
  ComputeBuffer up_grad_;       // [rows, F]
};

}  // namespace tandem::production
