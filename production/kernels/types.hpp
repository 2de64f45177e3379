// What every production kernel header shares: the element types a buffer may hold, bf16 as a
// storage type with its one rounding rule, and the launch context of a CUDA entry point.
// Included by .cu files: no Boost, no nlohmann/json, no CUDA headers (handles are opaque).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "production/arithmetic.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// The element type of a buffer an op reads or writes. Activations and compute weights are
// `compute` typed: f32 without --bf16, bf16 with it (SPEC 7). Main weights, main gradients, Adam
// moments, norm statistics, logits and losses are always f32. "f32" is this build's Real
// (arithmetic.hpp): fp32, or fp64 in the semantic build, which has no bf16.
enum class DType : std::uint8_t { f32, bf16 };

// bf16 as stored: the upper 16 bits of an IEEE binary32 (layout-compatible with __nv_bfloat16).
struct Bf16 {
  std::uint16_t bits = 0;
};

inline constexpr std::int64_t dtype_bytes(DType dtype) {
  return dtype == DType::f32 ? static_cast<std::int64_t>(sizeof(Real)) : 2;
}

// fp32 -> bf16, round to nearest, ties to even (cuda's __float2bfloat16_rn); NaN stays a quiet NaN
// of the same sign. The ONE rounding rule: every store of a bf16 value goes through it.
inline Bf16 bf16_from_f32(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    return Bf16{static_cast<std::uint16_t>((bits >> 16) | 0x0040u)};  // quiet NaN
  }
  const std::uint32_t lsb = (bits >> 16) & 1u;  // ties to even
  const std::uint32_t rounding_bias = 0x7FFFu + lsb;
  return Bf16{static_cast<std::uint16_t>((bits + rounding_bias) >> 16)};
}

// bf16 -> fp32 is exact.
inline float f32_from_bf16(Bf16 value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

// The value a compute-typed store keeps: itself for f32, rounded through bf16 for bf16.
inline Real round_to(DType dtype, Real value) {
  return dtype == DType::f32 ? value : f32_from_bf16(bf16_from_f32(static_cast<float>(value)));
}

// Loads element `index` of a compute-typed array as fp32 (exact for both types).
inline Real load_as_f32(const void* data, DType dtype, std::int64_t index) {
  if (dtype == DType::f32) return static_cast<const Real*>(data)[index];
  return f32_from_bf16(static_cast<const Bf16*>(data)[index]);
}

// Stores an fp32 value into element `index` of a compute-typed array (rounding for bf16).
inline void store_from_f32(void* data, DType dtype, std::int64_t index, Real value) {
  if (dtype == DType::f32) {
    static_cast<Real*>(data)[index] = value;
  } else {
    static_cast<Bf16*>(data)[index] = bf16_from_f32(static_cast<float>(value));
  }
}

// How a CUDA entry point runs: on `stream`, with scratch owned by the cuda backend. Opaque here so
// the kernel headers include no CUDA header; the .cu casts them back (cudaStream_t is a pointer).
struct CudaLaunch {
  void* stream = nullptr;             // cudaStream_t
  void* workspace = nullptr;          // device scratch, reused by every op on this stream
  std::int64_t workspace_bytes = 0;
  void* blas_handle = nullptr;        // cublasLtHandle_t, for gemm_cuda
};

}  // namespace tandem::production
