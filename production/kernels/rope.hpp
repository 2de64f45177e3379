// RoPE with per-token positions (SPEC 3, 4), rotate-half convention: in every head the pair
// (i, i + hd/2) turns by positions[t] * base^(-2i/hd). The cos/sin tables of a microbatch are
// built once (in double, rounded to fp32, so positions up to 2^24 keep their angle) and read by
// the forward (rotate) and the backward (rotate back) of q and k in every layer.
// Host twin in rope_host.cpp, CUDA twin in rope.cu.
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// cosines[t, i] = fp32(cos(positions[t] * pow(base, -2i/hd))), all in double before the rounding;
// sines likewise.
struct RopeTableParams {
  const std::int32_t* positions = nullptr;  // [rows]
  Real* cosines = nullptr;                 // [rows, head_dim/2] fp32
  Real* sines = nullptr;                   // [rows, head_dim/2] fp32
  std::int64_t rows = 0;
  std::int64_t head_dim = 0;                // hd, even
  double base = 10000.0;                    // --rotary-base
};

// In place: forward (a, b) -> (a cos - b sin, b cos + a sin); backward (the transpose)
// (da, db) -> (da cos + db sin, db cos - da sin). fp32 inside, one rounding per stored element.
struct RopeParams {
  void* activations = nullptr;       // [rows, heads * head_dim] compute dtype, in place
  const Real* cosines = nullptr;    // [rows, head_dim/2]
  const Real* sines = nullptr;      // [rows, head_dim/2]
  std::int64_t rows = 0;
  std::int64_t heads = 0;            // H for queries, G for keys
  std::int64_t head_dim = 0;
  DType dtype = DType::f32;
};

void rope_table_host(const RopeTableParams& params);
void rope_forward_host(const RopeParams& params);
void rope_backward_host(const RopeParams& params);
void rope_table_cuda(const RopeTableParams& params, const CudaLaunch& launch);
void rope_forward_cuda(const RopeParams& params, const CudaLaunch& launch);
void rope_backward_cuda(const RopeParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
