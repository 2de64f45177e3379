// The production decoder's output projection and loss (model.hpp): the logits chunk by chunk,
// SPEC 5's cross-entropy (vocabulary-parallel under tensor parallelism), and the output layer's
// backward, or the loss alone for evaluation; against reference/model.cpp's forward_sample /
// backward_sample.
#include "production/model.hpp"

#include <algorithm>
#include <cstdint>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

const void* DecoderModel::output_projection_input() { return whole_rows(final_normed_.data()); }

void DecoderModel::chunk_cross_entropy(std::int64_t first, std::int64_t chunk, Real loss_scale, void* logits_grad,
                                       Real* row_losses) {
  if (!tensor_parallel()) {
    CrossEntropyParams loss;
    loss.logits = logits_.data();
    loss.labels = current().labels.at(first);
    loss.loss_mask = current().loss_mask.at(first);
    loss.row_losses = row_losses + first;
    loss.logits_grad = logits_grad;
    loss.rows = chunk;
    loss.vocab = vocab_;
    loss.loss_scale = loss_scale;
    loss.grad_dtype = compute_;
    backend_.cross_entropy(loss);
    return;
  }
  // Megatron's vocabulary-parallel cross-entropy: the maxima, then the normalizers and the label
  // logits, all-gathered over TP; the full logits never exist (cross_entropy.hpp).
  VocabParallelCrossEntropyParams loss;
  loss.logits = logits_.data();
  loss.labels = current().labels.at(first);
  loss.loss_mask = current().loss_mask.at(first);
  loss.rows = chunk;
  loss.vocab = vocab_;
  loss.vocab_begin = vocab_begin_;
  loss.ranks = tp_->size();
  loss.maxima = ce_maxima_.data();
  loss.normalizers = ce_normalizers_.data();
  loss.targets = ce_targets_.data();
  const std::int64_t bytes = chunk * static_cast<std::int64_t>(sizeof(Real));
  loss.phase = VocabParallelPhase::local_max;
  loss.row_stats = ce_row_stats_.data();
  backend_.vocab_parallel_cross_entropy(loss);
  tp_->all_gather(ce_row_stats_.data(), ce_maxima_.data(), bytes);
  loss.phase = VocabParallelPhase::local_sums;
  loss.row_targets = ce_row_targets_.data();
  backend_.vocab_parallel_cross_entropy(loss);
  tp_->all_gather(ce_row_stats_.data(), ce_normalizers_.data(), bytes);
  tp_->all_gather(ce_row_targets_.data(), ce_targets_.data(), bytes);
  if (step_hooks_ != nullptr && !step_hooks_->normalizes_over_whole_vocabulary()) {  // StepHooks point
    // Negative control: the normalizer of this rank's part alone (the others' parts as 0).
    backend_.fill_zero(ce_normalizers_.data(), loss.ranks * bytes);
    backend_.copy(ce_normalizers_.data(), ce_row_stats_.data(), bytes);
  }
  loss.phase = VocabParallelPhase::finish;
  loss.row_losses = row_losses + first;
  loss.logits_grad = logits_grad;
  loss.loss_scale = loss_scale;
  loss.grad_dtype = compute_;
  backend_.vocab_parallel_cross_entropy(loss);
}

void DecoderModel::loss_and_output_backward(const void* weights, Real loss_scale,
                                            Real* main_grads, Real* row_losses) {
  const std::int64_t d = config_.hidden_size;
  const std::int64_t vocab = vocab_;
  const void* output_weight = weight_at(weights, layout_.output);  // [V, d]
  const void* input = output_projection_input();                   // [rows, d]
  // main_grads == nullptr: loss only (chunk_loss); the kernel stores no gradient.
  const bool loss_only = main_grads == nullptr;
  void* logits_grad = loss_only                ? nullptr
                      : compute_ == DType::f32 ? static_cast<void*>(logits_.data())
                                               : logits_grad_.data();
  // The output projection's input gradient: into normed_grad_ directly, or with TP into the fp32
  // partial of its sum over the vocabulary parts.
  const bool tp = tensor_parallel();
  for (std::int64_t first = 0; first < rows_; first += chunk_rows_) {
    const std::int64_t chunk = std::min(chunk_rows_, rows_ - first);
    const void* chunk_input = static_cast<const std::uint8_t*>(input) + first * d * dtype_bytes(compute_);
    GemmParams logits;  // [chunk, V] fp32 = [chunk, d] x [V, d]^T
    logits.m = chunk;
    logits.n = vocab;
    logits.k = d;
    logits.a = GemmOperand{chunk_input, compute_, Transpose::no};
    logits.b = GemmOperand{output_weight, compute_, Transpose::yes};
    logits.c = logits_.data();
    logits.c_dtype = DType::f32;  // SPEC 5: logits in fp32 at least
    backend_.gemm(logits);

    chunk_cross_entropy(first, chunk, loss_scale, logits_grad, row_losses);
    if (loss_only) continue;

    GemmParams data_grad;  // [chunk, d] = [chunk, V] x [V, d]
    data_grad.m = chunk;
    data_grad.n = d;
    data_grad.k = vocab;
    data_grad.a = GemmOperand{logits_grad, compute_, Transpose::no};
    data_grad.b = GemmOperand{output_weight, compute_, Transpose::no};
    data_grad.c = tp ? static_cast<void*>(partial_.at(first * d)) : normed_grad_.at(first * d);
    data_grad.c_dtype = tp ? DType::f32 : compute_;
    backend_.gemm(data_grad);

    GemmParams weight_grad;  // [V, d] += [chunk, V]^T x [chunk, d]
    weight_grad.m = vocab;
    weight_grad.n = d;
    weight_grad.k = chunk;
    weight_grad.a = GemmOperand{logits_grad, compute_, Transpose::yes};
    weight_grad.b = GemmOperand{chunk_input, compute_, Transpose::no};
    weight_grad.c = main_grads + layout_.tensor(layout_.output).offset;
    weight_grad.c_dtype = DType::f32;
    weight_grad.beta = 1.0f;
    backend_.gemm(weight_grad);
  }
  if (tp && !loss_only) reduce_partial_into(normed_grad_.data());
}

void DecoderModel::chunk_loss(const void* weights, std::int64_t slot, Real* row_losses) {
  use_slot(slot);
  loss_and_output_backward(weights, 0.0f, nullptr, row_losses);
}

}  // namespace tandem::production
