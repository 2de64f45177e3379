// The reference update path (SPEC 5-8): AdamW closed forms, accumulation invariance over every
// microbatch split and emulated DP size, skipped updates, batches without loss tokens, the
// microbatch-mean convention, clipping at its threshold, and the first update's learning rate.
#include <cmath>
#include <functional>
#include <limits>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <gtest/gtest.h>

#include "core/schedule.hpp"
#include "reference/adamw.hpp"
#include "reference/model.hpp"
#include "reference/trainer.hpp"
#include "tests/support/synthetic_data.hpp"
#include "tests/support/tiny_reference_model.hpp"

namespace tandem {
namespace {

using Float50 = boost::multiprecision::cpp_bin_float_50;
using reference::Trainer;

// A tiny model and run: 2 layers, width 16, 4 heads in 2 groups, 16 positions, GBS 8.
RunConfig tiny_run(std::int64_t micro_batch_size, std::int64_t data_parallel) {
  RunConfig config;
  config.model = testing::tiny_reference_model();
  config.model.padded_vocab_size = 384;
  config.batch.micro_batch_size = micro_batch_size;
  config.batch.global_batch_size = 8;
  config.parallel.data_parallel = data_parallel;
  config.parallel.world_size = data_parallel;
  config.optimizer.adam_beta1 = 0.9;
  config.optimizer.adam_beta2 = 0.95;
  config.optimizer.clip_grad = 0.0;
  config.schedule.lr = 1e-2;
  config.schedule.lr_warmup_init = 1e-3;
  config.schedule.lr_warmup_samples = 16;
  config.schedule.train_samples = 64;
  config.schedule.lr_decay_samples = 64;
  config.schedule.lr_decay_style = LrDecayStyle::cosine;
  config.schedule.weight_decay = 0.1;
  config.schedule.start_weight_decay = 0.1;
  config.schedule.end_weight_decay = 0.1;
  config.schedule.wd_incr_samples = 64;
  return config;
}

// Documents from 1 token to longer than a window, so windows hold EODs at varied places.
testing::StreamSamples tiny_samples() {
  testing::StreamSamples samples;
  samples.stream = testing::document_stream({5, 1, 23, 9, 40, 3, 17, 2, 12}, 64, 7);
  samples.seq_length = 16;
  return samples;
}

// ---- AdamW closed forms (SPEC 7), in 50 digits so the expected values are exact to 1e-40. ----

TEST(AdamW, ZeroBetasAndUnitLrGiveASignStep) {
  OptimizerConfig optimizer;
  optimizer.adam_beta1 = 0.0;
  optimizer.adam_beta2 = 0.0;
  optimizer.adam_eps = 1e-45;  // only the 50-digit type resolves it; the step is sign(g)
  const reference::AdamHyper<Float50> hyper(optimizer, 1);
  for (const double grad : {3.0 / 8.0, -5.0 / 4.0}) {
    Float50 param = Float50(1) / 2;
    Float50 exp_avg = 0, exp_avg_sq = 0;
    reference::adamw_update(hyper, Float50(1), Float50(0), Float50(grad), param, exp_avg,
                            exp_avg_sq);
    const Float50 expected = Float50(1) / 2 - (grad > 0 ? 1 : -1);  // 0.5 - sign(g)
    EXPECT_LT(abs(param - expected), Float50(1e-40)) << "grad " << grad;
  }
}

TEST(AdamW, TheSeedsWorkedExample) {
  // SPEC 7: p = 0.5, Adam term 0.5, lr = 8e-5, wd = 0.1 gives 0.5 - 8e-5 * (0.5 + 0.1 * 0.5)
  // = 0.499956. At t = 1 with b1 = b2 = 0 the Adam term is g/(|g| + eps) = 1, so we apply the
  // same step with term 1, lr 4e-5 and wd 0.2: 4e-5 * (1 + 0.2 * 0.5) = 8e-5 * 0.55 = 4.4e-5.
  OptimizerConfig optimizer;
  optimizer.adam_beta1 = 0.0;
  optimizer.adam_beta2 = 0.0;
  optimizer.adam_eps = 1e-45;
  const reference::AdamHyper<Float50> hyper(optimizer, 1);
  Float50 param = Float50(1) / 2;
  Float50 exp_avg = 0, exp_avg_sq = 0;
  reference::adamw_update(hyper, Float50("4e-5"), Float50("0.2"), Float50(1), param, exp_avg,
                          exp_avg_sq);
  EXPECT_LT(abs(param - Float50("0.499956")), Float50(1e-40)) << param;
}

// ---- The update path ----

std::vector<double> gradient_after_one_iteration(std::int64_t mbs, std::int64_t dp) {
  Trainer<double> trainer(tiny_run(mbs, dp), tiny_samples());
  trainer.run_iteration();
  return trainer.last_gradient();
}

std::vector<Float50> gradient_after_one_iteration_50(std::int64_t mbs, std::int64_t dp) {
  Trainer<Float50> trainer(tiny_run(mbs, dp), tiny_samples());
  trainer.run_iteration();
  return trainer.last_gradient();
}

// SPEC 5: per-token normalization makes the gradient independent of the split, exactly in exact
// arithmetic. Comparison: approximate. Two evaluation orders of the same sum of n terms differ by
// at most 2*gamma_n*sum|terms| (gamma_n = n*u/(1 - n*u)); every gradient element here is a sum
// over at most n = GBS x seq x max(d, F, V_padded) = 8 x 16 x 384 products, and sum|terms| is
// bounded by the element's magnitude scale, which we take as max|g| x n_samples for a gradient
// whose per-sample parts may cancel. u: 2^-166 for cpp_bin_float_50's 166-bit significand, 2^-53
// for double.
TEST(UpdatePath, AccumulatedMicrobatchesEqualTheDirectGlobalBatch) {
  const std::int64_t terms = 8 * 16 * 384;
  const std::vector<std::pair<std::int64_t, std::int64_t>> splits = {
      {1, 1}, {2, 1}, {4, 2}, {2, 2}, {1, 4}, {1, 8}};
  const std::vector<Float50> direct50 = gradient_after_one_iteration_50(8, 1);
  Float50 scale = 0;
  for (const auto& g : direct50) scale = std::max(scale, Float50(abs(g)));
  scale *= 8;  // samples in the global batch
  ASSERT_GT(scale, Float50(0));
  const Float50 u50 = ldexp(Float50(1), -166);
  const Float50 bound50 = 2 * terms * u50 * scale;
  const double bound_double = 2.0 * terms * std::ldexp(1.0, -53) * static_cast<double>(scale);
  for (const auto& [mbs, dp] : splits) {
    const auto split50 = gradient_after_one_iteration_50(mbs, dp);
    const auto split_double = gradient_after_one_iteration(mbs, dp);
    for (std::size_t i = 0; i < direct50.size(); ++i) {
      ASSERT_LE(abs(split50[i] - direct50[i]), bound50)
          << "mbs " << mbs << " dp " << dp << " element " << i;
      ASSERT_LE(std::abs(split_double[i] - static_cast<double>(direct50[i])), bound_double)
          << "mbs " << mbs << " dp " << dp << " element " << i;
    }
  }
}

TEST(UpdatePath, NegativeControlAPerturbedGradientIsRejected) {
  // The bound above must be able to fail: a one-ulp-of-1e-6 perturbation is far outside it.
  const auto direct = gradient_after_one_iteration(8, 1);
  const auto split = gradient_after_one_iteration(2, 2);
  double scale = 0;
  for (const double g : direct) scale = std::max(scale, std::abs(g));
  const double bound_double = 2.0 * 8 * 16 * 384 * std::ldexp(1.0, -53) * 8 * scale;
  EXPECT_GT(1e-6 * scale, bound_double);
  EXPECT_GT(std::abs(split[0] + 1e-6 * scale - direct[0]), bound_double);
}

TEST(UpdatePath, FirstUpdateUsesWarmupInitAndTheScheduleAdvancesBySamples) {
  Trainer<double> trainer(tiny_run(2, 2), tiny_samples());
  const IterationRecord first = trainer.run_iteration();
  EXPECT_EQ(first.lr, 1e-3);  // SPEC 8: update 1 uses lr(0) = --lr-warmup-init
  EXPECT_EQ(first.step, 1);
  const IterationRecord second = trainer.run_iteration();
  // n = 8 of W = 16: init + (max - init) * 8/16.
  EXPECT_DOUBLE_EQ(second.lr, 1e-3 + (1e-2 - 1e-3) * 8.0 / 16.0);
  EXPECT_EQ(second.consumed_samples, 16);
  EXPECT_EQ(second.totals.scheduler_samples, 16);
}

TEST(UpdatePath, ASkippedUpdateChangesOnlyIterationConsumedSamplesAndTheSkipCounter) {
  reference::TestSwitches switches;
  switches.nonfinite_gradient_iterations = {2};
  Trainer<double> trainer(tiny_run(2, 2), tiny_samples(), switches);
  const IterationRecord first = trainer.run_iteration();
  const auto before = trainer.state();
  const IterationRecord skipped = trainer.run_iteration();
  const auto& after = trainer.state();
  EXPECT_FALSE(skipped.update_successful);
  EXPECT_TRUE(std::isnan(skipped.grad_norm));
  EXPECT_EQ(after.params, before.params);          // exact: untouched
  EXPECT_EQ(after.exp_avg, before.exp_avg);
  EXPECT_EQ(after.exp_avg_sq, before.exp_avg_sq);
  EXPECT_EQ(after.counters.successful_updates, before.counters.successful_updates);
  EXPECT_EQ(after.counters.scheduler_samples, before.counters.scheduler_samples);
  EXPECT_EQ(after.counters.iteration, before.counters.iteration + 1);
  EXPECT_EQ(after.counters.consumed_samples, before.counters.consumed_samples + 8);
  EXPECT_EQ(after.counters.skipped_updates, 1);
  EXPECT_EQ(after.counters.consecutive_skips, 1);
  // Its record shows the lr the scheduler holds: the one the next successful update will use.
  const IterationRecord third = trainer.run_iteration();
  EXPECT_EQ(skipped.lr, third.lr);
  EXPECT_EQ(third.step, first.step + 1);
  EXPECT_EQ(trainer.state().counters.consecutive_skips, 0);
}

// A window of nothing but EOD inputs has no loss tokens (SPEC 3: input EOD is masked).
testing::StreamSamples all_eod_samples() {
  testing::StreamSamples samples;
  samples.stream.assign(64, kEodToken);
  samples.seq_length = 16;
  return samples;
}

TEST(UpdatePath, AGlobalBatchWithoutLossTokensIsASuccessfulUpdateWithZeroGradient) {
  RunConfig config = tiny_run(2, 2);
  Trainer<double> trainer(config, all_eod_samples());
  const auto before = trainer.state().params;
  const IterationRecord record = trainer.run_iteration();
  EXPECT_EQ(record.loss_tokens, 0);
  EXPECT_EQ(record.loss, 0.0);  // SPEC 5: logged loss 0, not a division by zero
  EXPECT_EQ(record.grad_norm, 0.0);
  EXPECT_TRUE(record.update_successful);
  EXPECT_EQ(record.step, 1);
  const auto& layout = trainer.layout();
  const double lr = record.lr;
  for (const auto& tensor : layout.tensors) {
    const double wd = tensor.decay_group == DecayGroup::decay ? config.schedule.weight_decay : 0;
    for (std::int64_t e = 0; e < tensor.numel; ++e) {
      const auto i = static_cast<std::size_t>(tensor.offset + e);
      // g = 0: m = v = 0, the Adam term is 0/(0 + eps) = 0, and decay still applies.
      // PyTorch's order p*(1 - lr*wd) differs from SPEC 7's by at most 2 roundings: 2u|p|.
      const double expected = before[i] * (1.0 - lr * wd);
      ASSERT_NEAR(trainer.state().params[i], expected,
                  2.0 * std::numeric_limits<double>::epsilon() * std::abs(before[i]))
          << tensor.name << "[" << e << "]";
      ASSERT_EQ(trainer.state().exp_avg[i], 0.0);
    }
  }
}

TEST(UpdatePath, MicrobatchMeanCountsAMicrobatchWithoutLossTokensAsZero) {
  // Global batch = [a sample with loss tokens, a sample without], mbs 1: the microbatch-mean
  // loss is (mean_a + 0) / 2, so its gradient is exactly half of the gradient of mean_a alone
  // (scaling by 2^-1 commutes with every rounding): comparison exact.
  testing::StreamSamples normal = tiny_samples();
  testing::StreamSamples empty = all_eod_samples();
  auto mixed = [&](std::int64_t index) { return index % 2 == 0 ? normal(index / 2) : empty(0); };
  auto only_normal = [&](std::int64_t index) { return normal(index); };
  RunConfig config = tiny_run(1, 1);
  config.data.loss_normalization = LossNormalization::microbatch_mean;
  config.batch.global_batch_size = 2;
  Trainer<double> two(config, mixed);
  two.run_iteration();
  config.batch.global_batch_size = 1;
  Trainer<double> one(config, only_normal);
  one.run_iteration();
  ASSERT_EQ(two.last_gradient().size(), one.last_gradient().size());
  for (std::size_t i = 0; i < one.last_gradient().size(); ++i) {
    ASSERT_EQ(two.last_gradient()[i], one.last_gradient()[i] / 2) << "element " << i;
  }
}

TEST(UpdatePath, ClippingAppliesJustAboveTheThresholdAndNotJustBelow) {
  RunConfig config = tiny_run(2, 2);
  Trainer<double> probe(config, tiny_samples());
  const double norm = probe.run_iteration().grad_norm;
  ASSERT_GT(norm, 0.0);
  // SPEC 6: coeff = clip / (norm + 1e-6) is applied when below 1, i.e. when clip < norm + 1e-6.
  config.optimizer.clip_grad = (norm + 1e-6) * (1 + 1e-12);
  Trainer<double> unclipped(config, tiny_samples());
  const IterationRecord kept = unclipped.run_iteration();
  EXPECT_FALSE(kept.clipped);
  EXPECT_EQ(kept.clip_coeff, 1.0);
  config.optimizer.clip_grad = (norm + 1e-6) * (1 - 1e-12);
  Trainer<double> clipped(config, tiny_samples());
  const IterationRecord cut = clipped.run_iteration();
  EXPECT_TRUE(cut.clipped);
  EXPECT_LT(cut.clip_coeff, 1.0);
  EXPECT_EQ(cut.grad_norm, norm);  // the log shows the pre-clip norm
}

TEST(UpdatePath, SameSeedSameRunBitwise) {
  Trainer<double> a(tiny_run(2, 2), tiny_samples());
  Trainer<double> b(tiny_run(2, 2), tiny_samples());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.run_iteration().loss, b.run_iteration().loss);
  }
  EXPECT_EQ(a.state().params, b.state().params);
}

TEST(UpdatePath, LossFallsOnARepeatedBatch) {
  // Sanity of the whole loop: training on one repeating window lowers its loss.
  RunConfig config = tiny_run(8, 1);
  config.schedule.lr_warmup_samples = 0;
  config.schedule.lr_decay_style = LrDecayStyle::constant;
  testing::StreamSamples samples = tiny_samples();
  auto same = [&](std::int64_t) { return samples(0); };
  Trainer<double> trainer(config, same);
  const double first = trainer.run_iteration().loss;
  double last = first;
  for (int i = 0; i < 6; ++i) last = trainer.run_iteration().loss;
  EXPECT_LT(last, first);
}

}  // namespace
}  // namespace tandem
