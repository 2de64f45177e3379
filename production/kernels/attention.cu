// CUDA twin of the document-masked causal attention (attention.hpp): the entry points dispatch on
// the compute dtype, explicitly:
//   bf16 -> attention_tensor_core.cu (tensor cores, every head_dim in [1, 128]);
//   fp32 -> the kernels below, FlashAttention-2 style in fp32 on the CUDA cores:
//   - tiles of kTile queries x kTile keys; a query tile visits only the key tiles from its
//     earliest attention_start to its diagonal, so fully masked tiles cost nothing and the work
//     follows the sum of squared document lengths; inside a tile each (t, s) checks
//     attention_start[t] <= s <= t;
//   - forward: online softmax over the key tiles in increasing order, keeping the running max and
//     sum per row, the context divided once at the end, and log-sum-exp = max + log(sum);
//   - backward, deterministic with no atomics: D_t = dctx_t . ctx_t per (row, head); dK and dV by
//     one block per (key tile, group) iterating over the group's heads, then query tiles in
//     increasing order; dQ by one block per (query tile, head) iterating over key tiles in
//     increasing order. Probabilities are recomputed from the saved log-sum-exp, never rounded.
// Threads: 128 a block, 4 per tile row; thread `lane` of a row owns the head dimensions
// lane, lane + 4, ... (so head_dim <= kMaxHeadDim). Dot products use explicit fmaf in increasing
// dimension order, the same in every kernel, and the score z = dot * scale is rounded by __fmul_rn
// (kernel_support.cuh's mul), which nvcc never contracts into a neighbouring add (a plain `*`
// followed by `z - lse` may become one fma in one kernel and not in another), so the forward's and
// backward's scores agree bit for bit. The twins differ in summation order and expf (within 2 ulp): an approximate comparison.
#include <algorithm>
#include <climits>

#include "production/cuda/kernel_support.cuh"
#include "production/kernels/attention_common.cuh"
#include "production/kernels/attention.hpp"
#include "production/kernels/attention_tensor_core.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
using namespace attention_detail;
constexpr int kTile = 32;                          // queries and keys per tile
constexpr int kThreads = 128;                      // 4 threads per tile row
constexpr int kLanesPerRow = kThreads / kTile;     // 4
constexpr int kScoresPerThread = kTile / kLanesPerRow;  // 8
constexpr int kMaxHeadDim = 128;
constexpr int kDimsPerThread = kMaxHeadDim / kLanesPerRow;  // 32
constexpr int kScoreStride = kTile + 1;            // padded rows of a [kTile, kTile] tile

// The launch's shape as the kernels read it (32-bit where the grid already bounds the value).
struct Geometry {
  std::int64_t seq = 0;
  int heads = 0;
  int groups = 0;
  int heads_per_group = 0;
  int head_dim = 0;
  int stride = 0;      // head_dim + 1: shared-memory row pitch of a [kTile, head_dim] tile
  float scale = 1.0f;
};

// Element offset of (sample, t, head) in a [samples*seq, heads*hd] activation.
__device__ __forceinline__ std::int64_t offset_of(const Geometry& g, int sample, std::int64_t t, int head,
                                                  int heads) {
  return ((static_cast<std::int64_t>(sample) * g.seq + t) * heads + head) * g.head_dim;
}

// Loads rows [first, first + kTile) of one head into a [kTile, stride] fp32 tile (zeros past seq).
template <class T>
__device__ void load_tile(float* tile, const T* source, const Geometry& g, int sample, std::int64_t first,
                          int head, int heads) {
  for (int index = threadIdx.x; index < kTile * g.head_dim; index += kThreads) {
    const int row = index / g.head_dim;
    const int i = index % g.head_dim;
    const std::int64_t t = first + row;
    tile[row * g.stride + i] = t < g.seq ? load(source, offset_of(g, sample, t, head, heads) + i) : 0.0f;
  }
}

__device__ __forceinline__ float dot_rows(const float* a, const float* b, int length) {
  float sum = 0.0f;
  for (int i = 0; i < length; ++i) sum = fmaf(a[i], b[i], sum);
  return sum;
}

__device__ __forceinline__ float row_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, 2));
}

// The same total on the row's 4 lanes ((a+b)+(c+d) with commutative adds).
__device__ __forceinline__ float row_sum(float value) {
  value += __shfl_xor_sync(0xFFFFFFFFu, value, 1);
  return value + __shfl_xor_sync(0xFFFFFFFFu, value, 2);
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(
    const T* query, const T* key, const T* value, const std::int32_t* attention_start, T* context,
    float* logsumexp, Geometry g) {
  TANDEM_DYNAMIC_SHARED(float, shared);
  float* q_tile = shared;                        // [kTile, stride]
  float* k_tile = q_tile + kTile * g.stride;     // [kTile, stride]
  float* v_tile = k_tile + kTile * g.stride;     // [kTile, stride]
  float* p_tile = v_tile + kTile * g.stride;     // [kTile, kScoreStride]
  __shared__ int starts[kTile];
  __shared__ int earliest;
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int head = blockIdx.y;
  const int sample = blockIdx.z;
  const int group = head / g.heads_per_group;  // SPEC 4: repeat_kv
  const int r = threadIdx.x / kLanesPerRow;
  const int lane = threadIdx.x % kLanesPerRow;
  const std::int64_t t = q0 + r;

  load_tile(q_tile, query, g, sample, q0, head, g.heads);
  load_starts<kTile>(starts, &earliest, attention_start, g, sample, q0);
  const std::int64_t my_start = starts[r];
  float output[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) output[k] = 0.0f;
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  const std::int64_t last_key = min(q0 + kTile - 1, g.seq - 1);
  for (std::int64_t k0 = (earliest / kTile) * static_cast<std::int64_t>(kTile); k0 <= last_key; k0 += kTile) {
    load_tile(k_tile, key, g, sample, k0, group, g.groups);
    load_tile(v_tile, value, g, sample, k0, group, g.groups);
    __syncthreads();
    float scores[kScoresPerThread];
    unsigned int allowed = 0;
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const int c = lane + kLanesPerRow * j;
      const std::int64_t s = k0 + c;
      scores[j] = mul(dot_rows(q_tile + r * g.stride, k_tile + c * g.stride, g.head_dim), g.scale);
      if (t < g.seq && s >= my_start && s <= t) {
        allowed |= 1u << j;
        tile_max = fmaxf(tile_max, scores[j]);
      }
    }
    const float new_max = fmaxf(running_max, row_max(tile_max));
    // exp(old max - new max) rescales what was summed so far; nothing was while the max is -inf.
    const float correction = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const float probability = (allowed >> j) & 1u ? expf(scores[j] - new_max) : 0.0f;
      p_tile[r * kScoreStride + lane + kLanesPerRow * j] = probability;
      tile_sum += probability;
    }
    running_sum = running_sum * correction + row_sum(tile_sum);
    running_max = new_max;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
      const int d = lane + kLanesPerRow * k;
      if (d >= g.head_dim) break;
      float sum = output[k] * correction;
      for (int c = 0; c < kTile; ++c) sum = fmaf(p_tile[r * kScoreStride + c], v_tile[c * g.stride + d], sum);
      output[k] = sum;
    }
    __syncthreads();
  }
  if (t >= g.seq) return;
  if (lane == 0) {
    logsumexp[(static_cast<std::int64_t>(sample) * g.seq + t) * g.heads + head] = running_max + logf(running_sum);
  }
  const std::int64_t out = offset_of(g, sample, t, head, g.heads);
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = lane + kLanesPerRow * k;
    if (d >= g.head_dim) break;
    store(context, out + d, output[k] / running_sum);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_key_value_grad_kernel(
    const T* query, const T* key, const T* value, const T* context_grad, const float* logsumexp,
    const float* context_dots, const std::int32_t* attention_start, T* key_grad, T* value_grad, Geometry g) {
  TANDEM_DYNAMIC_SHARED(float, shared);
  float* k_tile = shared;                         // [kTile, stride]
  float* v_tile = k_tile + kTile * g.stride;      // [kTile, stride]
  float* q_tile = v_tile + kTile * g.stride;      // [kTile, stride]
  float* dctx_tile = q_tile + kTile * g.stride;   // [kTile, stride]
  float* p_tile = dctx_tile + kTile * g.stride;   // [kTile, kScoreStride] p[t, s]
  float* ds_tile = p_tile + kTile * kScoreStride; // [kTile, kScoreStride] dz[t, s] * scale
  __shared__ int starts[kTile];
  __shared__ int earliest;
  __shared__ float lse_tile[kTile];
  __shared__ float dot_tile[kTile];
  const std::int64_t k0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int group = blockIdx.y;
  const int sample = blockIdx.z;
  const int c = threadIdx.x / kLanesPerRow;  // this thread's key row
  const int lane = threadIdx.x % kLanesPerRow;
  const std::int64_t s = k0 + c;
  const std::int64_t last_key = min(k0 + kTile - 1, g.seq - 1);

  load_tile(k_tile, key, g, sample, k0, group, g.groups);
  load_tile(v_tile, value, g, sample, k0, group, g.groups);
  float key_sum[kDimsPerThread];
  float value_sum[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) key_sum[k] = value_sum[k] = 0.0f;
  for (int head = group * g.heads_per_group; head < (group + 1) * g.heads_per_group; ++head) {
    for (std::int64_t q0 = k0; q0 < g.seq; q0 += kTile) {
      load_starts<kTile>(starts, &earliest, attention_start, g, sample, q0);
      if (earliest > last_key) continue;  // every row of this query tile starts after our keys
      load_tile(q_tile, query, g, sample, q0, head, g.heads);
      load_tile(dctx_tile, context_grad, g, sample, q0, head, g.heads);
      load_row_stats<kTile>(lse_tile, logsumexp, g, sample, q0, head);
      load_row_stats<kTile>(dot_tile, context_dots, g, sample, q0, head);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kScoresPerThread; ++j) {
        const int r = lane + kLanesPerRow * j;
        const std::int64_t t = q0 + r;
        const bool allowed = t < g.seq && s < g.seq && s >= starts[r] && s <= t;
        float probability = 0.0f;
        float score_grad = 0.0f;
        if (allowed) {
          const float z = mul(dot_rows(q_tile + r * g.stride, k_tile + c * g.stride, g.head_dim), g.scale);
          probability = expf(z - lse_tile[r]);
          const float probability_grad = dot_rows(dctx_tile + r * g.stride, v_tile + c * g.stride, g.head_dim);
          score_grad = mul(mul(probability, probability_grad - dot_tile[r]), g.scale);
        }
        p_tile[r * kScoreStride + c] = probability;
        ds_tile[r * kScoreStride + c] = score_grad;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        const int d = lane + kLanesPerRow * k;
        if (d >= g.head_dim) break;
        float dk = key_sum[k];
        float dv = value_sum[k];
        for (int r = 0; r < kTile; ++r) {
          dk = fmaf(ds_tile[r * kScoreStride + c], q_tile[r * g.stride + d], dk);
          dv = fmaf(p_tile[r * kScoreStride + c], dctx_tile[r * g.stride + d], dv);
        }
        key_sum[k] = dk;
        value_sum[k] = dv;
      }
      __syncthreads();
    }
  }
  if (s >= g.seq) return;
  const std::int64_t out = offset_of(g, sample, s, group, g.groups);
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = lane + kLanesPerRow * k;
    if (d >= g.head_dim) break;
    store(key_grad, out + d, key_sum[k]);
    store(value_grad, out + d, value_sum[k]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_query_grad_kernel(
    const T* query, const T* key, const T* value, const T* context_grad, const float* logsumexp,
    const float* context_dots, const std::int32_t* attention_start, T* query_grad, Geometry g) {
  TANDEM_DYNAMIC_SHARED(float, shared);
  float* q_tile = shared;                         // [kTile, stride]
  float* dctx_tile = q_tile + kTile * g.stride;   // [kTile, stride]
  float* k_tile = dctx_tile + kTile * g.stride;   // [kTile, stride]
  float* v_tile = k_tile + kTile * g.stride;      // [kTile, stride]
  float* ds_tile = v_tile + kTile * g.stride;     // [kTile, kScoreStride]
  __shared__ int starts[kTile];
  __shared__ int earliest;
  __shared__ float lse_tile[kTile];
  __shared__ float dot_tile[kTile];
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int head = blockIdx.y;
  const int sample = blockIdx.z;
  const int group = head / g.heads_per_group;
  const int r = threadIdx.x / kLanesPerRow;
  const int lane = threadIdx.x % kLanesPerRow;
  const std::int64_t t = q0 + r;

  load_tile(q_tile, query, g, sample, q0, head, g.heads);
  load_tile(dctx_tile, context_grad, g, sample, q0, head, g.heads);
  load_row_stats<kTile>(lse_tile, logsumexp, g, sample, q0, head);
  load_row_stats<kTile>(dot_tile, context_dots, g, sample, q0, head);
  load_starts<kTile>(starts, &earliest, attention_start, g, sample, q0);
  const std::int64_t my_start = starts[r];
  float query_sum[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) query_sum[k] = 0.0f;
  const std::int64_t last_key = min(q0 + kTile - 1, g.seq - 1);
  for (std::int64_t k0 = (earliest / kTile) * static_cast<std::int64_t>(kTile); k0 <= last_key; k0 += kTile) {
    load_tile(k_tile, key, g, sample, k0, group, g.groups);
    load_tile(v_tile, value, g, sample, k0, group, g.groups);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const int c = lane + kLanesPerRow * j;
      const std::int64_t s = k0 + c;
      float score_grad = 0.0f;
      if (t < g.seq && s >= my_start && s <= t) {
        const float z = mul(dot_rows(q_tile + r * g.stride, k_tile + c * g.stride, g.head_dim), g.scale);
        const float probability = expf(z - lse_tile[r]);
        const float probability_grad = dot_rows(dctx_tile + r * g.stride, v_tile + c * g.stride, g.head_dim);
        score_grad = mul(mul(probability, probability_grad - dot_tile[r]), g.scale);
      }
      ds_tile[r * kScoreStride + c] = score_grad;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
      const int d = lane + kLanesPerRow * k;
      if (d >= g.head_dim) break;
      float dq = query_sum[k];
      for (int c = 0; c < kTile; ++c) dq = fmaf(ds_tile[r * kScoreStride + c], k_tile[c * g.stride + d], dq);
      query_sum[k] = dq;
    }
    __syncthreads();
  }
  if (t >= g.seq) return;
  const std::int64_t out = offset_of(g, sample, t, head, g.heads);
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = lane + kLanesPerRow * k;
    if (d >= g.head_dim) break;
    store(query_grad, out + d, query_sum[k]);
  }
}

// Checks the shape (naming the field and the rule) and builds the kernels' geometry.
Geometry geometry_of(const AttentionShape& shape, float scale, const char* op) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string(op) + ": " + what);
  };
  if (shape.head_dim <= 0 || shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim) {
    fail("head_dim " + std::to_string(shape.head_dim) + " must be even and in [2, " +
         std::to_string(kMaxHeadDim) + "] (the CUDA kernel's register tile)");
  }
  if (shape.groups <= 0 || shape.heads <= 0 || shape.heads % shape.groups != 0) {
    fail("heads " + std::to_string(shape.heads) + " must be a positive multiple of groups " +
         std::to_string(shape.groups));
  }
  if (shape.heads > 65535 || shape.samples > 65535) {
    fail("heads and samples must be <= 65535 (grid y and z)");
  }
  Geometry g;
  g.seq = shape.seq;
  g.heads = static_cast<int>(shape.heads);
  g.groups = static_cast<int>(shape.groups);
  g.heads_per_group = static_cast<int>(shape.heads / shape.groups);
  g.head_dim = static_cast<int>(shape.head_dim);
  g.stride = g.head_dim + 1;
  g.scale = scale;
  return g;
}

// Raises a kernel's dynamic shared-memory limit to what this launch needs (over 48 KiB at hd 128).
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::int64_t bytes) {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
}

}  // namespace

void attention_forward_cuda(const AttentionForwardParams& p, const CudaLaunch& launch) {
  if (p.dtype == DType::bf16) {
    attention_forward_tensor_core(p, launch);
    return;
  }
  const Geometry g = geometry_of(p.shape, p.scale, "attention_forward_cuda");
  if (p.shape.samples <= 0 || p.shape.seq <= 0) return;
  const dim3 grid(blocks_for(p.shape.seq, kTile), static_cast<unsigned int>(g.heads),
                  static_cast<unsigned int>(p.shape.samples));
  const std::int64_t shared_bytes =
      static_cast<std::int64_t>(sizeof(float)) * (3 * kTile * g.stride + kTile * kScoreStride);
  {
    using T = float;  // bf16 returned above
    allow_shared_memory(attention_forward_kernel<T>, shared_bytes);
    TANDEM_LAUNCH(grid, kThreads, shared_bytes, stream_of(launch), attention_forward_kernel<T>)(
        static_cast<const T*>(p.query), static_cast<const T*>(p.key), static_cast<const T*>(p.value),
        p.attention_start, static_cast<T*>(p.context), p.logsumexp, g);
  }
  TANDEM_CUDA_CHECK_LAUNCH(attention_forward_kernel);
}

void attention_backward_cuda(const AttentionBackwardParams& p, const CudaLaunch& launch) {
  if (p.dtype == DType::bf16) {
    attention_backward_tensor_core(p, launch);
    return;
  }
  const Geometry g = geometry_of(p.shape, p.scale, "attention_backward_cuda");
  if (p.shape.samples <= 0 || p.shape.seq <= 0) return;
  const std::int64_t rows = p.shape.samples * p.shape.seq;
  auto* context_dots = static_cast<float*>(workspace_of(
      launch, rows * g.heads * static_cast<std::int64_t>(sizeof(float)), "attention_backward_cuda"));
  const std::int64_t tile_bytes = static_cast<std::int64_t>(sizeof(float)) * kTile * g.stride;
  const std::int64_t score_bytes = static_cast<std::int64_t>(sizeof(float)) * kTile * kScoreStride;
  const std::int64_t key_value_bytes = 4 * tile_bytes + 2 * score_bytes;
  const std::int64_t query_bytes = 4 * tile_bytes + score_bytes;
  const unsigned int tiles = blocks_for(p.shape.seq, kTile);
  const unsigned int samples = static_cast<unsigned int>(p.shape.samples);
  {
    using T = float;  // bf16 returned above
    const auto* query = static_cast<const T*>(p.query);
    const auto* key = static_cast<const T*>(p.key);
    const auto* value = static_cast<const T*>(p.value);
    const auto* context_grad = static_cast<const T*>(p.context_grad);
    TANDEM_LAUNCH(blocks_for(rows * g.heads, 256), 256, 0, stream_of(launch), context_dot_kernel<T>)(
        static_cast<const T*>(p.context), context_grad, context_dots, rows, g.heads, g.head_dim);
    TANDEM_CUDA_CHECK_LAUNCH(context_dot_kernel);
    allow_shared_memory(attention_key_value_grad_kernel<T>, key_value_bytes);
    TANDEM_LAUNCH(dim3(tiles, static_cast<unsigned int>(g.groups), samples), kThreads, key_value_bytes,
                  stream_of(launch), attention_key_value_grad_kernel<T>)(
        query, key, value, context_grad, p.logsumexp, context_dots, p.attention_start,
        static_cast<T*>(p.key_grad), static_cast<T*>(p.value_grad), g);
    TANDEM_CUDA_CHECK_LAUNCH(attention_key_value_grad_kernel);
    allow_shared_memory(attention_query_grad_kernel<T>, query_bytes);
    TANDEM_LAUNCH(dim3(tiles, static_cast<unsigned int>(g.heads), samples), kThreads, query_bytes,
                  stream_of(launch), attention_query_grad_kernel<T>)(
        query, key, value, context_grad, p.logsumexp, context_dots, p.attention_start,
        static_cast<T*>(p.query_grad), g);
    TANDEM_CUDA_CHECK_LAUNCH(attention_query_grad_kernel);
  }
}

}  // namespace tandem::production
