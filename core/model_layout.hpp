// The model's parameter tensors and their place in ONE flat parameter buffer (SPEC 4, 7).
// Shared by both twins: checkpoints, gradients, the optimizer and sharding all index this buffer.
//
// The flat layout, documented in docs/MODEL.md:
//   - tensors appear in forward order: embedding; for each layer i = 0..L-1: input_layernorm,
//     q, k, v, o projections, post_attention_layernorm, gate, up, down projections (each linear
//     weight immediately followed by its bias when --add-bias-linear); final norm; lm_head
//     (absent when embeddings are tied: the embedding matrix is then also the output projection);
//   - each tensor is stored row-major with the Hugging Face / PyTorch shape ([out, in] for a
//     linear weight), contiguously, directly after the previous one (no padding, no alignment);
//   - a tensor's first element sits at `offset`; the buffer holds `total_elements` elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace tandem {

// The cross-entropy computes a microbatch's fp32 logits a chunk of rows at a time, 256 MiB by
// default (512 rows at a 128k vocabulary; the whole microbatch for small vocabularies): the
// production model allocates it and the planner counts it, from this one rule.
inline constexpr std::int64_t kLogitsChunkBytes = std::int64_t{256} << 20;
inline std::int64_t default_logits_chunk_rows(std::int64_t rows, std::int64_t vocab_per_rank) {
  const std::int64_t fitting = kLogitsChunkBytes / (vocab_per_rank * 4);
  return fitting < 1 ? 1 : (fitting < rows ? fitting : rows);
}

// SPEC 7: no weight decay for names ending in ".bias" or 1-D tensors; everything else decays.
enum class DecayGroup { decay, no_decay };

// SPEC 4: matrices normal(0, init_method_std), norm weights 1, biases 0.
enum class InitKind { normal, ones, zeros };

std::string to_string(DecayGroup group);
std::string to_string(InitKind kind);

struct ParameterTensor {
  std::string name;                 // Hugging Face Llama name, e.g. "model.layers.0.mlp.up_proj.weight"
  std::vector<std::int64_t> shape;  // row-major; [out, in] for linear weights
  std::int64_t offset = 0;          // index of the first element in the flat buffer
  std::int64_t numel = 0;           // product of shape
  DecayGroup decay_group = DecayGroup::decay;
  InitKind init_kind = InitKind::normal;
};

// Positions in ModelLayout::tensors of one decoder block's tensors. A bias index is -1 when
// the model has no linear biases.
struct LayerTensorIndices {
  std::int64_t input_norm = -1;      // [d]
  std::int64_t q_weight = -1;        // [H*hd, d]
  std::int64_t q_bias = -1;          // [H*hd]
  std::int64_t k_weight = -1;        // [G*hd, d]
  std::int64_t k_bias = -1;          // [G*hd]
  std::int64_t v_weight = -1;        // [G*hd, d]
  std::int64_t v_bias = -1;          // [G*hd]
  std::int64_t o_weight = -1;        // [d, H*hd]
  std::int64_t o_bias = -1;          // [d]
  std::int64_t post_norm = -1;       // [d]
  std::int64_t gate_weight = -1;     // [F, d]
  std::int64_t gate_bias = -1;       // [F]
  std::int64_t up_weight = -1;       // [F, d]
  std::int64_t up_bias = -1;         // [F]
  std::int64_t down_weight = -1;     // [d, F]
  std::int64_t down_bias = -1;       // [d]
};

struct ModelLayout {
  std::vector<ParameterTensor> tensors;   // in flat-buffer order
  std::int64_t total_elements = 0;        // size of the flat buffer
  std::int64_t embedding = -1;            // index of model.embed_tokens.weight [V_padded, d]
  std::vector<LayerTensorIndices> layers; // [L]
  std::int64_t final_norm = -1;           // index of model.norm.weight [d]
  // Index of the output projection [V_padded, d]: lm_head.weight, or the embedding when tied.
  std::int64_t output = -1;

  const ParameterTensor& tensor(std::int64_t index) const { return tensors.at(static_cast<std::size_t>(index)); }
  // The offset of a tensor, or -1 for an absent (index -1) tensor such as a disabled bias.
  std::int64_t offset_of(std::int64_t index) const { return index < 0 ? -1 : tensor(index).offset; }
  // Throws std::out_of_range naming the tensor when there is no tensor of that name.
  const ParameterTensor& find(const std::string& name) const;
  // Elements per decay group (SPEC 7), for the startup table and the log header.
  std::int64_t elements_in(DecayGroup group) const;
};

// Checks what the layout and the model need from the configuration (positive sizes, d divisible
// by H, H divisible by G, an even head dimension for RoPE, padded vocab >= vocab); throws
// std::invalid_argument naming the field, its value, the rule and the fix.
void validate_model_shape(const ModelConfig& config);

// The layout of a model with this configuration (validates it first).
ModelLayout make_model_layout(const ModelConfig& config);

}  // namespace tandem
