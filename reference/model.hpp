// The reference twin's Llama-style decoder (SPEC 4) with its cross-entropy loss (SPEC 5):
// forward and backward written out by hand from reference/model_ops.hpp, templated on the scalar.
//
// Boring on purpose: it accumulates in the widest type it is given — every activation, every
// sum and every gradient is a `Real` (double for training, boost::multiprecision::cpp_bin_float_50
// for the finite-difference proofs; both instantiated in reference/model.cpp) — and it is written
// to be read line by line against SPEC 4, not to be fast. One sample at a time; the parameters
// and gradients are flat buffers in the order of core/model_layout.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/model_layout.hpp"

namespace tandem::reference {

template <class Real>
struct LossAndCounts {
  Real masked_loss_sum = 0;      // sum over samples and positions of loss_mask * CE (unscaled)
  std::int64_t loss_tokens = 0;  // positions with loss_mask 1 (SPEC 1)
};

// Adds d(loss_scale * masked CE sum over `samples`)/d(params) into `grads` and returns the
// unscaled masked CE sum with its loss-token count. `params` and `grads` are flat buffers
// [layout.total_elements] in layout order; `grads` is accumulated into, never cleared, so
// microbatches sum. The trainer chooses loss_scale: 1 / (loss tokens of the global batch) for
// per-token normalization, 1 / (microbatch loss tokens * microbatches * DP) for microbatch-mean
// (SPEC 5). A tied output projection's gradient is the sum of both uses (SPEC 4).
// Throws std::invalid_argument for a malformed sample (ragged vectors, a token or label outside
// the padded vocabulary, an attention span not inside [0, t]) or buffers of the wrong size.
template <class Real>
LossAndCounts<Real> forward_backward(const ModelConfig& config, const ModelLayout& layout,
                                     const std::vector<Real>& params,
                                     const std::vector<Sample>& samples, const Real& loss_scale,
                                     std::vector<Real>& grads);

// Forward only: the same masked CE sum and count as forward_backward, no gradients.
template <class Real>
LossAndCounts<Real> forward_loss(const ModelConfig& config, const ModelLayout& layout,
                                 const std::vector<Real>& params,
                                 const std::vector<Sample>& samples);

// Forward only: the logits of every position of one sample, [seq, padded_vocab_size] row-major
// (for tests and for checking exported models against the reference).
template <class Real>
std::vector<Real> forward_logits(const ModelConfig& config, const ModelLayout& layout,
                                 const std::vector<Real>& params, const Sample& sample);

// How many `Real`s one sample's forward and backward hold beside the parameters and gradients
// (every activation and the backward's scratch, at `sequence_length` positions): for estimating
// the memory of a wide or probed `Real` before it is spent (tandem check's statistical bounds).
std::int64_t workspace_values(const ModelConfig& config, std::int64_t sequence_length);

}  // namespace tandem::reference
