// The bf16 CUDA twin of the document-masked causal attention (attention.hpp) on tensor cores,
// FlashAttention-2 style: warp-level mma.sync.m16n8k16 (bf16 operands, fp32 accumulators) fed by
// ldmatrix from shared memory. attention.cu calls it for every bf16 launch; fp32 keeps the CUDA-core
// kernel there. Every head_dim in [1, 128] runs here: the kernels are compiled for padded head dims
// 16, 32, 64 and 128 and read zeros past head_dim (zero products are exact), so no shape falls back.
//
// Tiling: a block is 4 warps (128 threads) and works on tiles of kRows = 64 queries and kKeys = 64
// keys, rows of [64, hd + 8] bf16 in shared memory (the 16-byte pad keeps ldmatrix free of bank
// conflicts). Each warp owns 16 rows of its block's tile; an m16n8 accumulator holds, per thread,
// rows lane/4 and lane/4 + 8 and columns 2 (lane % 4) + {0, 1} of an 8-column slice.
//   forward: one block per (query tile, head, sample), the last query tiles (the most key tiles)
//     first in each row of the grid, as in the dQ kernel (in the dK/dV kernel the first key tiles
//     carry the most work and come first anyway). The key tiles run from the one holding the
//     tile's earliest attention_start to the diagonal, so fully masked tiles cost nothing and the
//     work follows the sum of squared document lengths; inside a tile each (t, s) checks
//     attention_start[t] <= s <= t. S = Q K^T on tensor cores, z = S * scale in fp32, online
//     softmax in fp32: per key tile m = max(m, max of the tile's allowed z), the accumulator and
//     the row sum rescaled by exp(m_old - m), p = exp(z - m) in fp32 added to the row sum
//     unrounded, then p ROUNDED TO BF16 for O += P V. At the end O / sum, log-sum-exp = m + log(sum).
//   backward, deterministic with no atomics: D_t = dctx_t . ctx_t in fp32 (dimensions increasing);
//     dK and dV by one block per (key tile, group, sample), each warp 16 keys, iterating over the
//     group's heads in increasing order, then over query tiles in increasing order; dQ by one block
//     per (query tile, head, sample) iterating over key tiles in increasing order. Both recompute
//     z = S * scale (the dK/dV kernel as S^T = K Q^T, whose fp32 sums may differ from the
//     forward's in the last bits) and p = exp(z - lse) in fp32; dz = p (dp - D) in fp32.
//     ROUNDED TO BF16: p before dV += P^T dctx, dz before dQ += dZ K and dK += dZ^T Q. dQ and dK are
//     multiplied by scale once, in fp32, after their sums.
// The host twin (attention_host.cpp) rounds at exactly these points, with the same 64-key tiles
// for the forward's running max (kAttentionKeyTile). Inside an mma the order and rounding of the
// fp32 additions are the hardware's; they are fixed, so every launch is bitwise repeatable.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "production/cuda/kernel_support.cuh"
#include "production/kernels/attention_common.cuh"
#include "production/kernels/attention_tensor_core.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
using namespace attention_detail;
constexpr int kThreads = 128;                  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;                      // queries a tile (16 per warp)
constexpr int kKeys = kAttentionKeyTile;       // keys a tile: the host mirrors the running max per tile
constexpr int kPad = 8;                        // bf16 elements padding each shared row (16 bytes)
constexpr int kMaxHeadDim = 128;
static_assert(kRows == kWarps * 16 && kKeys == kRows, "the backward pairs key tiles with query tiles");

// The launch's shape as the kernels read it.
struct Geometry {
  std::int64_t seq = 0;
  int heads = 0;
  int groups = 0;
  int heads_per_group = 0;
  int head_dim = 0;      // the real head dimension; the kernel's kHeadDim pads it
  bool vector_loads = false;  // head_dim % 8 == 0 and 16-byte aligned bases: 16-byte loads
  float scale = 1.0f;
};

// ---- warp-level tensor-core primitives ----------------------------------------------------------
// Built for cuda-sim, each is the same instruction's warp-collective emulation from the PTX ISA's
// fragment tables (cuda_sim/tensor_core.hpp), since the host compiler cannot assemble PTX.

// D += A B for one m16n8k16 product: A [16, 16] row-major bf16 in 4 registers, B [16, 8]
// column-major bf16 in 2, D [16, 8] fp32 in 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16").
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
#if defined(TANDEM_CUDA_SIM)
  ::tandem::cuda_sim::mma_m16n8k16_bf16(d, a, b0, b1, __FILE__, __LINE__);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
// Lane l receives, in register i, row l / 4, columns 2 (l % 4) + {0, 1} of matrix i; with .trans
// it receives column l / 4, rows 2 (l % 4) + {0, 1}.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const std::uint16_t* row) {
#if defined(TANDEM_CUDA_SIM)
  ::tandem::cuda_sim::ldmatrix_x4(r, row, false, __FILE__, __LINE__);
#else
  const auto address = static_cast<unsigned int>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const std::uint16_t* row) {
#if defined(TANDEM_CUDA_SIM)
  ::tandem::cuda_sim::ldmatrix_x4(r, row, true, __FILE__, __LINE__);
#else
  const auto address = static_cast<unsigned int>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
#endif
}

// The A fragment of the [16, 16] block at (row0, col0) of a row-major tile [rows, pitch]:
// matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, 8-15).
template <int kPitch>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const std::uint16_t* tile, int row0, int col0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  ldmatrix_x4(a, tile + (row0 + (matrix & 1) * 8 + lane % 8) * kPitch + col0 + (matrix >> 1) * 8);
}

// B fragments of two n8 slices when the tile holds B transposed, [n, k] row-major (K for Q K^T):
// the block n in [n0, n0 + 16), k in [k0, k0 + 16). b[0], b[1] serve columns n0..n0+7 and
// b[2], b[3] columns n0+8..n0+15.
template <int kPitch>
__device__ __forceinline__ void load_b_from_rows_n(std::uint32_t (&b)[4], const std::uint16_t* tile, int n0, int k0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  ldmatrix_x4(b, tile + (n0 + (matrix >> 1) * 8 + lane % 8) * kPitch + k0 + (matrix & 1) * 8);
}

// The same two slices when the tile holds B itself, [k, n] row-major (V for P V): transposed loads.
template <int kPitch>
__device__ __forceinline__ void load_b_from_rows_k(std::uint32_t (&b)[4], const std::uint16_t* tile, int k0, int n0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  ldmatrix_x4_trans(b, tile + (k0 + (matrix & 1) * 8 + lane % 8) * kPitch + n0 + (matrix >> 1) * 8);
}

// Two fp32 values as the bf16 pair of one fragment register (lower column in the lower half),
// rounded by the host's rule (types.hpp's bf16_from_f32).
__device__ __forceinline__ std::uint32_t pack_bf16(float lower, float upper) {
  return static_cast<std::uint32_t>(bf16_bits(lower)) | (static_cast<std::uint32_t>(bf16_bits(upper)) << 16);
}

// The A fragment for k-step j of a product whose left operand is an accumulator [16, 8 * slices]
// (columns 16j .. 16j + 15 are slices 2j and 2j + 1), rounded to bf16.
__device__ __forceinline__ void accumulator_as_a(std::uint32_t (&a)[4], const float (&left)[4],
                                                 const float (&right)[4]) {
  a[0] = pack_bf16(left[0], left[1]);    // row lane/4,     columns 2 (lane%4) + {0, 1}
  a[1] = pack_bf16(left[2], left[3]);    // row lane/4 + 8
  a[2] = pack_bf16(right[0], right[1]);  // row lane/4,     columns 8 + 2 (lane%4) + {0, 1}
  a[3] = pack_bf16(right[2], right[3]);  // row lane/4 + 8
}

// The same value on the 4 lanes of an accumulator row (lanes 4r .. 4r + 3), in a fixed order.
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xFFFFFFFFu, value, 1);
  return value + __shfl_xor_sync(0xFFFFFFFFu, value, 2);
}

// ---- tiles in shared memory ---------------------------------------------------------------------

// Element offset of (sample, t, head) in a [samples*seq, heads*hd] activation.
__device__ __forceinline__ std::int64_t offset_of(const Geometry& g, int sample, std::int64_t t, int head, int heads) {
  return ((static_cast<std::int64_t>(sample) * g.seq + t) * heads + head) * g.head_dim;
}

// Rows [first, first + 64) of one head into a [64, kHeadDim + kPad] bf16 tile; zeros past seq and
// past head_dim. All threads take part; the caller synchronizes.
template <int kHeadDim>
__device__ void load_tile(std::uint16_t* tile, const Bf16* source, const Geometry& g, int sample, std::int64_t first,
                          int head, int heads) {
  constexpr int kPitch = kHeadDim + kPad;
  if (g.vector_loads) {
    constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks a row
    for (int index = threadIdx.x; index < kRows * kChunks; index += kThreads) {
      const int row = index / kChunks;
      const int d0 = (index % kChunks) * 8;
      const std::int64_t t = first + row;
      uint4 chunk = make_uint4(0u, 0u, 0u, 0u);
      if (t < g.seq && d0 < g.head_dim) {
        chunk = *reinterpret_cast<const uint4*>(source + offset_of(g, sample, t, head, heads) + d0);
      }
      *reinterpret_cast<uint4*>(tile + row * kPitch + d0) = chunk;
    }
  } else {
    for (int index = threadIdx.x; index < kRows * kHeadDim; index += kThreads) {
      const int row = index / kHeadDim;
      const int d = index % kHeadDim;
      const std::int64_t t = first + row;
      tile[row * kPitch + d] = t < g.seq && d < g.head_dim ? source[offset_of(g, sample, t, head, heads) + d].bits
                                                           : std::uint16_t{0};
    }
  }
}

// ---- kernels ------------------------------------------------------------------------------------

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) forward_kernel(const Bf16* query, const Bf16* key, const Bf16* value,
                                                           const std::int32_t* attention_start, Bf16* context,
                                                           float* logsumexp, Geometry g) {
  constexpr int kPitch = kHeadDim + kPad;
  constexpr int kDimSteps = kHeadDim / 16;   // k-steps of q . k; 16-dimension blocks of the output
  constexpr int kKeySlices = kKeys / 8;      // n8 slices of a score row
  TANDEM_DYNAMIC_SHARED(std::uint16_t, tiles);
  std::uint16_t* q_tile = tiles;                  // [kRows, kPitch]
  std::uint16_t* k_tile = q_tile + kRows * kPitch;  // [kKeys, kPitch]
  std::uint16_t* v_tile = k_tile + kKeys * kPitch;  // [kKeys, kPitch]
  __shared__ int starts[kRows];
  __shared__ int earliest;
  const std::int64_t q0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;  // longest first
  const int head = blockIdx.y;
  const int sample = blockIdx.z;
  const int group = head / g.heads_per_group;  // SPEC 4: repeat_kv
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int column = 2 * (lane % 4);             // first column of this thread's accumulator pairs
  const int row = warp * 16 + lane / 4;          // this thread's rows: row and row + 8 of the tile

  load_tile<kHeadDim>(q_tile, query, g, sample, q0, head, g.heads);
  load_starts<kRows>(starts, &earliest, attention_start, g, sample, q0);
  const std::int64_t t[2] = {q0 + row, q0 + row + 8};
  const int first[2] = {starts[row], starts[row + 8]};
  std::uint32_t q_fragment[kDimSteps][4];
#pragma unroll
  for (int step = 0; step < kDimSteps; ++step) load_a<kPitch>(q_fragment[step], q_tile, warp * 16, step * 16);

  float output[2 * kDimSteps][4];  // [16 rows, kHeadDim] of this warp
#pragma unroll
  for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
#pragma unroll
    for (int e = 0; e < 4; ++e) output[slice][e] = 0.0f;
  }
  float running_max[2] = {-INFINITY, -INFINITY};
  float running_sum[2] = {0.0f, 0.0f};
  const std::int64_t last_key = min(q0 + kRows - 1, g.seq - 1);
  for (std::int64_t k0 = (earliest / kKeys) * static_cast<std::int64_t>(kKeys); k0 <= last_key; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<kHeadDim>(k_tile, key, g, sample, k0, group, g.groups);
    load_tile<kHeadDim>(v_tile, value, g, sample, k0, group, g.groups);
    __syncthreads();

    float score[kKeySlices][4];
#pragma unroll
    for (int slice = 0; slice < kKeySlices; ++slice) {
#pragma unroll
      for (int e = 0; e < 4; ++e) score[slice][e] = 0.0f;
    }
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step) {
#pragma unroll
      for (int pair = 0; pair < kKeySlices / 2; ++pair) {
        std::uint32_t b[4];
        load_b_from_rows_n<kPitch>(b, k_tile, pair * 16, step * 16);
        mma_bf16(score[2 * pair], q_fragment[step], b[0], b[1]);
        mma_bf16(score[2 * pair + 1], q_fragment[step], b[2], b[3]);
      }
    }
    // z = S * scale for allowed (t, s), -inf otherwise; element e of a slice is row half e / 2.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int slice = 0; slice < kKeySlices; ++slice) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const std::int64_t s = k0 + slice * 8 + column + (e & 1);
        const bool allowed = t[half] < g.seq && s >= first[half] && s <= t[half];
        score[slice][e] = allowed ? mul(score[slice][e], g.scale) : -INFINITY;
        tile_max[half] = fmaxf(tile_max[half], score[slice][e]);
      }
    }
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float new_max = fmaxf(running_max[half], quad_max(tile_max[half]));
      // exp(old max - new max) rescales what was summed so far; nothing was while the max is -inf.
      correction[half] = running_max[half] == -INFINITY ? 0.0f : expf(running_max[half] - new_max);
      running_max[half] = new_max;
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int slice = 0; slice < kKeySlices; ++slice) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const float probability = score[slice][e] == -INFINITY ? 0.0f : expf(score[slice][e] - running_max[half]);
        score[slice][e] = probability;
        tile_sum[half] += probability;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      running_sum[half] = running_sum[half] * correction[half] + quad_sum(tile_sum[half]);
    }
#pragma unroll
    for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
      output[slice][0] *= correction[0];
      output[slice][1] *= correction[0];
      output[slice][2] *= correction[1];
      output[slice][3] *= correction[1];
    }
    // O += bf16(P) V, keys in steps of 16.
#pragma unroll
    for (int step = 0; step < kKeys / 16; ++step) {
      std::uint32_t p_fragment[4];
      accumulator_as_a(p_fragment, score[2 * step], score[2 * step + 1]);
#pragma unroll
      for (int block = 0; block < kDimSteps; ++block) {
        std::uint32_t b[4];
        load_b_from_rows_k<kPitch>(b, v_tile, step * 16, block * 16);
        mma_bf16(output[2 * block], p_fragment, b[0], b[1]);
        mma_bf16(output[2 * block + 1], p_fragment, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (t[half] >= g.seq) continue;
    if (lane % 4 == 0) {
      logsumexp[(static_cast<std::int64_t>(sample) * g.seq + t[half]) * g.heads + head] =
          running_max[half] + logf(running_sum[half]);
    }
    const std::int64_t out = offset_of(g, sample, t[half], head, g.heads);
#pragma unroll
    for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = slice * 8 + column + c;
        if (d < g.head_dim) store(context, out + d, div(output[slice][2 * half + c], running_sum[half]));
      }
    }
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) key_value_grad_kernel(
    const Bf16* query, const Bf16* key, const Bf16* value, const Bf16* context_grad, const float* logsumexp,
    const float* context_dots, const std::int32_t* attention_start, Bf16* key_grad, Bf16* value_grad, Geometry g) {
  constexpr int kPitch = kHeadDim + kPad;
  constexpr int kDimSteps = kHeadDim / 16;
  constexpr int kQuerySlices = kRows / 8;    // n8 slices of a transposed score row (queries)
  TANDEM_DYNAMIC_SHARED(std::uint16_t, tiles);
  std::uint16_t* k_tile = tiles;                        // [kKeys, kPitch]
  std::uint16_t* v_tile = k_tile + kKeys * kPitch;      // [kKeys, kPitch]
  std::uint16_t* q_tile = v_tile + kKeys * kPitch;      // [kRows, kPitch]
  std::uint16_t* dctx_tile = q_tile + kRows * kPitch;   // [kRows, kPitch]
  __shared__ int starts[kRows];
  __shared__ int earliest;
  __shared__ float lse_tile[kRows];
  __shared__ float dot_tile[kRows];
  const std::int64_t k0 = static_cast<std::int64_t>(blockIdx.x) * kKeys;
  const int group = blockIdx.y;
  const int sample = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int column = 2 * (lane % 4);
  const int key_row = warp * 16 + lane / 4;  // this thread's keys: key_row and key_row + 8 of the tile
  const std::int64_t s[2] = {k0 + key_row, k0 + key_row + 8};
  const std::int64_t last_key = min(k0 + kKeys - 1, g.seq - 1);

  load_tile<kHeadDim>(k_tile, key, g, sample, k0, group, g.groups);
  load_tile<kHeadDim>(v_tile, value, g, sample, k0, group, g.groups);
  float key_sum[2 * kDimSteps][4];    // [16 keys, kHeadDim] sum of dz q (scale applied at the end)
  float value_sum[2 * kDimSteps][4];  // [16 keys, kHeadDim] sum of p dctx
#pragma unroll
  for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
#pragma unroll
    for (int e = 0; e < 4; ++e) key_sum[slice][e] = value_sum[slice][e] = 0.0f;
  }
  for (int head = group * g.heads_per_group; head < (group + 1) * g.heads_per_group; ++head) {
    for (std::int64_t q0 = k0; q0 < g.seq; q0 += kRows) {
      __syncthreads();  // every warp is done with the previous query tile (and the K, V loads landed)
      load_starts<kRows>(starts, &earliest, attention_start, g, sample, q0);
      if (earliest > last_key) continue;  // every row of this query tile starts after our keys
      load_tile<kHeadDim>(q_tile, query, g, sample, q0, head, g.heads);
      load_tile<kHeadDim>(dctx_tile, context_grad, g, sample, q0, head, g.heads);
      load_row_stats<kRows>(lse_tile, logsumexp, g, sample, q0, head);
      load_row_stats<kRows>(dot_tile, context_dots, g, sample, q0, head);
      __syncthreads();

      // Transposed scores S^T = K Q^T and dp^T = V dctx^T: [16 keys, 64 queries] of this warp.
      float score[kQuerySlices][4];
      float score_grad[kQuerySlices][4];
#pragma unroll
      for (int slice = 0; slice < kQuerySlices; ++slice) {
#pragma unroll
        for (int e = 0; e < 4; ++e) score[slice][e] = score_grad[slice][e] = 0.0f;
      }
#pragma unroll
      for (int step = 0; step < kDimSteps; ++step) {
        std::uint32_t k_fragment[4], v_fragment[4];
        load_a<kPitch>(k_fragment, k_tile, warp * 16, step * 16);
        load_a<kPitch>(v_fragment, v_tile, warp * 16, step * 16);
#pragma unroll
        for (int pair = 0; pair < kQuerySlices / 2; ++pair) {
          std::uint32_t b[4];
          load_b_from_rows_n<kPitch>(b, q_tile, pair * 16, step * 16);
          mma_bf16(score[2 * pair], k_fragment, b[0], b[1]);
          mma_bf16(score[2 * pair + 1], k_fragment, b[2], b[3]);
          load_b_from_rows_n<kPitch>(b, dctx_tile, pair * 16, step * 16);
          mma_bf16(score_grad[2 * pair], v_fragment, b[0], b[1]);
          mma_bf16(score_grad[2 * pair + 1], v_fragment, b[2], b[3]);
        }
      }
      // p = exp(z - lse) and dz = p (dp - D) in fp32 (score_grad holds dp until replaced).
#pragma unroll
      for (int slice = 0; slice < kQuerySlices; ++slice) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = slice * 8 + column + (e & 1);  // query row of the tile
          const std::int64_t t = q0 + r;
          const std::int64_t key_s = s[e / 2];
          const bool allowed = key_s < g.seq && t < g.seq && key_s >= starts[r] && key_s <= t;
          const float probability = allowed ? expf(mul(score[slice][e], g.scale) - lse_tile[r]) : 0.0f;
          score_grad[slice][e] = allowed ? mul(probability, sub(score_grad[slice][e], dot_tile[r])) : 0.0f;
          score[slice][e] = probability;
        }
      }
      // dV += bf16(P^T) dctx and dK += bf16(dZ^T) Q, queries in steps of 16.
#pragma unroll
      for (int step = 0; step < kRows / 16; ++step) {
        std::uint32_t p_fragment[4], dz_fragment[4];
        accumulator_as_a(p_fragment, score[2 * step], score[2 * step + 1]);
        accumulator_as_a(dz_fragment, score_grad[2 * step], score_grad[2 * step + 1]);
#pragma unroll
        for (int block = 0; block < kDimSteps; ++block) {
          std::uint32_t b[4];
          load_b_from_rows_k<kPitch>(b, dctx_tile, step * 16, block * 16);
          mma_bf16(value_sum[2 * block], p_fragment, b[0], b[1]);
          mma_bf16(value_sum[2 * block + 1], p_fragment, b[2], b[3]);
          load_b_from_rows_k<kPitch>(b, q_tile, step * 16, block * 16);
          mma_bf16(key_sum[2 * block], dz_fragment, b[0], b[1]);
          mma_bf16(key_sum[2 * block + 1], dz_fragment, b[2], b[3]);
        }
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (s[half] >= g.seq) continue;
    const std::int64_t out = offset_of(g, sample, s[half], group, g.groups);
#pragma unroll
    for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = slice * 8 + column + c;
        if (d >= g.head_dim) continue;
        store(key_grad, out + d, mul(key_sum[slice][2 * half + c], g.scale));
        store(value_grad, out + d, value_sum[slice][2 * half + c]);
      }
    }
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) query_grad_kernel(
    const Bf16* query, const Bf16* key, const Bf16* value, const Bf16* context_grad, const float* logsumexp,
    const float* context_dots, const std::int32_t* attention_start, Bf16* query_grad, Geometry g) {
  constexpr int kPitch = kHeadDim + kPad;
  constexpr int kDimSteps = kHeadDim / 16;
  constexpr int kKeySlices = kKeys / 8;
  TANDEM_DYNAMIC_SHARED(std::uint16_t, tiles);
  std::uint16_t* q_tile = tiles;                       // [kRows, kPitch]
  std::uint16_t* dctx_tile = q_tile + kRows * kPitch;  // [kRows, kPitch]
  std::uint16_t* k_tile = dctx_tile + kRows * kPitch;  // [kKeys, kPitch]
  std::uint16_t* v_tile = k_tile + kKeys * kPitch;     // [kKeys, kPitch]
  __shared__ int starts[kRows];
  __shared__ int earliest;
  __shared__ float lse_tile[kRows];
  __shared__ float dot_tile[kRows];
  const std::int64_t q0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;  // longest first
  const int head = blockIdx.y;
  const int sample = blockIdx.z;
  const int group = head / g.heads_per_group;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int column = 2 * (lane % 4);
  const int row = warp * 16 + lane / 4;

  load_tile<kHeadDim>(q_tile, query, g, sample, q0, head, g.heads);
  load_tile<kHeadDim>(dctx_tile, context_grad, g, sample, q0, head, g.heads);
  load_row_stats<kRows>(lse_tile, logsumexp, g, sample, q0, head);
  load_row_stats<kRows>(dot_tile, context_dots, g, sample, q0, head);
  load_starts<kRows>(starts, &earliest, attention_start, g, sample, q0);  // its barriers publish the loads
  const std::int64_t t[2] = {q0 + row, q0 + row + 8};
  const int first[2] = {starts[row], starts[row + 8]};
  const float lse[2] = {lse_tile[row], lse_tile[row + 8]};
  const float expected_grad[2] = {dot_tile[row], dot_tile[row + 8]};  // D_t
  float query_sum[2 * kDimSteps][4];  // [16 rows, kHeadDim] sum of dz k (scale applied at the end)
#pragma unroll
  for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
#pragma unroll
    for (int e = 0; e < 4; ++e) query_sum[slice][e] = 0.0f;
  }
  const std::int64_t last_key = min(q0 + kRows - 1, g.seq - 1);
  for (std::int64_t k0 = (earliest / kKeys) * static_cast<std::int64_t>(kKeys); k0 <= last_key; k0 += kKeys) {
    __syncthreads();
    load_tile<kHeadDim>(k_tile, key, g, sample, k0, group, g.groups);
    load_tile<kHeadDim>(v_tile, value, g, sample, k0, group, g.groups);
    __syncthreads();

    float score[kKeySlices][4];
    float score_grad[kKeySlices][4];
#pragma unroll
    for (int slice = 0; slice < kKeySlices; ++slice) {
#pragma unroll
      for (int e = 0; e < 4; ++e) score[slice][e] = score_grad[slice][e] = 0.0f;
    }
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step) {
      std::uint32_t q_fragment[4], dctx_fragment[4];
      load_a<kPitch>(q_fragment, q_tile, warp * 16, step * 16);
      load_a<kPitch>(dctx_fragment, dctx_tile, warp * 16, step * 16);
#pragma unroll
      for (int pair = 0; pair < kKeySlices / 2; ++pair) {
        std::uint32_t b[4];
        load_b_from_rows_n<kPitch>(b, k_tile, pair * 16, step * 16);
        mma_bf16(score[2 * pair], q_fragment, b[0], b[1]);
        mma_bf16(score[2 * pair + 1], q_fragment, b[2], b[3]);
        load_b_from_rows_n<kPitch>(b, v_tile, pair * 16, step * 16);
        mma_bf16(score_grad[2 * pair], dctx_fragment, b[0], b[1]);
        mma_bf16(score_grad[2 * pair + 1], dctx_fragment, b[2], b[3]);
      }
    }
#pragma unroll
    for (int slice = 0; slice < kKeySlices; ++slice) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const std::int64_t s = k0 + slice * 8 + column + (e & 1);
        const bool allowed = t[half] < g.seq && s >= first[half] && s <= t[half];
        const float probability = allowed ? expf(mul(score[slice][e], g.scale) - lse[half]) : 0.0f;
        score_grad[slice][e] = allowed ? mul(probability, sub(score_grad[slice][e], expected_grad[half])) : 0.0f;
      }
    }
    // dQ += bf16(dZ) K, keys in steps of 16.
#pragma unroll
    for (int step = 0; step < kKeys / 16; ++step) {
      std::uint32_t dz_fragment[4];
      accumulator_as_a(dz_fragment, score_grad[2 * step], score_grad[2 * step + 1]);
#pragma unroll
      for (int block = 0; block < kDimSteps; ++block) {
        std::uint32_t b[4];
        load_b_from_rows_k<kPitch>(b, k_tile, step * 16, block * 16);
        mma_bf16(query_sum[2 * block], dz_fragment, b[0], b[1]);
        mma_bf16(query_sum[2 * block + 1], dz_fragment, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (t[half] >= g.seq) continue;
    const std::int64_t out = offset_of(g, sample, t[half], head, g.heads);
#pragma unroll
    for (int slice = 0; slice < 2 * kDimSteps; ++slice) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = slice * 8 + column + c;
        if (d < g.head_dim) store(query_grad, out + d, mul(query_sum[slice][2 * half + c], g.scale));
      }
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Checks the shape (naming the field and the rule) and builds the kernels' geometry.
Geometry geometry_of(const AttentionShape& shape, float scale, DType dtype, bool bases_aligned, const char* op) {
  const auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(op) + ": " + what); };
  if (dtype != DType::bf16) fail("the tensor-core kernels take bf16 only (fp32 runs attention.cu's kernels)");
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim) {
    fail("head_dim " + std::to_string(shape.head_dim) + " must be in [1, " + std::to_string(kMaxHeadDim) +
         "] (the largest padded head dim compiled)");
  }
  if (shape.groups <= 0 || shape.heads <= 0 || shape.heads % shape.groups != 0) {
    fail("heads " + std::to_string(shape.heads) + " must be a positive multiple of groups " +
         std::to_string(shape.groups));
  }
  if (shape.heads > 65535 || shape.samples > 65535) fail("heads and samples must be <= 65535 (grid y and z)");
  Geometry g;
  g.seq = shape.seq;
  g.heads = static_cast<int>(shape.heads);
  g.groups = static_cast<int>(shape.groups);
  g.heads_per_group = static_cast<int>(shape.heads / shape.groups);
  g.head_dim = static_cast<int>(shape.head_dim);
  g.vector_loads = shape.head_dim % 8 == 0 && bases_aligned;
  g.scale = scale;
  return g;
}

// Calls body(std::integral_constant<int, P>{}) with P the smallest compiled head dim >= head_dim.
template <class Body>
void with_padded_head_dim(int head_dim, Body&& body) {
  if (head_dim <= 16) {
    body(std::integral_constant<int, 16>{});
  } else if (head_dim <= 32) {
    body(std::integral_constant<int, 32>{});
  } else if (head_dim <= 64) {
    body(std::integral_constant<int, 64>{});
  } else {
    body(std::integral_constant<int, 128>{});
  }
}

template <int kHeadDim>
constexpr int tile_bytes() {
  return kRows * (kHeadDim + kPad) * static_cast<int>(sizeof(std::uint16_t));
}

// Raises a kernel's dynamic shared-memory limit to what this launch needs (over 48 KiB at hd 128).
template <class Kernel>
void allow_shared_memory(Kernel kernel, int bytes) {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

void attention_forward_tensor_core(const AttentionForwardParams& p, const CudaLaunch& launch) {
  const bool bases_aligned = aligned_16(p.query) && aligned_16(p.key) && aligned_16(p.value);
  const Geometry g = geometry_of(p.shape, p.scale, p.dtype, bases_aligned, "attention_forward_cuda (bf16)");
  if (p.shape.samples <= 0 || p.shape.seq <= 0) return;
  const dim3 grid(blocks_for(p.shape.seq, kRows), static_cast<unsigned int>(g.heads),
                  static_cast<unsigned int>(p.shape.samples));
  with_padded_head_dim(g.head_dim, [&](auto padded) {
    constexpr int kHeadDim = decltype(padded)::value;
    constexpr int kSharedBytes = 3 * tile_bytes<kHeadDim>();
    allow_shared_memory(forward_kernel<kHeadDim>, kSharedBytes);
    TANDEM_LAUNCH(grid, kThreads, kSharedBytes, stream_of(launch), forward_kernel<kHeadDim>)(
        static_cast<const Bf16*>(p.query), static_cast<const Bf16*>(p.key), static_cast<const Bf16*>(p.value),
        p.attention_start, static_cast<Bf16*>(p.context), p.logsumexp, g);
  });
  TANDEM_CUDA_CHECK_LAUNCH(forward_kernel);
}

void attention_backward_tensor_core(const AttentionBackwardParams& p, const CudaLaunch& launch) {
  const bool bases_aligned = aligned_16(p.query) && aligned_16(p.key) && aligned_16(p.value) &&
                             aligned_16(p.context_grad);
  const Geometry g = geometry_of(p.shape, p.scale, p.dtype, bases_aligned, "attention_backward_cuda (bf16)");
  if (p.shape.samples <= 0 || p.shape.seq <= 0) return;
  const std::int64_t rows = p.shape.samples * p.shape.seq;
  auto* context_dots = static_cast<float*>(workspace_of(
      launch, rows * g.heads * static_cast<std::int64_t>(sizeof(float)), "attention_backward_cuda (bf16)"));
  const auto* query = static_cast<const Bf16*>(p.query);
  const auto* key = static_cast<const Bf16*>(p.key);
  const auto* value = static_cast<const Bf16*>(p.value);
  const auto* context_grad = static_cast<const Bf16*>(p.context_grad);
  TANDEM_LAUNCH(blocks_for(rows * g.heads, 256), 256, 0, stream_of(launch), context_dot_kernel<Bf16>)(
      static_cast<const Bf16*>(p.context), context_grad, context_dots, rows, g.heads, g.head_dim);
  TANDEM_CUDA_CHECK_LAUNCH(context_dot_kernel);
  const unsigned int tiles = blocks_for(p.shape.seq, kRows);
  const auto samples = static_cast<unsigned int>(p.shape.samples);
  with_padded_head_dim(g.head_dim, [&](auto padded) {
    constexpr int kHeadDim = decltype(padded)::value;
    constexpr int kSharedBytes = 4 * tile_bytes<kHeadDim>();
    allow_shared_memory(key_value_grad_kernel<kHeadDim>, kSharedBytes);
    TANDEM_LAUNCH(dim3(tiles, static_cast<unsigned int>(g.groups), samples), kThreads,
                                      kSharedBytes, stream_of(launch), key_value_grad_kernel<kHeadDim>)(
        query, key, value, context_grad, p.logsumexp, context_dots, p.attention_start,
        static_cast<Bf16*>(p.key_grad), static_cast<Bf16*>(p.value_grad), g);
    TANDEM_CUDA_CHECK_LAUNCH(key_value_grad_kernel);
    allow_shared_memory(query_grad_kernel<kHeadDim>, kSharedBytes);
    TANDEM_LAUNCH(dim3(tiles, static_cast<unsigned int>(g.heads), samples), kThreads, kSharedBytes,
                                  stream_of(launch), query_grad_kernel<kHeadDim>)(query, key, value, context_grad, p.logsumexp, context_dots,
                                                       p.attention_start, static_cast<Bf16*>(p.query_grad), g);
    TANDEM_CUDA_CHECK_LAUNCH(query_grad_kernel);
  });
}

}  // namespace tandem::production
