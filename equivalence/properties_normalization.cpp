// The equivalence property of SPEC 5's two loss normalizations (properties_internal.hpp):
// per-microbatch-mean against per-token, on a domain where their difference is decidable.
#include "equivalence/properties_internal.hpp"

#include <algorithm>
#include <cmath>

#include "core/data/packing.hpp"
#include "equivalence/float_generator.hpp"

namespace tandem::equivalence {

// ---- normalization ----

// The weights of the two normalizations differ exactly when the counts differ: microbatch j
// gets 1/(c_j x microbatches x DP) instead of 1/T. Whether the gradients then differ also needs
// the microbatches' gradients not to be proportional to their counts, which they are when loss
// positions repeat the same (context, label): a short stream that repeats inside the global
// batch, or "a EOD" documents whose every loss position sees one token. The domain therefore
// holds documents with content (at least 2 tokens before each EOD, over all 256 byte values)
// and enough of them that the global batch reads each token of the stream at most once; a
// window of lone EODs (no loss tokens) may follow as a whole-window run.
void microbatch_mean_differs_exactly_when_loss_token_counts_differ(const TwinKind& kind) {
  UpdateCase c = *update_case(CaseLimits{1, false, false});
  adapt_to(kind, c);
  const std::int64_t seq = c.config.model.seq_length;
  const std::int64_t tokens_read =
      (starting_samples(c) + c.test_layout.global_batch_size()) * seq + 1;
  std::vector<std::int64_t> lengths;
  std::int64_t tokens = 0;
  for (const std::int64_t length : c.documents.lengths) {
    if (length == 0 || length >= 3) lengths.push_back(length);
    if (length >= 3) tokens += length;
  }
  while (tokens < tokens_read) {
    lengths.push_back(seq + 3);
    tokens += seq + 3;
  }
  if (*rc::gen::weightedElement<bool>({{3, false}, {1, true}})) {
    lengths.insert(lengths.end(), static_cast<std::size_t>(seq + 1), 1);  // a window of EODs
  }
  c.documents.lengths = lengths;
  c.documents.alphabet = 256;
  c.documents.single_loss_token = false;  // this property's own domain (above)
  RunConfig per_token = with_layout(c.config, c.test_layout);
  per_token.optimizer.clip_grad = 0.0;
  // About normalization, not precision: in bf16 the worst-case bound (one bf16 rounding per store
  // along the path) exceeds the normalizations' difference, so the twin runs its fp32 mode.
  per_token.optimizer.bf16 = false;
  per_token.data.loss_normalization = LossNormalization::per_token;
  RunConfig microbatch_mean = per_token;
  microbatch_mean.data.loss_normalization = LossNormalization::microbatch_mean;
  const auto samples = shipped_samples(per_token, c.documents);
  const std::int64_t gbs = per_token.batch.global_batch_size;
  const std::int64_t start = starting_samples(c);

  // Loss tokens of every microbatch of every replica (SPEC 2's sample order).
  std::vector<std::int64_t> counts;
  for (std::int64_t m = 0; m < per_token.microbatches_per_replica(); ++m) {
    for (std::int64_t r = 0; r < per_token.parallel.data_parallel; ++r) {
      std::int64_t tokens = 0;
      for (const std::int64_t index : data::microbatch_sample_indices(
               {start, m, r, per_token.batch.micro_batch_size, per_token.parallel.data_parallel})) {
        tokens += samples(index).loss_tokens;
      }
      counts.push_back(tokens);
    }
  }
  const bool counts_equal = std::adjacent_find(counts.begin(), counts.end(),
                                               std::not_equal_to<>()) == counts.end();

  auto a = kind.make(setup_for(per_token, samples, {}, 0));
  auto b = kind.make(setup_for(microbatch_mean, samples, {}, 0));
  move_to_position(*a, start, gbs);
  move_to_position(*b, start, gbs);
  a->run_iteration();
  b->run_iteration();
  const std::vector<double> ga = a->last_gradient();
  const std::vector<double> gb = b->last_gradient();
  double max_abs = 0;
  double max_difference = 0;
  bool bitwise = true;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(ga[i]));
    max_difference = std::max(max_difference, std::abs(ga[i] - gb[i]));
    bitwise = bitwise && same_ieee_value(ga[i], gb[i]);
  }
  // Equal counts: 1/(c x microbatches x DP) = 1/(loss tokens) is the same double (products of
  // small integers are exact), so the gradients are bitwise equal: comparison exact. Different
  // counts: they must differ by more than the rounding bound of one gradient (approximate).
  const Precision precision = precision_of(kind, per_token);
  const double bound = gradient_bound(reduction_shape(per_token), {precision, precision}, max_abs);
  Report report;
  std::string count_text;
  for (const auto n : counts) count_text += (count_text.empty() ? "" : ",") + std::to_string(n);
  report.note("loss tokens per microbatch: [" + count_text + "] (mbs " +
              std::to_string(per_token.batch.micro_batch_size) + ", " +
              std::to_string(per_token.microbatches_per_replica()) + " microbatches, DP " +
              std::to_string(per_token.parallel.data_parallel) + ", first sample " +
              std::to_string(start) + ")");
  Finding f;
  f.update = 1;
  f.quantity = counts_equal ? "equal counts: gradients bitwise equal"
                            : "different counts: gradients differ as the reference's do";
  f.comparison = counts_equal ? Comparison::exact : Comparison::approximate;
  f.under_test = max_difference;
  f.error = max_difference;
  f.bound = bound;
  if (counts_equal) {
    f.ok = bitwise;
  } else {
    // Per element i, each run is within its bound of the double reference's (truth): b_a,i and
    // b_b,i (update_bounds: the smaller of the per-element and the worst-case bound). Where the
    // true difference d_i exceeds b_a,i + b_b,i the normalizations are told apart, and the twin's
    // difference must have d_i's sign and at least |d_i| - b_a,i - b_b,i. Without such an element
    // the twin is held to "not bitwise equal" only.
    const PrecisionPair pair = harness_pair(precision, fp64());
    auto observe = [&](const RunConfig& config) {
      auto truth = reference_twin().make(setup_for(config, samples, {}, 0));
      move_to_position(*truth, start, gbs);
      UpdateObservation observed;
      observed.before = truth->state();
      observed.batch = update_batch(*truth, observed.before, config);
      observed.record = truth->run_iteration();
      observed.gradient = truth->last_gradient();
      return observed;
    };
    const UpdateObservation truth_a = observe(per_token);
    const UpdateObservation truth_b = observe(microbatch_mean);
    const UpdateBounds bounds_a = update_bounds(per_token, pair, truth_a, 1.0);  // no clipping
    const UpdateBounds bounds_b = update_bounds(microbatch_mean, pair, truth_b, 1.0);
    std::int64_t decisive = 0;
    double true_difference = 0;
    double shortfall = 0;  // the most any decisive element's twin difference falls short
    for (std::size_t i = 0; i < ga.size(); ++i) {
      const double d = truth_a.gradient[i] - truth_b.gradient[i];
      true_difference = std::max(true_difference, std::abs(d));
      const double slack = bounds_a.gradient[i] + bounds_b.gradient[i];
      if (!(std::abs(d) > slack)) continue;
      ++decisive;
      const double seen = (ga[i] - gb[i]) * (d > 0 ? 1.0 : -1.0);
      shortfall = std::max(shortfall, (std::abs(d) - slack) - seen);
    }
    f.reference = true_difference;
    if (decisive > 0) {
      f.quantity += " on " + std::to_string(decisive) +
                    " decisive elements (sign and size of the true difference, less both bounds)";
      f.ok = shortfall <= 0;
      f.error = std::max(0.0, shortfall);
      f.bound = 0;
    } else {
      f.quantity += " (undecidable by the bounds: not bitwise equal)";
      f.ok = !bitwise;
    }
  }
  report.add(f);
  assert_report(report);
}

}  // namespace tandem::equivalence
