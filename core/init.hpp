// Deterministic initialization of the flat parameter buffer (SPEC 4): normal(0, init_method_std)
// for matrices, 1 for norm weights, 0 for biases, drawn as fp32 so every engine starts
// bit-identical. Counter-based: an element's value depends only on (seed, tensor name, element
// index), never on the layout, the sharding or the order of generation ("same seed, same weights,
// any layout"). The stream is specified exactly in docs/MODEL.md, section "Initialization".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/model_layout.hpp"
#include "core/random.hpp"

namespace tandem {

// FNV-1a, 64-bit, of the tensor's name bytes: the tensor's identity in the stream.
std::uint64_t fnv1a64(const std::string& text);

// The stream state of one tensor: splitmix64_mix(seed) XOR fnv1a64(name).
std::uint64_t init_tensor_stream(std::uint64_t seed, const std::string& tensor_name);

// Word `counter` of a tensor's stream: the (counter+1)-th output of SplitMix64 started from
// `stream`, i.e. splitmix64_mix(stream + (counter + 1) * 0x9E3779B97F4A7C15) modulo 2^64.
std::uint64_t init_stream_word(std::uint64_t stream, std::uint64_t counter);

// A standard normal from words 2e and 2e+1 of the stream (Box-Muller, cosine branch, in double).
double standard_normal_for_element(std::uint64_t stream, std::int64_t element);

// The initial value of element `element` (row-major index inside the tensor) of one tensor.
float initial_value(const ParameterTensor& tensor, double init_method_std, std::uint64_t seed,
                    std::int64_t element);

// The whole flat buffer, in layout order: [layout.total_elements].
std::vector<float> initial_parameters(const ModelConfig& config, std::uint64_t seed);

// Elements [begin, end) of the flat buffer, for a shard: equal to the same slice of
// initial_parameters(config, seed), bit for bit. Throws std::out_of_range for a bad range.
std::vector<float> initial_parameters_range(const ModelConfig& config, std::uint64_t seed,
                                            std::int64_t begin, std::int64_t end);

}  // namespace tandem
