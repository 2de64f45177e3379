// A named tensor as checkpoints and exports store it: dtype, shape and little-endian bytes
// (SPEC 9, 12). Both twins build these from their own buffers (the reference from doubles, the
// production trainer from fp32 host copies) and read values back with the typed helpers, which
// refuse a dtype other than the one asked for rather than converting silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::checkpoint {

// The dtypes tandem reads and writes, spelled as in safetensors headers.
inline constexpr std::string_view kDtypeF32 = "F32";
inline constexpr std::string_view kDtypeF64 = "F64";
inline constexpr std::string_view kDtypeBF16 = "BF16";

struct TensorData {
  std::string name;                 // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype;                // "F32", "F64" or "BF16"
  std::vector<std::int64_t> shape;  // row-major (C order), outermost first; [] = a scalar
  std::vector<std::byte> bytes;     // element_count(shape) x dtype_size(dtype), little-endian

  bool operator==(const TensorData&) const = default;
};

// Bytes per element of a supported dtype; throws naming the dtype for any other.
std::size_t dtype_size(std::string_view dtype);
bool is_supported_dtype(std::string_view dtype);

// Product of the dimensions (1 for a scalar); throws on a negative dimension or on overflow.
std::int64_t element_count(std::span<const std::int64_t> shape);

// Builders: copy the values into a tensor of the matching dtype.
TensorData make_f32_tensor(std::string name, std::vector<std::int64_t> shape,
                           std::span<const float> values);
TensorData make_f64_tensor(std::string name, std::vector<std::int64_t> shape,
                           std::span<const double> values);
TensorData make_bf16_tensor(std::string name, std::vector<std::int64_t> shape,
                            std::span<const std::uint16_t> bf16_bits);

// Typed read-back; each throws naming the tensor when its dtype is not the one asked for.
std::vector<float> f32_values(const TensorData& tensor);
std::vector<double> f64_values(const TensorData& tensor);
std::vector<std::uint16_t> bf16_bits(const TensorData& tensor);

// Values of an F32, F64 or BF16 tensor widened exactly to double.
std::vector<double> values_as_f64(const TensorData& tensor);

// Round-to-nearest-even conversion of one value, straight from the source precision (never via an
// intermediate float, which would round twice). NaN stays NaN (quiet, sign kept), +-Inf and -0
// are kept, values past the largest finite target round to Inf as IEEE rounding does.
std::uint16_t bf16_from_double(double value);
std::uint16_t bf16_from_float(float value);
float float_from_bf16(std::uint16_t bits);

// The tensor in another dtype, each element rounded to nearest even from its stored precision.
// F64 -> F32, F64/F32 -> BF16, and widening (exact) are all allowed; same dtype is a copy.
TensorData convert_tensor(const TensorData& tensor, std::string_view to_dtype);

// The tensor named `name`; throws naming the tensor and `where` when absent.
const TensorData& find_tensor(const std::vector<TensorData>& tensors, std::string_view name,
                              std::string_view where);

}  // namespace tandem::checkpoint
