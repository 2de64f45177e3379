// Document-masked causal attention with GQA (SPEC 3, 4), flash-style: the forward keeps only the
// context and each row's log-sum-exp; the backward recomputes the probabilities from them.
// Row t of a sample attends to rows s in [attention_start[t], t] of the same sample; query head j
// reads key/value group j / (H/G). Scores z = (q . k) * scale in fp32, softmax over the span in
// fp32 (its normalizer and log-sum-exp from unrounded fp32 probabilities).
// Roundings inside the op, the same in both twins:
//   fp32: none; probabilities and score gradients stay fp32.
//   bf16: the operands of the second products are rounded to bf16, as tensor cores take them
//     (FlashAttention-2): in the forward, p~_ts = exp(z_ts - m) with m the running max of row t
//     over the key tiles of kAttentionKeyTile positions (aligned at multiples of it in the
//     sample) up to the one holding s, rounded before context += p~ v (then rescaled by
//     exp(m - final max) and divided by the normalizer); in the backward, p_ts before
//     dv += p dctx and dz_ts = p (dp - D) before dq += dz k and dk += dz q, with scale applied once
//     to the finished dq and dk sums.
// Host twin in attention_host.cpp, CUDA twins in attention.cu (fp32) and attention_tensor_core.cu
// (bf16).
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// Keys a tile of the bf16 forward's online softmax: its running max, which the bf16 probabilities
// are rounded relative to, advances a tile at a time (attention_tensor_core.cu's kKeys).
inline constexpr int kAttentionKeyTile = 64;

struct AttentionShape {
  std::int64_t samples = 0;   // mbs: independent sequences (rows = samples * seq)
  std::int64_t seq = 0;       // positions per sample
  std::int64_t heads = 0;     // H
  std::int64_t groups = 0;    // G, divides H
  std::int64_t head_dim = 0;  // hd
};

struct AttentionForwardParams {
  const void* query = nullptr;               // [samples*seq, H*hd] compute dtype, after RoPE
  const void* key = nullptr;                 // [samples*seq, G*hd] compute dtype, after RoPE
  const void* value = nullptr;               // [samples*seq, G*hd] compute dtype
  const std::int32_t* attention_start = nullptr;  // [samples*seq], within the sample, <= t
  void* context = nullptr;                   // [samples*seq, H*hd] compute dtype
  Real* logsumexp = nullptr;                // [samples*seq, H] fp32: log sum_s exp(z_ts)
  AttentionShape shape;
  Real scale = 1.0f;                        // 1/sqrt(hd), computed in double, rounded once
  DType dtype = DType::f32;
};

// With p_ts = exp(z_ts - logsumexp_t), dp_ts = dctx_t . v_s and D_t = dctx_t . ctx_t (the stored
// context; equals sum_s p_ts dp_ts): dz_ts = p_ts (dp_ts - D_t),
// dq_t = scale sum_s dz_ts k_s, dk_s = scale sum_{t, heads of its group} dz_ts q_t,
// dv_s = sum_{t, heads of its group} p_ts dctx_t (bf16: p and dz rounded, see above). Sums in
// fp32 in a fixed order (no atomics); query_grad, key_grad, value_grad are overwritten.
struct AttentionBackwardParams {
  const void* query = nullptr;               // [samples*seq, H*hd] as the forward read it
  const void* key = nullptr;                 // [samples*seq, G*hd]
  const void* value = nullptr;               // [samples*seq, G*hd]
  const void* context = nullptr;             // [samples*seq, H*hd] the forward's output
  const Real* logsumexp = nullptr;          // [samples*seq, H] from the forward
  const void* context_grad = nullptr;        // [samples*seq, H*hd]
  const std::int32_t* attention_start = nullptr;  // [samples*seq]
  void* query_grad = nullptr;                // [samples*seq, H*hd] compute dtype, =
  void* key_grad = nullptr;                  // [samples*seq, G*hd] compute dtype, =
  void* value_grad = nullptr;                // [samples*seq, G*hd] compute dtype, =
  AttentionShape shape;
  Real scale = 1.0f;
  DType dtype = DType::f32;
};

class HostWorkers;  // host_workers.hpp: the cpu backend's threads, which split the (sample, group) pairs

void attention_forward_host(const AttentionForwardParams& params, HostWorkers* workers = nullptr);
void attention_backward_host(const AttentionBackwardParams& params, HostWorkers* workers = nullptr);
// The same arithmetic one value at a time: the plain statement of every sum's order, which the
// shipped host kernels above equal bit for bit (tests/production_ops_test.cpp).
void attention_forward_host_ordered(const AttentionForwardParams& params);
void attention_backward_host_ordered(const AttentionBackwardParams& params);
void attention_forward_cuda(const AttentionForwardParams& params, const CudaLaunch& launch);
void attention_backward_cuda(const AttentionBackwardParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
