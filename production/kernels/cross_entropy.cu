// CUDA twin of the masked cross-entropy (cross_entropy.hpp): one block per row of the chunk. The
// max (order-free) and the sum of exp(z - max) (threads' strided partials, then a fixed tree) are
// computed before any gradient is stored, and the label's logit is read first, so logits_grad may
// alias logits (f32). expf/logf are CUDA's (within 2 ulp) and the sum's order is not the host's,
// so the twins agree within a bound, not bit for bit; masked rows are exactly 0 in both.
#include "production/cuda/kernel_support.cuh"
#include "production/kernels/cross_entropy.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

using namespace cuda_detail;
constexpr int kThreads = 512;

template <class Grad>
__global__ void cross_entropy_kernel(const float* logits, const std::int32_t* labels,
                                     const std::uint8_t* loss_mask, float* row_losses, Grad* logits_grad,
                                     std::int64_t vocab, float loss_scale) {
  __shared__ float scratch[kThreads];
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;  // [vocab]
  const std::int64_t base = row * vocab;
  if (loss_mask[row] == 0) {  // SPEC 5: times the loss mask; exactly nothing
    if (threadIdx.x == 0) row_losses[row] = 0.0f;
    if (logits_grad == nullptr) return;  // loss only (uniform over the block)
    for (std::int64_t c = threadIdx.x; c < vocab; c += kThreads) store(logits_grad, base + c, 0.0f);
    return;
  }
  const std::int32_t label = labels[row];
  const float label_logit = z[label];
  float partial_max = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < vocab; c += kThreads) partial_max = fmaxf(partial_max, z[c]);
  const float max_logit = block_max(partial_max, scratch);
  float partial_sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < vocab; c += kThreads) partial_sum += expf(z[c] - max_logit);
  const float normalizer = block_sum(partial_sum, scratch);  // ends with a barrier: all reads done
  const float log_normalizer = max_logit + logf(normalizer);
  if (threadIdx.x == 0) row_losses[row] = log_normalizer - label_logit;
  if (logits_grad == nullptr) return;  // loss only (uniform over the block)
  for (std::int64_t c = threadIdx.x; c < vocab; c += kThreads) {
    const float probability = expf(z[c] - log_normalizer);
    const float target = c == label ? 1.0f : 0.0f;
    store(logits_grad, base + c, loss_scale * (probability - target));
  }
}

// The vocabulary-parallel phases (cross_entropy.hpp), one block per row, the same reductions as
// cross_entropy_kernel; the ranks' values combine in rank order on one thread.
template <class Grad>
__global__ void vocab_parallel_kernel(VocabParallelCrossEntropyParams p, Grad* logits_grad) {
  __shared__ float scratch[kThreads];
  const std::int64_t row = blockIdx.x;
  const float* z = p.logits + row * p.vocab;
  const std::int64_t base = row * p.vocab;
  if (p.phase == VocabParallelPhase::local_max) {
    float partial_max = -INFINITY;
    for (std::int64_t c = threadIdx.x; c < p.vocab; c += kThreads) partial_max = fmaxf(partial_max, z[c]);
    const float max_logit = block_max(partial_max, scratch);
    if (threadIdx.x == 0) p.row_stats[row] = max_logit;
    return;
  }
  float max_logit = p.maxima[row];
  for (std::int64_t r = 1; r < p.ranks; ++r) max_logit = fmaxf(max_logit, p.maxima[r * p.rows + row]);
  const std::int64_t label = static_cast<std::int64_t>(p.labels[row]) - p.vocab_begin;
  const bool holds_label = label >= 0 && label < p.vocab;
  if (p.phase == VocabParallelPhase::local_sums) {
    float partial_sum = 0.0f;
    for (std::int64_t c = threadIdx.x; c < p.vocab; c += kThreads) partial_sum += expf(z[c] - max_logit);
    const float normalizer = block_sum(partial_sum, scratch);
    if (threadIdx.x == 0) {
      p.row_stats[row] = normalizer;
      p.row_targets[row] = holds_label ? z[label] : 0.0f;
    }
    return;
  }
  if (p.loss_mask[row] == 0) {
    if (threadIdx.x == 0) p.row_losses[row] = 0.0f;
    if (logits_grad == nullptr) return;
    for (std::int64_t c = threadIdx.x; c < p.vocab; c += kThreads) store(logits_grad, base + c, 0.0f);
    return;
  }
  float normalizer = p.normalizers[row];
  for (std::int64_t r = 1; r < p.ranks; ++r) normalizer = add(normalizer, p.normalizers[r * p.rows + row]);
  const float log_normalizer = max_logit + logf(normalizer);
  const std::int64_t owner = static_cast<std::int64_t>(p.labels[row]) / p.vocab;
  if (threadIdx.x == 0) p.row_losses[row] = log_normalizer - p.targets[owner * p.rows + row];
  if (logits_grad == nullptr) return;
  for (std::int64_t c = threadIdx.x; c < p.vocab; c += kThreads) {
    const float probability = expf(z[c] - log_normalizer);
    const float target = c == label ? 1.0f : 0.0f;
    store(logits_grad, base + c, p.loss_scale * (probability - target));
  }
}

}  // namespace

void vocab_parallel_cross_entropy_cuda(const VocabParallelCrossEntropyParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0) return;
  if (p.vocab <= 0) throw std::invalid_argument("vocab_parallel_cross_entropy_cuda: vocab must be > 0");
  with_storage_type(p.grad_dtype, [&](auto tag) {
    using Grad = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows, 1), kThreads, 0, stream_of(launch), vocab_parallel_kernel<Grad>)(
        p, static_cast<Grad*>(p.logits_grad));
  });
  TANDEM_CUDA_CHECK_LAUNCH(vocab_parallel_kernel);
}

void cross_entropy_cuda(const CrossEntropyParams& p, const CudaLaunch& launch) {
  if (p.rows <= 0) return;
  if (p.vocab <= 0) throw std::invalid_argument("cross_entropy_cuda: vocab must be > 0");
  with_storage_type(p.grad_dtype, [&](auto tag) {
    using Grad = decltype(tag);
    TANDEM_LAUNCH(blocks_for(p.rows, 1), kThreads, 0, stream_of(launch), cross_entropy_kernel<Grad>)(
        p.logits, p.labels, p.loss_mask, p.row_losses, static_cast<Grad*>(p.logits_grad), p.vocab,
        p.loss_scale);
  });
  TANDEM_CUDA_CHECK_LAUNCH(cross_entropy_kernel);
}

}  // namespace tandem::production
