// The production trainer on the cpu backend against the double reference trainer (SPEC 1-8):
// the tiny model (2 layers, d 32, 4 heads in 2 groups, seq 32) trains several updates.
//
// Kinds of comparison:
//   - exact: counters, lr, wd, step, clipped and update_successful flags, iteration 0's weights;
//   - deterministic (bitwise): two runs; k updates + checkpoint + resume + N-k updates vs N;
//   - approximate: loss, gradient norm, main weights and moments, each within a bound derived
//     below (ErrorModel) from the unit roundoff (fp32 2^-24; bf16 2^-8 per stored rounding) and
//     the reduction lengths of the forward/backward path, printed with the % of bound used.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/checkpoint/checkpoint.hpp"
#include "core/train/audit_selection.hpp"
#include "production/checkpointing.hpp"
#include "production/trainer.hpp"
#include "reference/trainer.hpp"
#include "tests/support/tiny_production_run.hpp"

namespace tandem {
namespace {

constexpr std::int64_t kUpdates = 8;  // iterations each comparison trains

RunConfig tiny_run(bool bf16) {
  RunConfig config;
  config.model = testing::tiny_production_model();
  config.batch.micro_batch_size = 2;
  config.batch.global_batch_size = 4;  // 2 microbatches: main gradients accumulate
  config.optimizer.adam_beta1 = 0.9;
  config.optimizer.adam_beta2 = 0.95;
  config.optimizer.clip_grad = 1.0;
  config.optimizer.bf16 = bf16;
  config.schedule.lr = 1e-3;
  config.schedule.lr_warmup_init = 1e-4;
  config.schedule.lr_warmup_samples = 8;
  config.schedule.train_samples = kUpdates * 4;
  config.schedule.lr_decay_samples = kUpdates * 4;
  config.schedule.lr_decay_style = LrDecayStyle::cosine;
  config.schedule.weight_decay = 0.1;
  config.schedule.start_weight_decay = 0.1;
  config.schedule.end_weight_decay = 0.1;
  config.schedule.wd_incr_samples = kUpdates * 4;
  return config;
}

production::ProductionOptions cpu_options() {
  production::ProductionOptions options;
  options.device = production::Device::cpu;
  return options;
}

// How far the production trainer may sit from the double reference, derived from the precision.
//
// A fp32 recursive sum or dot of n terms errs by at most ~n u times the sum of |terms|. Along the
// path from the weights to the loss every value passes through a chain of such reductions; to
// first order their relative errors add, so the loss and logits carry a relative error of at most
// u x K_forward with K_forward the summed reduction lengths of the forward path, and the gradient
// u x K_total with the backward path's lengths and the accumulation over all GBS x seq rows:
//   per layer: RMSNorm (d), q/k/v (d), scores (hd), softmax and PV (2 seq), o (H hd), RMSNorm (d),
//   gate/up (d), down (F); then the final norm (d), the logits (d) and the cross-entropy (V).
// With bf16 compute every stored activation and compute weight adds one rounding of 2^-8: R per
// pass (the stores of model.cpp's forward, and of its backward), which dominate.
// Assumptions, stated: the bounds are first order and normwise (an element's error is bounded by
// the vector's error norm, |dg_i| <= eps x ||g||), and the change a weight difference makes to
// the next gradient (second order: Hessian x dp, dp ~ 1e-6 here) is neglected.
struct ErrorModel {
  double forward_relative = 0;   // loss and logits
  double gradient_relative = 0;  // gradient vector, normwise, and the norm

  static ErrorModel of(const RunConfig& config) {
    const auto& m = config.model;
    const double u = std::ldexp(1.0, -24);
    const double per_layer = static_cast<double>(m.hidden_size * 4 + m.head_dim() + 2 * m.seq_length +
                                                 m.num_attention_heads * m.head_dim() + m.ffn_hidden_size);
    const double forward_length = static_cast<double>(m.num_layers) * per_layer +
                                  static_cast<double>(2 * m.hidden_size + m.padded_vocab_size);
    const double accumulation = static_cast<double>(config.batch.global_batch_size * m.seq_length);
    ErrorModel model;
    model.forward_relative = u * forward_length;
    model.gradient_relative = u * (2 * forward_length + accumulation);
    if (config.optimizer.bf16) {
      const double bf16_u = std::ldexp(1.0, -8);  // bf16's unit roundoff (8 significant bits)
      // Stores per layer (model.cpp): forward 11 (normed, q, k, v, rope q and k, context, o, add,
      // normed, gate, up, hidden, down, add, counted as 11 on any one path), backward 12; plus the
      // compute weights, the final norm and the logits gradient. Attention rounds once more
      // inside the op on any path through it (attention.hpp: the probabilities before p v; p before
      // dv or dz before dq, dk): one more a layer each way (docs/EQUIVALENCE.md).
      const double forward_roundings = 12.0 * static_cast<double>(m.num_layers) + 3;
      const double backward_roundings = 13.0 * static_cast<double>(m.num_layers) + 2;
      model.forward_relative += bf16_u * forward_roundings;
      model.gradient_relative += bf16_u * (forward_roundings + backward_roundings);
    }
    return model;
  }
};

// Per-element bounds on main weights, m and v, carried through SPEC 7's AdamW update by update.
struct StateBounds {
  std::vector<double> param, exp_avg, exp_avg_sq;

  explicit StateBounds(std::size_t n) : param(n, 0.0), exp_avg(n, 0.0), exp_avg_sq(n, 0.0) {}

  // After a successful update of the reference (its pre-clip gradient, clip factor, norm and its
  // state after the update): the gradient's error bound dg = eps ||g|| (plus the clip factor's
  // relative error eps), through m, v and the Adam term a = m_hat / (sqrt(v_hat) + eps_adam):
  //   dm' = b1 dm + (1-b1) dg_c + 5u |terms|      dv' = b2 dv + (1-b2)(2|g_c| dg_c + dg_c^2) + 6u |terms|
  //   da  = dm_hat / (s_lo + eps) + (|m_hat| + dm_hat) ds / ((s_lo + eps)(s + eps)),
  //         s = sqrt(v_hat), ds = min(sqrt(dv_hat), dv_hat / (2 s)), s_lo = max(s - ds, 0)
  //   dp' = dp + lr min(da, 2 A) + 8u (|p| + lr |a|)   (one fp32 update: 8 roundings at most)
  // where A bounds |a| for ANY gradient history (Cauchy-Schwarz on m's and v's sums):
  //   |m_hat| / sqrt(v_hat) <= (1-b1)/sqrt(1-b2) sqrt(sum_{j<t} (b1^2/b2)^j) sqrt(1-b2^t)/(1-b1^t),
  // so neither twin's step exceeds lr A and their difference never exceeds 2 lr A.
  void update(const RunConfig& config, const reference::Trainer<double>& ref, const IterationRecord& record,
              double gradient_relative, const std::vector<double>& old_m, const std::vector<double>& old_v) {
    const double u = std::ldexp(1.0, -24);
    const double b1 = config.optimizer.adam_beta1, b2 = config.optimizer.adam_beta2;
    const double eps = config.optimizer.adam_eps;
    double b1_power = 1, b2_power = 1;
    for (std::int64_t i = 0; i < record.step; ++i) {
      b1_power *= b1;
      b2_power *= b2;
    }
    const double bc1 = 1 - b1_power, bc2 = 1 - b2_power;
    double ratio_sum = 0, ratio_power = 1;  // sum_{j<t} (b1^2/b2)^j
    for (std::int64_t j = 0; j < record.step; ++j) {
      ratio_sum += ratio_power;
      ratio_power *= b1 * b1 / b2;
    }
    const double step_cap = (1 - b1) / std::sqrt(1 - b2) * std::sqrt(ratio_sum) * std::sqrt(bc2) / bc1;  // A
    const auto& g = ref.last_gradient();
    const auto& state = ref.state();
    const double c = record.clip_coeff;
    const double dg = gradient_relative * record.grad_norm;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double gc = g[i] * c;
      const double dgc = record.clipped ? c * (dg + std::abs(g[i]) * gradient_relative) : dg;
      exp_avg[i] = b1 * exp_avg[i] + (1 - b1) * dgc + 5 * u * (std::abs(b1 * old_m[i]) + std::abs((1 - b1) * gc));
      exp_avg_sq[i] = b2 * exp_avg_sq[i] + (1 - b2) * (2 * std::abs(gc) * dgc + dgc * dgc) +
                      6 * u * (std::abs(b2 * old_v[i]) + std::abs((1 - b2) * gc * gc));
      const double m_hat = std::abs(state.exp_avg[i]) / bc1, dm_hat = exp_avg[i] / bc1;
      const double s = std::sqrt(state.exp_avg_sq[i] / bc2), dv_hat = exp_avg_sq[i] / bc2;
      const double ds = s > 0 ? std::min(std::sqrt(dv_hat), dv_hat / (2 * s)) : std::sqrt(dv_hat);
      const double s_lo = std::max(s - ds, 0.0);
      const double da = dm_hat / (s_lo + eps) + (m_hat + dm_hat) * ds / ((s_lo + eps) * (s + eps));
      const double a = m_hat / (s + eps);
      param[i] += record.lr * std::min(da, 2 * step_cap) + 8 * u * (std::abs(state.params[i]) + record.lr * a);
    }
  }
};

struct Worst {
  double ratio = 0;
  std::string where;
  void see(const std::string& what, std::size_t i, double got, double want, double bound) {
    const double r = bound > 0 ? std::abs(got - want) / bound : (got == want ? 0 : 1e300);
    if (r > ratio) {
      ratio = r;
      char line[256];
      std::snprintf(line, sizeof line, "%s[%zu] got %.9g want %.12g bound %.3g", what.c_str(), i, got, want, bound);
      where = line;
    }
  }
};

// Trains the reference on `config` and production on `production_config` (the same unless a
// negative control changes it) side by side; asserts the exact quantities when `exact`, and
// returns how many approximate comparisons fell outside their bounds.
std::int64_t compare_with_reference(const RunConfig& config, const RunConfig& production_config, bool exact) {
  const bool bf16 = config.optimizer.bf16;
  const auto samples = testing::tiny_production_samples();
  reference::Trainer<double> ref(config, samples);
  production::Trainer prod(production_config, samples, cpu_options());
  prod.keep_last_gradient(true);
  const ErrorModel errors = ErrorModel::of(config);
  const std::string label = bf16 ? "bf16" : "fp32";
  std::printf("[%s] error model: forward %.3g relative, gradient %.3g relative (normwise)\n", label.c_str(),
              errors.forward_relative, errors.gradient_relative);

  // Iteration 0: exact (SPEC 4: bit-identical initialization everywhere).
  {
    const production::HostState state = prod.host_state();
    for (std::size_t i = 0; i < state.params.size(); ++i) {
      EXPECT_EQ(static_cast<double>(state.params[i]), ref.state().params[i]) << "initial weight " << i;
    }
  }
  std::int64_t outside = 0;
  StateBounds bounds(static_cast<std::size_t>(ref.layout().total_elements));
  Worst worst_loss, worst_norm, worst_param, worst_m, worst_v;
  for (std::int64_t k = 1; k <= kUpdates; ++k) {
    const std::vector<double> old_m = ref.state().exp_avg, old_v = ref.state().exp_avg_sq;
    const IterationRecord want = ref.run_iteration();
    const IterationRecord got = prod.run_iteration();
    if (exact) {
      EXPECT_EQ(got.totals, want.totals) << "counters after iteration " << k;
      EXPECT_EQ(got.lr, want.lr) << "iteration " << k;
      EXPECT_EQ(got.wd, want.wd) << "iteration " << k;
      EXPECT_EQ(got.step, want.step);
      EXPECT_EQ(got.clipped, want.clipped) << "iteration " << k << " norm " << got.grad_norm << " vs " << want.grad_norm;
      EXPECT_EQ(got.update_successful, want.update_successful);
      EXPECT_EQ(got.input_tokens, want.input_tokens);
      EXPECT_EQ(got.loss_tokens, want.loss_tokens);
    }
    // Approximate: NaN first, then the bound.
    EXPECT_TRUE(std::isfinite(got.loss) && std::isfinite(got.grad_norm));
    // The loss is a mean of lse - z_label: |dloss| <= 2 eps_fwd (|loss| + 1) (both terms carry
    // the logits' relative error; +1 covers |z| of order the loss).
    const double loss_bound = 2 * errors.forward_relative * (std::abs(want.loss) + 1);
    const double norm_bound = errors.gradient_relative * want.grad_norm;
    outside += std::abs(got.loss - want.loss) > loss_bound;
    outside += std::abs(got.grad_norm - want.grad_norm) > norm_bound;
    worst_loss.see("loss@" + std::to_string(k), 0, got.loss, want.loss, loss_bound);
    worst_norm.see("norm@" + std::to_string(k), 0, got.grad_norm, want.grad_norm, norm_bound);

    bounds.update(config, ref, want, errors.gradient_relative, old_m, old_v);
    const production::HostState state = prod.host_state();
    const auto& r = ref.state();
    std::int64_t failures = 0;
    for (std::size_t i = 0; i < state.params.size(); ++i) {
      const double p = state.params[i], m = state.exp_avg[i], v = state.exp_avg_sq[i];
      failures += std::abs(p - r.params[i]) > bounds.param[i];
      failures += std::abs(m - r.exp_avg[i]) > bounds.exp_avg[i];
      failures += std::abs(v - r.exp_avg_sq[i]) > bounds.exp_avg_sq[i];
      worst_param.see("param@" + std::to_string(k), i, p, r.params[i], bounds.param[i]);
      worst_m.see("m@" + std::to_string(k), i, m, r.exp_avg[i], bounds.exp_avg[i]);
      worst_v.see("v@" + std::to_string(k), i, v, r.exp_avg_sq[i], bounds.exp_avg_sq[i]);
    }
    outside += failures;
  }
  for (const Worst* w : {&worst_loss, &worst_norm, &worst_param, &worst_m, &worst_v}) {
    std::printf("[%s] worst %s (%.2f%% of bound)\n", label.c_str(), w->where.c_str(), 100 * w->ratio);
  }
  return outside;
}

TEST(ProductionTrainer, CpuBackendMatchesTheDoubleReferenceInFp32) {
  const RunConfig config = tiny_run(false);
  EXPECT_EQ(compare_with_reference(config, config, true), 0) << "comparisons outside their fp32 bounds";
}

TEST(ProductionTrainer, CpuBackendMatchesTheDoubleReferenceInBf16) {
  const RunConfig config = tiny_run(true);
  EXPECT_EQ(compare_with_reference(config, config, true), 0) << "comparisons outside their bf16 bounds";
}

TEST(ProductionTrainer, BiasesTiedEmbeddingsAndMicrobatchMeanMatchTheReference) {
  // The optional paths: --add-bias-linear (bias add and bias gradients), tied embeddings (one
  // tensor receives both uses' gradients, SPEC 4), and Megatron's microbatch-mean loss (SPEC 5).
  RunConfig config = tiny_run(false);
  config.model.add_bias_linear = true;
  config.model.tie_embeddings = true;
  config.data.loss_normalization = LossNormalization::microbatch_mean;
  EXPECT_EQ(compare_with_reference(config, config, true), 0) << "comparisons outside their fp32 bounds";
}

TEST(ProductionTrainer, Fp32BoundsRejectADoubledWeightDecay) {
  // Negative control: production decaying twice (weight decay 0.2 instead of 0.1) moves each
  // decayed weight by lr x 0.1 x |p|, up to ~6e-6 per update at the peak lr: a real bug the fp32
  // bounds must catch.
  const RunConfig config = tiny_run(false);
  RunConfig changed = config;
  changed.schedule.weight_decay = changed.schedule.start_weight_decay = changed.schedule.end_weight_decay = 0.2;
  EXPECT_GT(compare_with_reference(config, changed, false), 0);
}

TEST(ProductionTrainer, TwoRunsAreBitwiseEqual) {
  for (const bool bf16 : {false, true}) {
    const RunConfig config = tiny_run(bf16);
    production::Trainer first(config, testing::tiny_production_samples(), cpu_options());
    production::Trainer second(config, testing::tiny_production_samples(), cpu_options());
    for (std::int64_t k = 0; k < 3; ++k) {
      const IterationRecord a = first.run_iteration();
      const IterationRecord b = second.run_iteration();
      ASSERT_EQ(a.loss, b.loss);
      ASSERT_EQ(a.grad_norm, b.grad_norm);
    }
    const auto a = first.host_state(), b = second.host_state();
    EXPECT_EQ(a.params, b.params) << (bf16 ? "bf16" : "fp32");
    EXPECT_EQ(a.exp_avg, b.exp_avg);
    EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
    EXPECT_EQ(a.counters, b.counters);
  }
}

// Exact: the cpu backend's blocked kernels (gemm, attention) and the plain statements of their
// arithmetic give the same trainer, bit for bit: every record and the whole state, fp32 and bf16.
TEST(ProductionTrainer, TheFastHostKernelsTrainToTheOrderedOnesBits) {
  for (const bool bf16 : {false, true}) {
    const RunConfig config = tiny_run(bf16);
    production::ProductionOptions ordered_options = cpu_options();
    ordered_options.host_kernels = production::HostKernels::ordered;
    production::Trainer fast(config, testing::tiny_production_samples(), cpu_options());
    production::Trainer ordered(config, testing::tiny_production_samples(), ordered_options);
    EXPECT_NE(fast.backend().description(), ordered.backend().description());
    for (std::int64_t k = 0; k < 3; ++k) {
      const IterationRecord a = fast.run_iteration();
      const IterationRecord b = ordered.run_iteration();
      ASSERT_EQ(a.loss, b.loss) << "iteration " << k + 1;
      ASSERT_EQ(a.grad_norm, b.grad_norm) << "iteration " << k + 1;
    }
    const auto a = fast.host_state(), b = ordered.host_state();
    EXPECT_EQ(a.params, b.params) << (bf16 ? "bf16" : "fp32");
    EXPECT_EQ(a.exp_avg, b.exp_avg);
    EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
  }
}

TEST(ProductionTrainer, ResumeFromACheckpointIsBitExact) {
  // SPEC 9: N updates straight == k updates, checkpoint, resume in a fresh trainer, N-k updates.
  for (const bool bf16 : {false, true}) {
    const RunConfig config = tiny_run(bf16);
    const std::int64_t total = 5, first_leg = 2;
    production::Trainer straight(config, testing::tiny_production_samples(), cpu_options());
    for (std::int64_t k = 0; k < total; ++k) straight.run_iteration();

    const auto directory = std::filesystem::temp_directory_path() /
                           ("tandem-production-resume-" + std::string(bf16 ? "bf16" : "fp32"));
    std::filesystem::remove_all(directory);
    {
      production::Trainer leg(config, testing::tiny_production_samples(), cpu_options());
      for (std::int64_t k = 0; k < first_leg; ++k) leg.run_iteration();
      checkpoint::save_checkpoint(directory, production::make_checkpoint_state(leg));
    }
    production::Trainer resumed(config, testing::tiny_production_samples(), cpu_options());
    production::restore_checkpoint_state(resumed, checkpoint::load_checkpoint(directory));
    EXPECT_EQ(resumed.counters().iteration, first_leg);
    while (resumed.counters().iteration < total) resumed.run_iteration();
    const auto a = straight.host_state(), b = resumed.host_state();
    EXPECT_EQ(a.params, b.params) << (bf16 ? "bf16" : "fp32");
    EXPECT_EQ(a.exp_avg, b.exp_avg);
    EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
    EXPECT_EQ(a.counters, b.counters);
    std::filesystem::remove_all(directory);
  }
}

TEST(ProductionTrainer, NonFiniteGradientSkipsTheUpdateAsTheReferenceDoes) {
  // SPEC 8: the skipped iteration changes nothing but counters; the scheduler holds its lr.
  const RunConfig config = tiny_run(false);
  reference::TestSwitches ref_switches;
  ref_switches.nonfinite_gradient_iterations = {2};
  reference::Trainer<double> ref(config, testing::tiny_production_samples(), ref_switches);
  production::ProductionOptions options = cpu_options();
  production::FaultSchedule faults;
  faults.nonfinite_gradient_iterations = {2};
  options.hooks = production::make_test_hooks(faults);
  production::Trainer prod(config, testing::tiny_production_samples(), options);
  prod.run_iteration();
  ref.run_iteration();
  const auto before = prod.host_state();
  const IterationRecord got = prod.run_iteration();
  const IterationRecord want = ref.run_iteration();
  EXPECT_FALSE(got.update_successful);
  EXPECT_EQ(got.update_successful, want.update_successful);
  EXPECT_EQ(got.totals, want.totals);
  EXPECT_EQ(got.lr, want.lr);
  EXPECT_EQ(got.step, 1);
  EXPECT_EQ(got.clip_coeff, 1.0);
  const auto after = prod.host_state();
  EXPECT_EQ(before.params, after.params);
  EXPECT_EQ(before.exp_avg, after.exp_avg);
  EXPECT_EQ(before.exp_avg_sq, after.exp_avg_sq);
  const IterationRecord next = prod.run_iteration();
  EXPECT_TRUE(next.update_successful);
  EXPECT_EQ(next.lr, ref.run_iteration().lr);  // the held lr, as the reference
}

TEST(ProductionTrainer, ChunkedCrossEntropyChangesNoLoss) {
  // The logits of a row do not depend on the chunk it is computed in, so the loss is bitwise the
  // same; only the output projection's gradient accumulates over chunks in another order.
  const RunConfig config = tiny_run(false);
  production::ProductionOptions chunked = cpu_options();
  chunked.logits_chunk_rows = 7;  // 64 rows per microbatch: 10 chunks, the last one short
  production::Trainer whole(config, testing::tiny_production_samples(), cpu_options());
  production::Trainer pieces(config, testing::tiny_production_samples(), chunked);
  const IterationRecord a = whole.run_iteration();
  const IterationRecord b = pieces.run_iteration();
  EXPECT_EQ(a.loss, b.loss);
  const ErrorModel errors = ErrorModel::of(config);
  EXPECT_LE(std::abs(a.grad_norm - b.grad_norm), 2 * errors.gradient_relative * a.grad_norm);
}

TEST(ProductionTrainer, AuditsTheReferenceElementsWithFp32Values) {
  const RunConfig config = tiny_run(false);
  const ModelLayout layout = make_model_layout(config.model);
  const auto elements = audit_elements(layout, 12, config.data.seed);
  production::Trainer prod(config, testing::tiny_production_samples(), cpu_options());
  prod.set_audit_elements(elements);
  const auto before = prod.host_state();
  const IterationRecord record = prod.run_iteration();
  ASSERT_EQ(record.audit.size(), elements.size());
  const auto after = prod.host_state();
  for (std::size_t i = 0; i < elements.size(); ++i) {
    const auto flat = static_cast<std::size_t>(elements[i]);
    EXPECT_EQ(record.audit[i].old_value, static_cast<double>(before.params[flat]));  // fp32 widened
    EXPECT_EQ(record.audit[i].new_value, static_cast<double>(after.params[flat]));
    EXPECT_EQ(record.audit[i].m, static_cast<double>(after.exp_avg[flat]));
    EXPECT_EQ(record.audit[i].step, 1);
  }
}

TEST(ProductionTrainer, ModelFlopsFollowTheDocumentedConvention) {
  // docs/PRODUCTION.md: 6 x matrix parameters per position + 12 x L x H x hd per unmasked pair.
  RunConfig config = tiny_run(false);
  Sample sample;
  sample.tokens = std::vector<std::int32_t>(4, 1);
  sample.attention_start = {0, 0, 2, 2};  // pairs: 1 + 2 + 1 + 2 = 6
  const auto& m = config.model;
  const double d = 32, hd = 8, heads = 4, groups = 2, ffn = 64, vocab = 384, layers = 2;
  const double per_layer = d * heads * hd + 2 * d * groups * hd + heads * hd * d + 3 * d * ffn;
  const double expected = 6 * (layers * per_layer + vocab * d) * 4 + 12 * layers * heads * hd * 6;
  EXPECT_EQ(production::model_flops(m, {sample}), expected);
}

TEST(ProductionTrainer, RefusesLayoutsItDoesNotRun) {
  RunConfig config = tiny_run(false);
  config.parallel.data_parallel = 2;
  EXPECT_THROW(production::Trainer(config, testing::tiny_production_samples(), cpu_options()), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
