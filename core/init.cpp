// The counter-based initialization stream of core/init.hpp (SPEC 4; documented in docs/MODEL.md).
#include "core/init.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <thread>

namespace tandem {

namespace {

// FNV-1a, 64-bit parameters.
constexpr std::uint64_t kFnvOffsetBasis = 0xCBF29CE484222325ULL;
constexpr std::uint64_t kFnvPrime = 0x100000001B3ULL;
// A uniform double keeps the top 53 bits of a word: u = (word >> 11) * 2^-53.
constexpr int kDiscardedLowBits = 64 - 53;
constexpr double kTwoToMinus53 = 0x1.0p-53;

}  // namespace

std::uint64_t fnv1a64(const std::string& text) {
  std::uint64_t hash = kFnvOffsetBasis;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= kFnvPrime;
  }
  return hash;
}

std::uint64_t init_tensor_stream(std::uint64_t seed, const std::string& tensor_name) {
  return splitmix64_mix(seed) ^ fnv1a64(tensor_name);
}

std::uint64_t init_stream_word(std::uint64_t stream, std::uint64_t counter) {
  return splitmix64_mix(stream + (counter + 1) * kSplitMixGamma);
}

double standard_normal_for_element(std::uint64_t stream, std::int64_t element) {
  const std::uint64_t first_counter = 2 * static_cast<std::uint64_t>(element);
  const std::uint64_t radius_word = init_stream_word(stream, first_counter);
  const std::uint64_t angle_word = init_stream_word(stream, first_counter + 1);
  // u1 in (0, 1] so the logarithm is finite; u2 in [0, 1).
  const double u1 = static_cast<double>((radius_word >> kDiscardedLowBits) + 1) * kTwoToMinus53;
  const double u2 = static_cast<double>(angle_word >> kDiscardedLowBits) * kTwoToMinus53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

namespace {

// One element given its tensor's stream (computed once per tensor by the callers).
float value_in_stream(InitKind kind, double init_method_std, std::uint64_t stream,
                      std::int64_t element) {
  switch (kind) {
    case InitKind::ones: return 1.0f;
    case InitKind::zeros: return 0.0f;
    case InitKind::normal: break;
  }
  // SPEC 4: drawn as fp32 — one rounding of the double product, so every engine starts equal.
  return static_cast<float>(init_method_std * standard_normal_for_element(stream, element));
}

}  // namespace

float initial_value(const ParameterTensor& tensor, double init_method_std, std::uint64_t seed,
                    std::int64_t element) {
  return value_in_stream(tensor.init_kind, init_method_std, init_tensor_stream(seed, tensor.name),
                         element);
}

std::vector<float> initial_parameters_range(const ModelConfig& config, std::uint64_t seed,
                                            std::int64_t begin, std::int64_t end) {
  const ModelLayout layout = make_model_layout(config);
  if (begin < 0 || end < begin || end > layout.total_elements) {
    throw std::out_of_range("initial_parameters_range: [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") is not inside the flat buffer [0, " +
                            std::to_string(layout.total_elements) + ")");
  }
  std::vector<float> values(static_cast<std::size_t>(end - begin));  // [end - begin]
  // Every element is a pure function of (seed, tensor, element), so chunks of the range fill on
  // their own threads and the result is the same bits for any number of threads.
  auto fill = [&](std::int64_t chunk_begin, std::int64_t chunk_end) {
    for (const ParameterTensor& tensor : layout.tensors) {
      const std::int64_t first = std::max(chunk_begin, tensor.offset);
      const std::int64_t last = std::min(chunk_end, tensor.offset + tensor.numel);
      if (first >= last) continue;
      const std::uint64_t stream = init_tensor_stream(seed, tensor.name);
      for (std::int64_t flat = first; flat < last; ++flat) {
        values[static_cast<std::size_t>(flat - begin)] =
            value_in_stream(tensor.init_kind, config.init_method_std, stream, flat - tensor.offset);
      }
    }
  };
  constexpr std::int64_t kElementsPerThread = std::int64_t{1} << 22;  // below this, one thread
  const std::int64_t count = end - begin;
  const std::int64_t threads = std::clamp<std::int64_t>(
      count / kElementsPerThread, 1, std::max<std::int64_t>(1, std::thread::hardware_concurrency()));
  if (threads == 1) {
    fill(begin, end);
    return values;
  }
  std::vector<std::jthread> workers;
  for (std::int64_t t = 0; t < threads; ++t) {
    workers.emplace_back(fill, begin + count * t / threads, begin + count * (t + 1) / threads);
  }
  workers.clear();  // joins
  return values;
}

std::vector<float> initial_parameters(const ModelConfig& config, std::uint64_t seed) {
  return initial_parameters_range(config, seed, 0, make_model_layout(config).total_elements);
}

}  // namespace tandem
