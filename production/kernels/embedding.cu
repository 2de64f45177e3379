// CUDA twin of the token embedding (embedding.hpp). Forward: one thread per element, an exact copy.
// Backward, deterministic and with the host's exact sums: the positions are ordered by
// (token, position) (a stable rank sort, no atomics), then one block per run of equal tokens adds
// the run's gradient rows into the token's row in increasing position, the host's order, so the
// twins agree bit for bit.
#include "production/cuda/kernel_support.cuh"
#include "production/kernels/embedding.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 256;

template <class T>
__global__ void embedding_forward_kernel(const std::int32_t* tokens, const T* table, T* output,
                                         std::int64_t rows, std::int64_t width, std::int64_t vocab_begin,
                                         std::int64_t vocab_rows) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const std::int64_t t = i / width;
  const std::int64_t row = static_cast<std::int64_t>(tokens[t]) - vocab_begin;
  if (vocab_rows >= 0 && (row < 0 || row >= vocab_rows)) {  // another rank's row: zeros
    store(output, i, 0.0f);
    return;
  }
  output[i] = table[row * width + i % width];
}

// sorted[rank(t)] = t with rank(t) = #{u : (tokens[u], u) < (tokens[t], t)}: a stable counting of
// smaller keys, O(rows^2) comparisons read from shared-memory tiles of the tokens.
__global__ void embedding_rank_kernel(const std::int32_t* tokens, std::int32_t* sorted, std::int64_t rows) {
  __shared__ std::int32_t tile[kThreads];
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int32_t token = t < rows ? tokens[t] : 0;
  std::int64_t rank = 0;
  for (std::int64_t tile_begin = 0; tile_begin < rows; tile_begin += kThreads) {
    const std::int64_t u = tile_begin + threadIdx.x;
    tile[threadIdx.x] = u < rows ? tokens[u] : 0;
    __syncthreads();
    const std::int64_t tile_count = rows - tile_begin < kThreads ? rows - tile_begin : kThreads;
    for (std::int64_t k = 0; k < tile_count; ++k) {
      const std::int32_t other = tile[k];
      rank += (other < token || (other == token && tile_begin + k < t)) ? 1 : 0;
    }
    __syncthreads();
  }
  if (t < rows) sorted[rank] = static_cast<std::int32_t>(t);
}

// Block i owns sorted position i if it starts a run of equal tokens; it adds the run's gradient
// rows, positions increasing, into the token's row (threads stride over the width).
template <class T>
__global__ void embedding_backward_kernel(const std::int32_t* tokens, const std::int32_t* sorted,
                                          const T* output_grad, float* table_grad, std::int64_t rows,
                                          std::int64_t width, std::int64_t vocab_begin, std::int64_t vocab) {
  const std::int64_t first = blockIdx.x;
  const std::int32_t token = tokens[sorted[first]];
  if (first > 0 && tokens[sorted[first - 1]] == token) return;
  const std::int64_t local = static_cast<std::int64_t>(token) - vocab_begin;
  if (local < 0 || local >= vocab) return;  // another rank's row
  std::int64_t end = first + 1;
  while (end < rows && tokens[sorted[end]] == token) ++end;
  float* row = table_grad + local * width;  // [width]
  for (std::int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    float sum = row[j];
    for (std::int64_t k = first; k < end; ++k) {
      sum = add(sum, load(output_grad, static_cast<std::int64_t>(sorted[k]) * width + j));
    }
    row[j] = sum;
  }
}

}  // namespace

void embedding_forward_cuda(const EmbeddingForwardParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0 || p.width <= 0) return;
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows * p.width, kThreads), kThreads, 0, stream_of(launch), embedding_forward_kernel<T>)(
        p.tokens, static_cast<const T*>(p.table), static_cast<T*>(p.output), p.rows, p.width, p.vocab_begin,
        p.vocab_rows);
  });
  TANDEM_CUDA_CHECK_LAUNCH(embedding_forward_kernel);
}

void embedding_backward_cuda(const EmbeddingBackwardParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0 || p.width <= 0) return;
  if (p.rows > 0x7FFFFFFF) throw std::invalid_argument("embedding_backward_cuda: rows over 2^31-1");
  auto* sorted = static_cast<std::int32_t*>(
      workspace_of(launch, p.rows * static_cast<std::int64_t>(sizeof(std::int32_t)), "embedding_backward_cuda"));
  TANDEM_LAUNCH(blocks_for(p.rows, kThreads), kThreads, 0, stream_of(launch), embedding_rank_kernel)(p.tokens, sorted, p.rows);
  TANDEM_CUDA_CHECK_LAUNCH(embedding_rank_kernel);
  with_storage_type(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows, 1), kThreads, 0, stream_of(launch), embedding_backward_kernel<T>)(
        p.tokens, sorted, static_cast<const T*>(p.output_grad), p.table_grad, p.rows, p.width, p.vocab_begin,
        p.vocab);
  });
  TANDEM_CUDA_CHECK_LAUNCH(embedding_backward_kernel);
}

}  // namespace tandem::production
