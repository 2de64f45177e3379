// Named tensors, their dtypes, and exact round-to-nearest-even conversion
// (core/checkpoint/tensor_data.hpp).
#include "core/checkpoint/tensor_data.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace tandem::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian values; tandem copies host bytes as they are");

namespace {

template <typename Value>
TensorData make_tensor(std::string name, std::string_view dtype, std::vector<std::int64_t> shape,
                       std::span<const Value> values) {
  const std::int64_t count = element_count(shape);
  if (static_cast<std::int64_t>(values.size()) != count) {
    throw std::invalid_argument("tensor " + name + ": " + std::to_string(values.size()) +
                                " values for a shape of " + std::to_string(count) +
                                " elements; pass exactly one value per element");
  }
  TensorData tensor{std::move(name), std::string(dtype), std::move(shape), {}};
  tensor.bytes.resize(values.size_bytes());
  if (!values.empty()) std::memcpy(tensor.bytes.data(), values.data(), values.size_bytes());
  return tensor;
}

template <typename Value>
std::vector<Value> typed_values(const TensorData& tensor, std::string_view dtype) {
  if (tensor.dtype != dtype) {
    throw std::runtime_error("tensor " + tensor.name + " holds " + tensor.dtype + ", not " +
                             std::string(dtype) + "; convert it with convert_tensor first");
  }
  if (tensor.bytes.size() % sizeof(Value) != 0 ||
      static_cast<std::int64_t>(tensor.bytes.size() / sizeof(Value)) != element_count(tensor.shape)) {
    throw std::runtime_error("tensor " + tensor.name + ": " + std::to_string(tensor.bytes.size()) +
                             " bytes do not match its shape and dtype " + tensor.dtype);
  }
  std::vector<Value> values(tensor.bytes.size() / sizeof(Value));
  if (!values.empty()) std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
  return values;
}

}  // namespace

bool is_supported_dtype(std::string_view dtype) {
  return dtype == kDtypeF32 || dtype == kDtypeF64 || dtype == kDtypeBF16;
}

std::size_t dtype_size(std::string_view dtype) {
  if (dtype == kDtypeF32) return 4;
  if (dtype == kDtypeF64) return 8;
  if (dtype == kDtypeBF16) return 2;
  throw std::invalid_argument("dtype \"" + std::string(dtype) +
                              "\" is not one tandem reads or writes; use F32, F64 or BF16");
}

std::int64_t element_count(std::span<const std::int64_t> shape) {
  std::int64_t count = 1;
  for (const std::int64_t dimension : shape) {
    if (dimension < 0) {
      throw std::invalid_argument("tensor dimension " + std::to_string(dimension) +
                                  " is negative; dimensions are >= 0");
    }
    if (dimension != 0 && count > std::numeric_limits<std::int64_t>::max() / dimension) {
      throw std::invalid_argument("tensor shape overflows a 64-bit element count");
    }
    count *= dimension;
  }
  return count;
}

TensorData make_f32_tensor(std::string name, std::vector<std::int64_t> shape,
                           std::span<const float> values) {
  return make_tensor(std::move(name), kDtypeF32, std::move(shape), values);
}

TensorData make_f64_tensor(std::string name, std::vector<std::int64_t> shape,
                           std::span<const double> values) {
  return make_tensor(std::move(name), kDtypeF64, std::move(shape), values);
}

TensorData make_bf16_tensor(std::string name, std::vector<std::int64_t> shape,
                            std::span<const std::uint16_t> bf16_bits) {
  return make_tensor(std::move(name), kDtypeBF16, std::move(shape), bf16_bits);
}

std::vector<float> f32_values(const TensorData& tensor) {
  return typed_values<float>(tensor, kDtypeF32);
}

std::vector<double> f64_values(const TensorData& tensor) {
  return typed_values<double>(tensor, kDtypeF64);
}

std::vector<std::uint16_t> bf16_bits(const TensorData& tensor) {
  return typed_values<std::uint16_t>(tensor, kDtypeBF16);
}

std::vector<double> values_as_f64(const TensorData& tensor) {
  if (tensor.dtype == kDtypeF64) return f64_values(tensor);
  std::vector<double> widened;
  if (tensor.dtype == kDtypeF32) {
    for (const float value : f32_values(tensor)) widened.push_back(value);
  } else if (tensor.dtype == kDtypeBF16) {
    for (const std::uint16_t bits : bf16_bits(tensor)) widened.push_back(float_from_bf16(bits));
  } else {
    dtype_size(tensor.dtype);  // throws naming the dtype
  }
  return widened;
}

std::uint16_t bf16_from_double(double value) {
  constexpr std::uint16_t kSignBit = 0x8000;
  const std::uint16_t sign = std::signbit(value) ? kSignBit : 0;
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7FC0);  // quiet NaN
  if (std::isinf(value)) return static_cast<std::uint16_t>(sign | 0x7F80);
  const double magnitude = std::fabs(value);
  if (magnitude == 0.0) return sign;

  // bf16 has 7 stored fraction bits and float's exponent range: normals from 2^-126, subnormals
  // in steps of 2^-133. Scale |value| so that one unit in the last bf16 place is 1; the scaling is
  // by a power of two and exact, and nearbyint rounds to nearest even in the default mode.
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  constexpr int kFractionBits = 7;
  constexpr int kMinNormalExponent = -126;
  const int unit_exponent = std::max(exponent - 1, kMinNormalExponent) - kFractionBits;
  const double units = std::nearbyint(std::ldexp(magnitude, -unit_exponent));
  const double rounded = std::ldexp(units, unit_exponent);
  constexpr double kOverflow = 0x1p128;  // the first power of two past the largest bf16 binade
  if (rounded >= kOverflow) return static_cast<std::uint16_t>(sign | 0x7F80);
  // `rounded` has at most 8 significant bits within float's range: the float is exact and its low
  // 16 bits are zero.
  const auto float_bits = std::bit_cast<std::uint32_t>(static_cast<float>(rounded));
  return static_cast<std::uint16_t>(sign | (float_bits >> 16));
}

std::uint16_t bf16_from_float(float value) { return bf16_from_double(value); }

float float_from_bf16(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

TensorData convert_tensor(const TensorData& tensor, std::string_view to_dtype) {
  dtype_size(to_dtype);  // throws naming an unknown target
  if (tensor.dtype == to_dtype) return tensor;
  const std::vector<double> values = values_as_f64(tensor);
  if (to_dtype == kDtypeF64) return make_f64_tensor(tensor.name, tensor.shape, values);
  if (to_dtype == kDtypeF32) {
    std::vector<float> narrowed(values.size());
    // A double-to-float conversion rounds to nearest even (IEEE default mode).
    for (std::size_t i = 0; i < values.size(); ++i) narrowed[i] = static_cast<float>(values[i]);
    return make_f32_tensor(tensor.name, tensor.shape, narrowed);
  }
  std::vector<std::uint16_t> narrowed(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) narrowed[i] = bf16_from_double(values[i]);
  return make_bf16_tensor(tensor.name, tensor.shape, narrowed);
}

const TensorData& find_tensor(const std::vector<TensorData>& tensors, std::string_view name,
                              std::string_view where) {
  for (const auto& tensor : tensors) {
    if (tensor.name == name) return tensor;
  }
  throw std::runtime_error(std::string(where) + ": no tensor named " + std::string(name));
}

}  // namespace tandem::checkpoint
