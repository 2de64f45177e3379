// Builds the ordered parameter list and flat-buffer offsets of core/model_layout.hpp.
#include "core/model_layout.hpp"

#include <stdexcept>

namespace tandem {

std::string to_string(DecayGroup group) { return group == DecayGroup::decay ? "decay" : "no_decay"; }

std::string to_string(InitKind kind) {
  switch (kind) {
    case InitKind::normal: return "normal";
    case InitKind::ones: return "ones";
    case InitKind::zeros: return "zeros";
  }
  return "?";
}

const ParameterTensor& ModelLayout::find(const std::string& name) const {
  for (const ParameterTensor& entry : tensors) {
    if (entry.name == name) return entry;
  }
  throw std::out_of_range("model layout has no parameter tensor named '" + name + "'");
}

std::int64_t ModelLayout::elements_in(DecayGroup group) const {
  std::int64_t elements = 0;
  for (const ParameterTensor& entry : tensors) {
    if (entry.decay_group == group) elements += entry.numel;
  }
  return elements;
}

namespace {

void require(bool holds, const std::string& field, std::int64_t value, const std::string& rule) {
  if (!holds) {
    throw std::invalid_argument("model configuration: " + field + " = " + std::to_string(value) +
                                " violates: " + rule);
  }
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Appends one tensor after the last and returns its index. Decay group and init kind follow
// from the name and the shape alone (SPEC 4, 7), so no call site can get them wrong.
std::int64_t append_tensor(ModelLayout& layout, const std::string& name,
                           std::vector<std::int64_t> shape) {
  ParameterTensor entry;
  entry.name = name;
  entry.numel = 1;
  for (std::int64_t extent : shape) entry.numel *= extent;
  entry.shape = std::move(shape);
  entry.offset = layout.total_elements;
  const bool is_bias = ends_with(name, ".bias");
  const bool is_vector = entry.shape.size() == 1;
  entry.decay_group = (is_bias || is_vector) ? DecayGroup::no_decay : DecayGroup::decay;
  entry.init_kind = is_bias ? InitKind::zeros : is_vector ? InitKind::ones : InitKind::normal;
  layout.total_elements += entry.numel;
  layout.tensors.push_back(std::move(entry));
  return static_cast<std::int64_t>(layout.tensors.size()) - 1;
}

}  // namespace

void validate_model_shape(const ModelConfig& config) {
  require(config.num_layers >= 1, "num_layers (--num-layers)", config.num_layers, "must be >= 1");
  require(config.hidden_size >= 1, "hidden_size (--hidden-size)", config.hidden_size, "must be >= 1");
  require(config.ffn_hidden_size >= 1, "ffn_hidden_size (--ffn-hidden-size)", config.ffn_hidden_size,
          "must be >= 1");
  require(config.num_attention_heads >= 1, "num_attention_heads (--num-attention-heads)",
          config.num_attention_heads, "must be >= 1");
  require(config.num_query_groups >= 1, "num_query_groups (--num-query-groups)",
          config.num_query_groups, "must be >= 1");
  require(config.hidden_size % config.num_attention_heads == 0, "hidden_size (--hidden-size)",
          config.hidden_size, "must be divisible by num_attention_heads (" +
                                  std::to_string(config.num_attention_heads) + "); change either");
  require(config.num_attention_heads % config.num_query_groups == 0,
          "num_attention_heads (--num-attention-heads)", config.num_attention_heads,
          "must be divisible by num_query_groups (" + std::to_string(config.num_query_groups) +
              "); change either");
  require(config.head_dim() % 2 == 0, "head dim (hidden_size / num_attention_heads)",
          config.head_dim(), "must be even for RoPE's rotate-half pairs (SPEC 4)");
  require(config.vocab_size >= 1, "vocab_size (--vocab-size)", config.vocab_size, "must be >= 1");
  require(config.padded_vocab_size >= config.vocab_size, "padded_vocab_size", config.padded_vocab_size,
          "must be >= vocab_size (" + std::to_string(config.vocab_size) + ")");
  require(config.seq_length >= 1, "seq_length (--seq-length)", config.seq_length, "must be >= 1");
}

ModelLayout make_model_layout(const ModelConfig& config) {
  validate_model_shape(config);
  const std::int64_t d = config.hidden_size;
  const std::int64_t ffn = config.ffn_hidden_size;
  const std::int64_t q_width = config.num_attention_heads * config.head_dim();  // H*hd
  const std::int64_t kv_width = config.kv_width();                              // G*hd
  const std::int64_t vocab = config.padded_vocab_size;

  ModelLayout layout;
  layout.embedding = append_tensor(layout, "model.embed_tokens.weight", {vocab, d});
  for (std::int64_t layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    LayerTensorIndices indices;
    // A linear layer: its weight, then (with --add-bias-linear) its bias.
    auto linear = [&](const std::string& name, std::int64_t out_features, std::int64_t in_features,
                      std::int64_t& weight_index, std::int64_t& bias_index) {
      weight_index = append_tensor(layout, prefix + name + ".weight", {out_features, in_features});
      if (config.add_bias_linear) bias_index = append_tensor(layout, prefix + name + ".bias", {out_features});
    };
    indices.input_norm = append_tensor(layout, prefix + "input_layernorm.weight", {d});
    linear("self_attn.q_proj", q_width, d, indices.q_weight, indices.q_bias);
    linear("self_attn.k_proj", kv_width, d, indices.k_weight, indices.k_bias);
    linear("self_attn.v_proj", kv_width, d, indices.v_weight, indices.v_bias);
    linear("self_attn.o_proj", d, q_width, indices.o_weight, indices.o_bias);
    indices.post_norm = append_tensor(layout, prefix + "post_attention_layernorm.weight", {d});
    linear("mlp.gate_proj", ffn, d, indices.gate_weight, indices.gate_bias);
    linear("mlp.up_proj", ffn, d, indices.up_weight, indices.up_bias);
    linear("mlp.down_proj", d, ffn, indices.down_weight, indices.down_bias);
    layout.layers.push_back(indices);
  }
  layout.final_norm = append_tensor(layout, "model.norm.weight", {d});
  // SPEC 4: tied embeddings are one tensor, counted once everywhere.
  layout.output = config.tie_embeddings ? layout.embedding
                                        : append_tensor(layout, "lm_head.weight", {vocab, d});
  return layout;
}

}  // namespace tandem
