// Tests of the model's flat parameter layout (core/model_layout.hpp) and the counter-based
// initialization stream (core/init.hpp): Hugging Face names, shapes, offsets, decay groups and
// init kinds (SPEC 4, 7); determinism and shard independence of the initial values.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core/config.hpp"
#include "core/init.hpp"
#include "core/model_layout.hpp"

namespace tandem {
namespace {

// ---------------------------------------------------------------------------------------------
// Layout.

TEST(ModelLayout, DefaultConfigurationHasHuggingFaceNamesShapesAndContiguousOffsets) {
  ModelConfig config;  // L=2, d=32, F=64, H=4, G=4, V=384, untied, no bias
  const ModelLayout layout = make_model_layout(config);
  const std::int64_t per_layer_tensors = 9;  // 2 norms + q,k,v,o + gate,up,down
  ASSERT_EQ(layout.tensors.size(), static_cast<std::size_t>(1 + 2 * per_layer_tensors + 2));
  EXPECT_EQ(layout.tensors.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(layout.tensors.front().shape, (std::vector<std::int64_t>{384, 32}));
  EXPECT_EQ(layout.tensors[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(layout.find("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<std::int64_t>{4 * 8, 32}));  // [G*hd, d]
  EXPECT_EQ(layout.find("model.layers.1.self_attn.o_proj.weight").shape,
            (std::vector<std::int64_t>{32, 4 * 8}));  // [d, H*hd]
  EXPECT_EQ(layout.find("model.layers.0.mlp.down_proj.weight").shape,
            (std::vector<std::int64_t>{32, 64}));  // [d, F]
  EXPECT_EQ(layout.tensors[layout.tensors.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(layout.tensors.back().name, "lm_head.weight");
  EXPECT_EQ(layout.output, static_cast<std::int64_t>(layout.tensors.size()) - 1);

  std::int64_t expected_offset = 0;
  for (const ParameterTensor& tensor : layout.tensors) {
    EXPECT_EQ(tensor.offset, expected_offset) << tensor.name;
    std::int64_t product = 1;
    for (std::int64_t extent : tensor.shape) product *= extent;
    EXPECT_EQ(tensor.numel, product) << tensor.name;
    expected_offset += tensor.numel;
  }
  EXPECT_EQ(layout.total_elements, expected_offset);
  // Embedding + lm_head 2*V*d; per layer 2d norms + q,o d*H*hd each + k,v d*G*hd each + 3dF;
  // final norm d.
  const std::int64_t per_layer = 2 * 32 + 2 * 32 * 32 + 2 * 32 * 32 + 3 * 32 * 64;
  EXPECT_EQ(layout.total_elements, 2 * 384 * 32 + 2 * per_layer + 32);
}

TEST(ModelLayout, DecayGroupsAndInitKindsFollowSpec7) {
  ModelConfig config;
  config.add_bias_linear = true;
  const ModelLayout layout = make_model_layout(config);
  std::int64_t biases = 0;
  for (const ParameterTensor& tensor : layout.tensors) {
    const bool is_bias = tensor.name.size() > 5 && tensor.name.ends_with(".bias");
    const bool is_vector = tensor.shape.size() == 1;
    biases += is_bias ? 1 : 0;
    EXPECT_EQ(tensor.decay_group, (is_bias || is_vector) ? DecayGroup::no_decay : DecayGroup::decay)
        << tensor.name;
    EXPECT_EQ(tensor.init_kind, is_bias ? InitKind::zeros : is_vector ? InitKind::ones : InitKind::normal)
        << tensor.name;
  }
  EXPECT_EQ(biases, 2 * 7);  // q, k, v, o, gate, up, down per layer
  // Each bias follows its weight directly.
  const ParameterTensor& q_weight = layout.find("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(layout.find("model.layers.0.self_attn.q_proj.bias").offset, q_weight.offset + q_weight.numel);
  // Embedding and output projection decay (SPEC 7).
  EXPECT_EQ(layout.find("model.embed_tokens.weight").decay_group, DecayGroup::decay);
  EXPECT_EQ(layout.find("lm_head.weight").decay_group, DecayGroup::decay);
  EXPECT_EQ(layout.elements_in(DecayGroup::decay) + layout.elements_in(DecayGroup::no_decay),
            layout.total_elements);
}

TEST(ModelLayout, TiedEmbeddingsAreOneTensorCountedOnce) {
  ModelConfig config;
  config.tie_embeddings = true;
  const ModelLayout layout = make_model_layout(config);
  EXPECT_EQ(layout.output, layout.embedding);
  EXPECT_THROW(layout.find("lm_head.weight"), std::out_of_range);
  ModelConfig untied;
  EXPECT_EQ(make_model_layout(untied).total_elements - layout.total_elements,
            config.padded_vocab_size * config.hidden_size);
}

TEST(ModelLayout, RejectsShapesTheModelCannotHaveNamingTheField) {
  ModelConfig config;
  config.hidden_size = 30;  // not divisible by 4 heads
  try {
    make_model_layout(config);
    FAIL() << "hidden_size 30 with 4 heads was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("hidden_size"), std::string::npos) << error.what();
  }
  ModelConfig odd_head_dim;
  odd_head_dim.hidden_size = 12;  // hd = 3: RoPE needs pairs
  EXPECT_THROW(make_model_layout(odd_head_dim), std::invalid_argument);
  ModelConfig bad_groups;
  bad_groups.num_query_groups = 3;
  EXPECT_THROW(make_model_layout(bad_groups), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Initialization.

TEST(Initialization, StreamWordsAreSplitMix64Outputs) {
  // SplitMix64 started from 1234567 (Vigna's reference generator) yields these first outputs.
  const std::uint64_t state = 1234567;
  EXPECT_EQ(init_stream_word(state, 0), 6457827717110365317ULL);
  EXPECT_EQ(init_stream_word(state, 1), 3203168211198807973ULL);
  EXPECT_EQ(init_stream_word(state, 2), 9817491932198370423ULL);
  EXPECT_EQ(init_tensor_stream(7, "lm_head.weight"), splitmix64_mix(7) ^ fnv1a64("lm_head.weight"));
  EXPECT_EQ(fnv1a64(""), 0xCBF29CE484222325ULL);  // FNV-1a's offset basis
  EXPECT_EQ(fnv1a64("a"), 0xAF63DC4C8601EC8CULL); // FNV-1a 64 of "a" (published test vector)
}

TEST(Initialization, SameSeedSameBitsOtherSeedOtherValues) {
  ModelConfig config;
  const std::vector<float> first = initial_parameters(config, 1234);
  const std::vector<float> second = initial_parameters(config, 1234);
  const std::vector<float> other = initial_parameters(config, 1235);
  ASSERT_EQ(first.size(), static_cast<std::size_t>(make_model_layout(config).total_elements));
  // Exact: bitwise equal run to run.
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
  const ModelLayout layout = make_model_layout(config);
  const ParameterTensor& embedding = layout.tensor(layout.embedding);
  std::int64_t equal = 0;
  for (std::int64_t i = 0; i < embedding.numel; ++i) equal += first[static_cast<std::size_t>(i)] == other[static_cast<std::size_t>(i)];
  EXPECT_LT(equal, embedding.numel / 100) << "seeds 1234 and 1235 gave mostly equal embeddings";
}

TEST(Initialization, NormsAreOneBiasesZeroMatricesNormalWithTheConfiguredStd) {
  ModelConfig config;
  config.add_bias_linear = true;
  const ModelLayout layout = make_model_layout(config);
  const std::vector<float> values = initial_parameters(config, 99);
  double sum = 0;
  double sum_of_squares = 0;
  std::int64_t normal_count = 0;
  for (const ParameterTensor& tensor : layout.tensors) {
    for (std::int64_t i = 0; i < tensor.numel; ++i) {
      const double value = values[static_cast<std::size_t>(tensor.offset + i)];
      ASSERT_TRUE(std::isfinite(value)) << tensor.name << " element " << i;
      if (tensor.init_kind == InitKind::ones) {
        ASSERT_EQ(value, 1.0) << tensor.name;
      }
      if (tensor.init_kind == InitKind::zeros) {
        ASSERT_EQ(value, 0.0) << tensor.name;
      }
      if (tensor.init_kind == InitKind::normal) {
        sum += value;
        sum_of_squares += value * value;
        ++normal_count;
      }
    }
  }
  // Approximate (statistical): for n independent N(0, s^2) draws the sample mean has standard
  // deviation s/sqrt(n) and the sample variance s^2 sqrt(2/n); we allow 6 standard deviations
  // (a false alarm probability below 1e-8 for a correct generator; this seed is fixed anyway).
  const double n = static_cast<double>(normal_count);
  const double std_dev = config.init_method_std;
  const double allowed_sigmas = 6;
  EXPECT_LE(std::abs(sum / n), allowed_sigmas * std_dev / std::sqrt(n));
  EXPECT_LE(std::abs(sum_of_squares / n - std_dev * std_dev),
            allowed_sigmas * std_dev * std_dev * std::sqrt(2 / n));
}

TEST(Initialization, ValuesDependOnlyOnSeedTensorAndElement) {
  // The same tensor name gets the same values whatever else the layout holds: biases on or
  // off move every offset, the values stay.
  ModelConfig without_bias;
  ModelConfig with_bias;
  with_bias.add_bias_linear = true;
  const ModelLayout layout_a = make_model_layout(without_bias);
  const ModelLayout layout_b = make_model_layout(with_bias);
  const std::vector<float> values_a = initial_parameters(without_bias, 5);
  const std::vector<float> values_b = initial_parameters(with_bias, 5);
  for (const ParameterTensor& tensor : layout_a.tensors) {
    const ParameterTensor& same = layout_b.find(tensor.name);
    for (std::int64_t i = 0; i < tensor.numel; ++i) {
      ASSERT_EQ(values_a[static_cast<std::size_t>(tensor.offset + i)],
                values_b[static_cast<std::size_t>(same.offset + i)])
          << tensor.name << " element " << i;
    }
  }
}

// A model large enough that the buffer fills on several threads (core/init.cpp): every element
// is still the one initial_value names, including those at the chunks' edges.
TEST(Initialization, ALargeBufferFilledOnThreadsHoldsEveryElementsOwnValue) {
  ModelConfig config;
  config.num_layers = 2;
  config.hidden_size = 512;
  config.ffn_hidden_size = 2048;
  config.num_attention_heads = 8;
  config.num_query_groups = 8;
  const ModelLayout layout = make_model_layout(config);
  ASSERT_GT(layout.total_elements, std::int64_t{2} << 22) << "below the threaded size";
  const std::vector<float> values = initial_parameters(config, 11);
  std::int64_t differing = 0;
  for (const ParameterTensor& tensor : layout.tensors) {
    for (std::int64_t i = 0; i < tensor.numel; ++i) {
      const float expected = initial_value(tensor, config.init_method_std, 11, i);
      differing += std::bit_cast<std::uint32_t>(values[static_cast<std::size_t>(tensor.offset + i)]) !=
                   std::bit_cast<std::uint32_t>(expected);
    }
  }
  EXPECT_EQ(differing, 0);
}

RC_GTEST_PROP(Initialization, AnyShardRangeEqualsTheSameSliceOfTheWholeBuffer, ()) {
  ModelConfig config;
  config.tie_embeddings = *rc::gen::arbitrary<bool>();
  config.add_bias_linear = *rc::gen::arbitrary<bool>();
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  const std::int64_t total = make_model_layout(config).total_elements;
  const std::int64_t begin = *rc::gen::inRange<std::int64_t>(0, total + 1);
  const std::int64_t end = *rc::gen::inRange<std::int64_t>(begin, total + 1);
  const std::vector<float> whole = initial_parameters(config, seed);
  const std::vector<float> shard = initial_parameters_range(config, seed, begin, end);
  RC_ASSERT(shard.size() == static_cast<std::size_t>(end - begin));
  // Bitwise: compare the bits (an empty shard has no data pointer, so no memcmp).
  const auto same_bits = [](float a, float b) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
  };
  RC_ASSERT(std::equal(shard.begin(), shard.end(), whole.begin() + begin, same_bits));
}

}  // namespace
}  // namespace tandem
