// Tests of the reference decoder (reference/model_ops.hpp, reference/model.hpp): each forward
// against values known by construction, finite-difference proofs of every hand-written backward
// in 50-digit arithmetic, exactness properties of the document masks, positions and loss mask in
// double, and the speed of one tiny-model update. The layout and the initialization stream are
// tested in tests/model_layout_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core/config.hpp"
#include "core/data/sample.hpp"
#include "core/init.hpp"
#include "core/model_layout.hpp"
#include "reference/model.hpp"
#include "reference/model_ops.hpp"

namespace tandem::reference {
namespace {

using Real50 = boost::multiprecision::cpp_bin_float_50;
using std::abs;  // unqualified abs: std for double, Boost by ADL for Real50

// ---------------------------------------------------------------------------------------------
// Shared helpers.

// One seeded stream of test inputs (std::mt19937_64, seed given per test); values are doubles,
// widened exactly when the test runs in 50 digits.
class TestInputs {
 public:
  explicit TestInputs(std::uint64_t seed) : engine_(seed) {}
  double uniform(double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(engine_);
  }
  template <class Real>
  std::vector<Real> uniform_vector(std::size_t count, double low, double high) {
    std::vector<Real> values;
    values.reserve(count);
    for (std::size_t i = 0; i < count; ++i) values.emplace_back(uniform(low, high));
    return values;
  }
  std::int32_t integer(std::int32_t low, std::int32_t high) {
    return std::uniform_int_distribution<std::int32_t>(low, high)(engine_);
  }

 private:
  std::mt19937_64 engine_;
};

// A sample built the way SPEC 3 says the data pipeline builds one: `window` holds seq+1 tokens;
// inputs are window[0:seq], labels window[1:seq+1]; positions restart at 0 after each EOD; each
// position attends back to its document's first position; the loss mask is 0 where the input is
// EOD.
Sample make_sample(const std::vector<std::int32_t>& window, std::int32_t eod_token) {
  Sample sample;
  const std::size_t seq = window.size() - 1;
  std::int32_t position = 0;
  std::int32_t document_start = 0;
  for (std::size_t t = 0; t < seq; ++t) {
    sample.tokens.push_back(window[t]);
    sample.labels.push_back(window[t + 1]);
    sample.positions.push_back(position);
    sample.attention_start.push_back(document_start);
    const bool is_eod = window[t] == eod_token;
    sample.loss_mask.push_back(is_eod ? 0 : 1);
    sample.loss_tokens += is_eod ? 0 : 1;
    sample.input_tokens += 1;
    if (is_eod) {
      position = 0;
      document_start = static_cast<std::int32_t>(t) + 1;
    } else {
      ++position;
    }
  }
  return sample;
}

// A window of seq+1 tokens in [0, eod) with EODs at the given input positions.
std::vector<std::int32_t> make_window(TestInputs& inputs, std::size_t seq, std::int32_t eod_token,
                                      const std::vector<std::size_t>& eod_positions) {
  std::vector<std::int32_t> window(seq + 1);  // [seq + 1]
  for (std::int32_t& token : window) token = inputs.integer(0, eod_token - 1);
  for (std::size_t position : eod_positions) window[position] = eod_token;
  return window;
}

template <class Real>
std::vector<Real> widen(const std::vector<float>& values) {
  return std::vector<Real>(values.begin(), values.end());
}

// ---------------------------------------------------------------------------------------------
// The finite-difference check, in cpp_bin_float_50.
//
// Kind of comparison: approximate. For an objective f evaluated in p-bit arithmetic, the
// central difference (f(x+h) - f(x-h)) / 2h differs from f'(x) by
//   truncation  h^2/6 |f'''(xi)|                   (Taylor, xi in [x-h, x+h])
//   rounding    (|df(x+h)| + |df(x-h)|) / 2h <= n eps |f| / h
// where eps = 2^(1-p) is the unit roundoff bound and n bounds the rounding steps of one
// evaluation. cpp_bin_float_50 carries p = 168 bits, eps ~ 5e-51. We step by h = 2^-50
// (~8.9e-16): every input is a double (53 bits) widened, so x +- h is exact in 168 bits and the
// step itself adds no error. Then truncation <= 1.3e-31 |f'''| and, with n |f| <= 1e9 (well
// above our objectives: at most ~1e6 operations on O(1)..O(100) values), rounding <= 6e-27.
// For |f'''| <= 1e6 on the step interval (our inputs are O(1) and weights at most O(1)),
// the error is below 1e-25 + 6e-27, so we accept |fd - analytic| <= 1e-22 * max(1, |analytic|),
// three orders of margin, still 6 orders below double's epsilon: a backward that is merely
// "right in double" (or off by one rounding in double) fails.
constexpr double kFiniteDifferenceStep = 0x1.0p-50;
const Real50 kFiniteDifferenceTolerance("1e-22");

struct GradientCheck {
  std::int64_t checked = 0;
  double worst_error_fraction = 0;  // max over elements of |fd - analytic| / bound
  std::string worst;                // the diagnosis of the worst element
};

// Compares `analytic` with central differences of `objective` at `point` for each of `indices`.
GradientCheck check_gradient(const std::function<Real50(const std::vector<Real50>&)>& objective,
                             std::vector<Real50> point, const std::vector<Real50>& analytic,
                             const std::vector<std::int64_t>& indices, const std::string& label,
                             const std::function<std::string(std::int64_t)>& name_of = nullptr) {
  GradientCheck check;
  const Real50 step(kFiniteDifferenceStep);
  for (std::int64_t index : indices) {
    const std::size_t at = static_cast<std::size_t>(index);
    const Real50 original = point[at];
    point[at] = original + step;
    const Real50 above = objective(point);
    point[at] = original - step;
    const Real50 below = objective(point);
    point[at] = original;
    const Real50 finite_difference = (above - below) / (2 * step);
    const Real50 error = abs(finite_difference - analytic[at]);
    const Real50 bound = kFiniteDifferenceTolerance * std::max(Real50(1), Real50(abs(analytic[at])));
    const double fraction = static_cast<double>(Real50(error / bound));
    ++check.checked;
    if (!(fraction <= check.worst_error_fraction) || check.checked == 1) {
      if (!(fraction <= check.worst_error_fraction)) check.worst_error_fraction = fraction;
      std::ostringstream report;
      report << std::setprecision(25) << label << " element " << index
             << (name_of ? " (" + name_of(index) + ")" : std::string()) << ": analytic "
             << analytic[at] << ", finite difference " << finite_difference << ", error " << error
             << ", bound " << bound << " (" << 100 * fraction << " % of the bound)";
      check.worst = report.str();
    }
  }
  return check;
}

std::vector<std::int64_t> all_indices(std::size_t count) {
  std::vector<std::int64_t> indices(count);
  for (std::size_t i = 0; i < count; ++i) indices[i] = static_cast<std::int64_t>(i);
  return indices;
}

void expect_gradient_matches(const GradientCheck& check) {
  ASSERT_GT(check.checked, 0);
  EXPECT_LE(check.worst_error_fraction, 1.0) << check.worst;
  std::cout << "[ fd ] " << check.checked << " elements; worst: " << check.worst << "\n";
}

// ---------------------------------------------------------------------------------------------
// Each operation's forward against values known by construction (SPEC 4), so the finite
// differences below prove the gradient of the right function.

// The scalar objective of the finite-difference checks: an op's output dotted with fixed weights,
// so the gradient it feeds back into the op is those weights. Summed in index order.
Real50 weighted_sum(const std::vector<Real50>& weights, const std::vector<Real50>& values) {
  Real50 sum = 0;
  for (std::size_t i = 0; i < values.size(); ++i) sum += weights[i] * values[i];
  return sum;
}

TEST(ReferenceOpsForward, LinearUsesPyTorchsOutByInWeightAndAddsTheBias) {
  // Exact: small integers.
  const std::vector<double> weight = {1, 2, 3, 4, 5, 6};  // [out 3, in 2]
  const std::vector<double> bias = {1, 1, 1};             // [3]
  const std::vector<double> input = {1, 10};              // [1, 2]
  std::vector<double> output(3);                          // [1, 3]
  linear_forward(input.data(), weight.data(), bias.data(), 1, 2, 3, output.data());
  EXPECT_EQ(output, (std::vector<double>{1 + 20 + 1, 3 + 40 + 1, 5 + 60 + 1}));
}

TEST(ReferenceOpsForward, RmsNormDividesByTheRootMeanSquareAndScales) {
  // Exact: mean((+-2)^2) = 4, so with epsilon 0 the inverse RMS is 1/2 and y = x/2 * w.
  const std::vector<double> input = {2, -2, 2, -2};        // [1, 4]
  const std::vector<double> weight = {1, 0.5, 3, 0.25};    // [4]
  std::vector<double> output(4);                           // [1, 4]
  std::vector<double> inverse_rms(1);                      // [1]
  rmsnorm_forward(input.data(), weight.data(), 1, 4, 0.0, output.data(), inverse_rms.data());
  EXPECT_EQ(inverse_rms[0], 0.5);
  EXPECT_EQ(output, (std::vector<double>{2.0 / 2 * 1, -2.0 / 2 * 0.5, 2.0 / 2 * 3, -2.0 / 2 * 0.25}));
}

TEST(ReferenceOpsForward, SwiGluGatesWithSiluOfTheGateTimesUp) {
  // Approximate: the expected value is written the same way, 1 ulp per operation, 4 ulp slack.
  const std::vector<double> gate = {2, 0};  // [2]
  const std::vector<double> up = {3, 5};    // [2]
  std::vector<double> hidden(2);            // [2]
  swiglu_forward(gate.data(), up.data(), 2, hidden.data());
  EXPECT_NEAR(hidden[0], 2.0 / (1.0 + std::exp(-2.0)) * 3.0, 4 * std::numeric_limits<double>::epsilon() * 6);
  EXPECT_EQ(hidden[1], 0.0);  // exact: silu(0) = 0 whatever up is
}

TEST(ReferenceOpsForward, GroupedQueryHeadJReadsGroupJOverHeadsPerGroup) {
  // Exact: one position attends only to itself with weight exp(0)/exp(0) = 1, so each head's
  // context is its group's value vector. 4 heads over 2 groups: heads 0, 1 read group 0 and
  // heads 2, 3 group 1 (Hugging Face's repeat_kv), not j % G.
  const AttentionShape shape{1, 4, 2, 2};
  const std::vector<double> query(4 * 2, 0.5);           // [1, H*hd]
  const std::vector<double> key(2 * 2, 0.25);            // [1, G*hd]
  const std::vector<double> value = {10, 11, 20, 21};    // [1, G*hd]: group 0 then group 1
  const std::vector<std::int32_t> attention_start = {0};  // [1]
  std::vector<double> probabilities(4);                  // [H, 1, 1]
  std::vector<double> context(4 * 2);                    // [1, H*hd]
  attention_forward(query.data(), key.data(), value.data(), attention_start.data(), shape,
                    probabilities.data(), context.data());
  EXPECT_EQ(context, (std::vector<double>{10, 11, 10, 11, 20, 21, 20, 21}));
}

TEST(ReferenceOpsForward, AttentionScoresAreScaledByOneOverRootHeadDim) {
  // Position 1 attends to 0 and 1 with scores 0 and q.k1 / sqrt(hd) = ln 3 (q.k1 = 2 ln 3 for
  // hd = 4), so the weights are 1/4 and 3/4 and the context is 3/4 of v1 = (1, 1, 1, 1).
  // Approximate: log, exp and the softmax sums round a few times; 16 ulp of 1 is ample.
  const AttentionShape shape{2, 1, 1, 4};
  const double log3 = std::log(3.0);
  const std::vector<double> query = {0, 0, 0, 0, 1, 1, 0, 0};          // [2, 4]
  const std::vector<double> key = {0, 0, 0, 0, log3, log3, 0, 0};      // [2, 4]
  const std::vector<double> value = {0, 0, 0, 0, 1, 1, 1, 1};          // [2, 4]
  const std::vector<std::int32_t> attention_start = {0, 0};            // [2]
  std::vector<double> probabilities(2 * 2);                            // [1, 2, 2]
  std::vector<double> context(2 * 4);                                  // [2, 4]
  attention_forward(query.data(), key.data(), value.data(), attention_start.data(), shape,
                    probabilities.data(), context.data());
  const double tolerance = 16 * std::numeric_limits<double>::epsilon();
  EXPECT_NEAR(probabilities[2], 0.25, tolerance);
  EXPECT_NEAR(probabilities[3], 0.75, tolerance);
  for (std::size_t i = 4; i < 8; ++i) EXPECT_NEAR(context[i], 0.75, tolerance);
}

// ---------------------------------------------------------------------------------------------
// Each operation's backward against central differences in 50 digits.

TEST(ReferenceOpsFiniteDifference, RmsNorm) {
  TestInputs inputs(11);
  const std::int64_t rows = 3;
  const std::int64_t width = 5;
  const Real50 epsilon(1e-5);
  std::vector<Real50> point = inputs.uniform_vector<Real50>(rows * width + width, -1.5, 1.5);  // [x, w]
  const std::vector<Real50> output_weights = inputs.uniform_vector<Real50>(rows * width, -1, 1);  // [rows, width]
  auto objective = [&](const std::vector<Real50>& at) {
    std::vector<Real50> output(rows * width);   // [rows, width]
    std::vector<Real50> inverse_rms(rows);      // [rows]
    rmsnorm_forward(at.data(), at.data() + rows * width, rows, width, epsilon, output.data(), inverse_rms.data());
    return weighted_sum(output_weights, output);
  };
  std::vector<Real50> output(rows * width);  // [rows, width]
  std::vector<Real50> inverse_rms(rows);     // [rows]
  rmsnorm_forward(point.data(), point.data() + rows * width, rows, width, epsilon, output.data(), inverse_rms.data());
  std::vector<Real50> analytic(point.size(), Real50(0));  // [x grad, w grad]
  rmsnorm_backward(point.data(), point.data() + rows * width, inverse_rms.data(), output_weights.data(),
                   rows, width, analytic.data(), analytic.data() + rows * width);
  expect_gradient_matches(check_gradient(objective, point, analytic, all_indices(point.size()), "rmsnorm"));
}

TEST(ReferenceOpsFiniteDifference, LinearWithBias) {
  TestInputs inputs(12);
  const std::int64_t rows = 3;
  const std::int64_t in_features = 4;
  const std::int64_t out_features = 5;
  const std::int64_t weight_at = rows * in_features;
  const std::int64_t bias_at = weight_at + out_features * in_features;
  std::vector<Real50> point = inputs.uniform_vector<Real50>(bias_at + out_features, -1, 1);  // [x, W, b]
  const std::vector<Real50> output_weights = inputs.uniform_vector<Real50>(rows * out_features, -1, 1);
  auto forward = [&](const std::vector<Real50>& at) {
    std::vector<Real50> output(rows * out_features);  // [rows, out]
    linear_forward(at.data(), at.data() + weight_at, at.data() + bias_at, rows, in_features, out_features, output.data());
    return output;
  };
  auto objective = [&](const std::vector<Real50>& at) {
    const std::vector<Real50> output = forward(at);
    return weighted_sum(output_weights, output);
  };
  std::vector<Real50> analytic(point.size(), Real50(0));
  linear_backward(point.data(), point.data() + weight_at, output_weights.data(), rows, in_features,
                  out_features, analytic.data(), analytic.data() + weight_at, analytic.data() + bias_at);
  expect_gradient_matches(check_gradient(objective, point, analytic, all_indices(point.size()), "linear"));
}

TEST(ReferenceOpsFiniteDifference, RopeRotateHalf) {
  TestInputs inputs(13);
  const std::int64_t rows = 3;
  const std::int64_t heads = 2;
  const std::int64_t head_dim = 6;
  const std::vector<std::int32_t> positions = {0, 5, 17};  // [rows]
  const Real50 base(10000);
  std::vector<Real50> cosines(rows * head_dim / 2);  // [rows, hd/2]
  std::vector<Real50> sines(rows * head_dim / 2);    // [rows, hd/2]
  rope_tables(positions.data(), rows, head_dim, base, cosines.data(), sines.data());
  std::vector<Real50> point = inputs.uniform_vector<Real50>(rows * heads * head_dim, -1, 1);  // [rows, heads*hd]
  const std::vector<Real50> output_weights = inputs.uniform_vector<Real50>(point.size(), -1, 1);
  auto objective = [&](std::vector<Real50> at) {
    rope_forward(at.data(), cosines.data(), sines.data(), rows, heads, head_dim);
    return weighted_sum(output_weights, at);
  };
  std::vector<Real50> analytic = output_weights;
  rope_backward(analytic.data(), cosines.data(), sines.data(), rows, heads, head_dim);
  expect_gradient_matches(check_gradient(objective, point, analytic, all_indices(point.size()), "rope"));
}

TEST(ReferenceOps, RopeRotatesThePairIAndIPlusHalfByPositionTimesFrequency) {
  // Exact: position 1 and pair 0 have angle 1 * base^0 = 1 exactly, so (1, 0 | 0, 0) becomes
  // (cos 1, 0 | sin 1, 0) with the same libm results bit for bit.
  const std::int64_t head_dim = 4;
  const std::vector<std::int32_t> positions = {1};
  std::vector<double> cosines(head_dim / 2);  // [1, hd/2]
  std::vector<double> sines(head_dim / 2);    // [1, hd/2]
  rope_tables(positions.data(), 1, head_dim, 10000.0, cosines.data(), sines.data());
  std::vector<double> activations = {1, 0, 0, 0};  // [1, 1*hd]
  rope_forward(activations.data(), cosines.data(), sines.data(), 1, 1, head_dim);
  EXPECT_EQ(activations[0], std::cos(1.0));
  EXPECT_EQ(activations[2], std::sin(1.0));
  EXPECT_EQ(activations[1], 0.0);
  EXPECT_EQ(activations[3], 0.0);
  // Pair 1 turns with frequency 10000^(-2/4) = 1/100: at position 1 the angle is 0.01.
  // Approximate: pow and the product each round once (<= 2 ulp of 0.01 in the angle), and
  // cos/sin are Lipschitz 1, so 4 ulp of 1 covers it.
  const double tolerance = 4 * std::numeric_limits<double>::epsilon();
  EXPECT_NEAR(cosines[1], std::cos(0.01), tolerance);
  EXPECT_NEAR(sines[1], std::sin(0.01), tolerance);
}

// Attention over three documents of lengths 3, 2, 1 in a window of 6, GQA with 4 heads over 2
// groups.
struct AttentionCase {
  AttentionShape shape{6, 4, 2, 4};
  std::vector<std::int32_t> attention_start = {0, 0, 0, 3, 3, 5};  // [rows]
  std::int64_t query_size() const { return shape.rows * shape.heads * shape.head_dim; }
  std::int64_t kv_size() const { return shape.rows * shape.groups * shape.head_dim; }
};

TEST(ReferenceOpsFiniteDifference, AttentionWithDocumentSpansAndGroupedQueries) {
  TestInputs inputs(14);
  const AttentionCase test_case;
  const AttentionShape& shape = test_case.shape;
  const std::int64_t key_at = test_case.query_size();
  const std::int64_t value_at = key_at + test_case.kv_size();
  // Inputs in [-2, 2] so the softmaxes are far from uniform.
  std::vector<Real50> point = inputs.uniform_vector<Real50>(value_at + test_case.kv_size(), -2, 2);  // [q, k, v]
  const std::vector<Real50> output_weights = inputs.uniform_vector<Real50>(test_case.query_size(), -1, 1);
  std::vector<Real50> probabilities(shape.heads * shape.rows * shape.rows);  // [H, rows, rows]
  auto objective = [&](const std::vector<Real50>& at) {
    std::vector<Real50> context(test_case.query_size());  // [rows, H*hd]
    std::vector<Real50> scratch(probabilities.size());    // [H, rows, rows]
    attention_forward(at.data(), at.data() + key_at, at.data() + value_at,
                      test_case.attention_start.data(), shape, scratch.data(), context.data());
    return weighted_sum(output_weights, context);
  };
  std::vector<Real50> context(test_case.query_size());  // [rows, H*hd]
  attention_forward(point.data(), point.data() + key_at, point.data() + value_at,
                    test_case.attention_start.data(), shape, probabilities.data(), context.data());
  std::vector<Real50> analytic(point.size(), Real50(0));
  attention_backward(point.data(), point.data() + key_at, point.data() + value_at,
                     test_case.attention_start.data(), shape, probabilities.data(),
                     output_weights.data(), analytic.data(), analytic.data() + key_at,
                     analytic.data() + value_at);
  expect_gradient_matches(check_gradient(objective, point, analytic, all_indices(point.size()), "attention"));
}

// The SwiGLU checks' objective: sum_i weights_i * swiglu(gate_i, up_i) over at = [gate, up], each
// [count].
Real50 weighted_swiglu(const std::vector<Real50>& at, const std::vector<Real50>& weights, std::int64_t count) {
  std::vector<Real50> hidden(count);  // [count]
  swiglu_forward(at.data(), at.data() + count, count, hidden.data());
  return weighted_sum(weights, hidden);
}

// weighted_swiglu's analytic gradient at point, [gate, up].
std::vector<Real50> weighted_swiglu_gradient(const std::vector<Real50>& point, const std::vector<Real50>& weights,
                                             std::int64_t count) {
  std::vector<Real50> analytic(point.size(), Real50(0));
  swiglu_backward(point.data(), point.data() + count, weights.data(), count, analytic.data(), analytic.data() + count);
  return analytic;
}

TEST(ReferenceOpsFiniteDifference, SwiGlu) {
  TestInputs inputs(15);
  const std::int64_t count = 9;
  // Gates over [-6, 6] reach both tails of the sigmoid.
  std::vector<Real50> point = inputs.uniform_vector<Real50>(count, -6, 6);  // [gate, up]
  const std::vector<Real50> up = inputs.uniform_vector<Real50>(count, -2, 2);
  point.insert(point.end(), up.begin(), up.end());
  const std::vector<Real50> output_weights = inputs.uniform_vector<Real50>(count, -1, 1);
  auto objective = [&](const std::vector<Real50>& at) { return weighted_swiglu(at, output_weights, count); };
  std::vector<Real50> analytic = weighted_swiglu_gradient(point, output_weights, count);
  expect_gradient_matches(check_gradient(objective, point, analytic, all_indices(point.size()), "swiglu"));
}

TEST(ReferenceOpsFiniteDifference, MaskedCrossEntropy) {
  TestInputs inputs(16);
  const std::int64_t rows = 4;
  const std::int64_t vocab = 7;
  const std::vector<std::int32_t> labels = {3, 0, 6, 3};     // [rows]
  const std::vector<std::uint8_t> loss_mask = {1, 0, 1, 1};  // [rows]
  const Real50 loss_scale = Real50(3) / 4;
  std::vector<Real50> point = inputs.uniform_vector<Real50>(rows * vocab, -3, 3);  // [rows, vocab]
  auto objective = [&](const std::vector<Real50>& at) {
    return loss_scale * cross_entropy_forward_backward(at.data(), labels.data(), loss_mask.data(),
                                                       rows, vocab, loss_scale, static_cast<Real50*>(nullptr));
  };
  std::vector<Real50> analytic(point.size(), Real50(0));
  cross_entropy_forward_backward(point.data(), labels.data(), loss_mask.data(), rows, vocab,
                                 loss_scale, analytic.data());
  expect_gradient_matches(check_gradient(objective, point, analytic, all_indices(point.size()), "cross_entropy"));
  // Exact: the masked row's gradient is zero, not merely small.
  for (std::int64_t c = 0; c < vocab; ++c) EXPECT_EQ(analytic[static_cast<std::size_t>(vocab + c)], 0);
}

TEST(ReferenceOps, CrossEntropyOfUniformLogitsIsLogVocab) {
  // Exact up to one rounding of log: equal logits give CE = log(vocab) per counted row.
  const std::int64_t vocab = 8;
  const std::vector<double> logits(2 * vocab, 0.25);   // [2, vocab]
  const std::vector<std::int32_t> labels = {1, 5};     // [2]
  const std::vector<std::uint8_t> loss_mask = {1, 1};  // [2]
  const double loss = cross_entropy_forward_backward(logits.data(), labels.data(), loss_mask.data(),
                                                     2, vocab, 1.0, static_cast<double*>(nullptr));
  // max = 0.25; normalizer = 8 exactly; log(8) rounds once; 0.25 + log 8 - 0.25 adds <= 2 ulp.
  EXPECT_NEAR(loss, 2 * std::log(8.0), 8 * std::numeric_limits<double>::epsilon());
}

// A gradient checker that cannot fail proves nothing: a gradient perturbed by one part in 1e18
// (far below double's resolution) must be rejected.
TEST(ReferenceOpsFiniteDifference, NegativeControlRejectsAPerturbedGradient) {
  TestInputs inputs(17);
  const std::int64_t count = 5;
  std::vector<Real50> point = inputs.uniform_vector<Real50>(2 * count, -2, 2);  // [gate, up]
  const std::vector<Real50> output_weights = inputs.uniform_vector<Real50>(count, -1, 1);
  auto objective = [&](const std::vector<Real50>& at) { return weighted_swiglu(at, output_weights, count); };
  std::vector<Real50> analytic = weighted_swiglu_gradient(point, output_weights, count);
  const Real50 relative_perturbation("1e-18");
  analytic[2] *= 1 + relative_perturbation;
  const GradientCheck check = check_gradient(objective, point, analytic, all_indices(point.size()), "perturbed swiglu");
  EXPECT_GT(check.worst_error_fraction, 1.0) << "the checker accepted a wrong gradient: " << check.worst;
  std::cout << "[ negative control ] rejected as it must be: " << check.worst << "\n";
}

// ---------------------------------------------------------------------------------------------
// The whole model.

// A small model for the 50-digit proofs; its variants are the registry below.
ModelConfig small_model(std::int64_t heads, std::int64_t groups, bool tie, bool bias) {
  ModelConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_attention_heads = heads;
  config.num_query_groups = groups;
  config.ffn_hidden_size = 24;
  config.vocab_size = 30;
  config.make_vocab_size_divisible_by = 16;
  config.padded_vocab_size = 32;  // logits over the padded vocabulary, as Megatron computes them
  config.seq_length = 8;
  config.tie_embeddings = tie;
  config.add_bias_linear = bias;
  config.init_method_std = 0.3;  // larger than training's 0.02 so every nonlinearity bends
  return config;
}

struct ModelCase {
  std::string name;
  ModelConfig config;
};

std::vector<ModelCase> model_cases() {
  return {
      {"untied_nobias_gqa_h4_g2", small_model(4, 2, false, false)},
      {"tied_bias_gqa_h4_g2", small_model(4, 2, true, true)},
      {"untied_bias_mha_h2_g2", small_model(2, 2, false, true)},
      {"tied_nobias_mqa_h4_g1", small_model(4, 1, true, false)},
  };
}

constexpr std::int32_t kSmallEod = 29;  // the last real token of the small vocabulary

// Two samples of 8 positions with documents split by EODs (so spans, position resets and
// masked positions all occur), and parameters moved off their initial values so norm weights
// and biases are not 1 and 0.
struct ModelInputs {
  std::vector<Sample> samples;
  std::vector<Real50> params;
};

ModelInputs model_inputs(const ModelConfig& config, std::uint64_t seed) {
  TestInputs inputs(seed);
  ModelInputs result;
  result.samples.push_back(make_sample(make_window(inputs, 8, kSmallEod, {2, 6}), kSmallEod));
  result.samples.push_back(make_sample(make_window(inputs, 8, kSmallEod, {4}), kSmallEod));
  const std::vector<float> initial = initial_parameters(config, seed);
  for (float value : initial) result.params.emplace_back(static_cast<double>(value) + inputs.uniform(-0.2, 0.2));
  return result;
}

// Up to `per_tensor` elements of every tensor, evenly spread, first and last included.
std::vector<std::int64_t> spread_indices(const ModelLayout& layout, std::int64_t per_tensor) {
  std::vector<std::int64_t> indices;
  for (const ParameterTensor& tensor : layout.tensors) {
    const std::int64_t picks = std::min(per_tensor, tensor.numel);
    for (std::int64_t k = 0; k < picks; ++k) {
      const std::int64_t element = picks == 1 ? 0 : k * (tensor.numel - 1) / (picks - 1);
      indices.push_back(tensor.offset + element);
    }
  }
  return indices;
}

std::string element_name(const ModelLayout& layout, std::int64_t flat) {
  for (const ParameterTensor& tensor : layout.tensors) {
    if (flat >= tensor.offset && flat < tensor.offset + tensor.numel) {
      return tensor.name + "[" + std::to_string(flat - tensor.offset) + "]";
    }
  }
  return "outside the layout";
}

class ReferenceModelFiniteDifference : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ReferenceModelFiniteDifference, GradientOfTheScaledMaskedLossMatchesCentralDifferences) {
  const ModelConfig& config = GetParam().config;
  const ModelLayout layout = make_model_layout(config);
  const ModelInputs inputs = model_inputs(config, 21);
  const Real50 loss_scale = Real50(1) / 13;  // as 1 / (loss tokens of a global batch)
  std::vector<Real50> grads(inputs.params.size(), Real50(0));
  const LossAndCounts<Real50> result =
      forward_backward(config, layout, inputs.params, inputs.samples, loss_scale, grads);
  EXPECT_EQ(result.loss_tokens, inputs.samples[0].loss_tokens + inputs.samples[1].loss_tokens);
  // Exact: the forward-only loss is the same computation.
  EXPECT_EQ(forward_loss(config, layout, inputs.params, inputs.samples).masked_loss_sum, result.masked_loss_sum);
  auto objective = [&](const std::vector<Real50>& params) {
    return loss_scale * forward_loss(config, layout, params, inputs.samples).masked_loss_sum;
  };
  const std::int64_t elements_per_tensor = 4;
  std::vector<std::int64_t> indices = spread_indices(layout, elements_per_tensor);
  // The embedding rows of tokens that occur, whose gradient has the input use (and, tied, both).
  const ParameterTensor& embedding = layout.tensor(layout.embedding);
  for (std::int64_t j = 0; j < config.hidden_size; j += 5) {
    indices.push_back(embedding.offset + inputs.samples[0].tokens[1] * config.hidden_size + j);
  }
  expect_gradient_matches(check_gradient(objective, inputs.params, grads, indices, GetParam().name,
                                         [&](std::int64_t flat) { return element_name(layout, flat); }));
}

INSTANTIATE_TEST_SUITE_P(Registry, ReferenceModelFiniteDifference, ::testing::ValuesIn(model_cases()),
                         [](const ::testing::TestParamInfo<ModelCase>& info) { return info.param.name; });

TEST(ReferenceModelFiniteDifference, NegativeControlRejectsAWrongModelGradient) {
  const ModelConfig config = small_model(4, 2, true, false);
  const ModelLayout layout = make_model_layout(config);
  const ModelInputs inputs = model_inputs(config, 22);
  std::vector<Real50> grads(inputs.params.size(), Real50(0));
  forward_backward(config, layout, inputs.params, inputs.samples, Real50(1), grads);
  // Drop one use of the tied embedding: the output projection's share of one element.
  const std::int64_t flat = layout.tensor(layout.embedding).offset + 3;
  std::vector<Real50> output_share(inputs.params.size(), Real50(0));
  {
    ModelConfig untied = config;
    untied.tie_embeddings = false;
    const ModelLayout untied_layout = make_model_layout(untied);
    std::vector<Real50> untied_params(inputs.params);
    const ParameterTensor& head = untied_layout.tensor(untied_layout.output);
    const ParameterTensor& tied_embedding = layout.tensor(layout.embedding);
    untied_params.insert(untied_params.end(), inputs.params.begin() + tied_embedding.offset,
                         inputs.params.begin() + tied_embedding.offset + tied_embedding.numel);
    ASSERT_EQ(static_cast<std::int64_t>(untied_params.size()), untied_layout.total_elements);
    std::vector<Real50> untied_grads(untied_params.size(), Real50(0));
    forward_backward(untied, untied_layout, untied_params, inputs.samples, Real50(1), untied_grads);
    grads[static_cast<std::size_t>(flat)] -= untied_grads[static_cast<std::size_t>(head.offset + 3)];
  }
  auto objective = [&](const std::vector<Real50>& params) {
    return forward_loss(config, layout, params, inputs.samples).masked_loss_sum;
  };
  const GradientCheck check = check_gradient(objective, inputs.params, grads, {flat}, "tied embedding without its output share");
  EXPECT_GT(check.worst_error_fraction, 1.0) << check.worst;
  std::cout << "[ negative control ] rejected as it must be: " << check.worst << "\n";
}

// With every projection weight zero a block adds exactly its o_proj and down_proj biases, so the
// logits are known in closed form: lm_head . (rmsnorm(embedding[token] + sum of those biases) *
// norm). This pins the embedding lookup, the residual adds, where each bias enters, the final
// norm and the output projection's [V, d] orientation (tied: the embedding itself).
// Approximate, in 50 digits: both sides round at most ~100 times on O(1) values, so they agree
// within 100 eps50 * 10 ~ 5e-48; we allow 1e-45.
TEST(ReferenceModel, ZeroProjectionsLeaveEmbeddingPlusBiasesThroughTheFinalNormAndHead) {
  const Real50 tolerance("1e-45");
  for (const bool tie : {false, true}) {
    const ModelConfig config = small_model(4, 2, tie, true);
    const ModelLayout layout = make_model_layout(config);
    ModelInputs inputs = model_inputs(config, 41);
    for (const LayerTensorIndices& block : layout.layers) {
      for (std::int64_t weight : {block.q_weight, block.k_weight, block.v_weight, block.o_weight,
                                  block.gate_weight, block.up_weight, block.down_weight}) {
        const ParameterTensor& tensor = layout.tensor(weight);
        std::fill(inputs.params.begin() + tensor.offset, inputs.params.begin() + tensor.offset + tensor.numel, Real50(0));
      }
    }
    const Sample& sample = inputs.samples[0];
    const std::vector<Real50> logits = forward_logits(config, layout, inputs.params, sample);
    const std::int64_t d = config.hidden_size;
    const std::int64_t vocab = config.padded_vocab_size;
    const Real50* embedding = inputs.params.data() + layout.tensor(layout.embedding).offset;  // [V, d]
    const Real50* head = inputs.params.data() + layout.tensor(layout.output).offset;          // [V, d]
    const Real50* norm = inputs.params.data() + layout.tensor(layout.final_norm).offset;      // [d]
    for (std::size_t t = 0; t < sample.tokens.size(); ++t) {
      std::vector<Real50> stream(embedding + sample.tokens[t] * d, embedding + (sample.tokens[t] + 1) * d);  // [d]
      for (const LayerTensorIndices& block : layout.layers) {
        for (std::int64_t j = 0; j < d; ++j) {
          stream[static_cast<std::size_t>(j)] += inputs.params[static_cast<std::size_t>(layout.tensor(block.o_bias).offset + j)] +
                                                 inputs.params[static_cast<std::size_t>(layout.tensor(block.down_bias).offset + j)];
        }
      }
      Real50 mean_square = 0;
      for (const Real50& value : stream) mean_square += value * value / d;
      const Real50 inverse_rms = 1 / sqrt(mean_square + Real50(config.norm_epsilon));
      for (std::int64_t c = 0; c < vocab; ++c) {
        Real50 expected = 0;
        for (std::int64_t j = 0; j < d; ++j) expected += head[c * d + j] * stream[static_cast<std::size_t>(j)] * inverse_rms * norm[j];
        const Real50 actual = logits[t * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(c)];
        ASSERT_LE(abs(actual - expected), tolerance)
            << (tie ? "tied" : "untied") << " position " << t << " logit " << c << ": " << actual << " vs " << expected;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Exactness properties in double.

ModelConfig tiny_model() {
  ModelConfig config;  // the default: L=2, d=32, F=64, V=384 padded, seq 32
  config.num_attention_heads = 4;
  config.num_query_groups = 2;
  return config;
}

std::vector<double> tiny_params(const ModelConfig& config, std::uint64_t seed) {
  return widen<double>(initial_parameters(config, seed));
}

TEST(ReferenceModel, AResetAttentionMaskIsolatesDocumentsExactly) {
  const ModelConfig config = tiny_model();
  const ModelLayout layout = make_model_layout(config);
  const std::vector<double> params = tiny_params(config, 31);
  TestInputs inputs(31);
  // Documents: [0, 10] ending in EOD at 10, [11, 20] ending at 20, [21, 31] running on.
  const std::vector<std::int32_t> window = make_window(inputs, 32, kEodToken, {10, 20});
  const Sample original = make_sample(window, kEodToken);
  std::vector<std::int32_t> other_window = window;
  for (std::size_t t = 0; t < 10; ++t) other_window[t] = (window[t] + 7) % kEodToken;  // first doc
  for (std::size_t t = 21; t < 33; ++t) other_window[t] = (window[t] + 3) % kEodToken;  // last doc
  const Sample perturbed = make_sample(other_window, kEodToken);
  const std::vector<double> logits = forward_logits(config, layout, params, original);
  const std::vector<double> other_logits = forward_logits(config, layout, params, perturbed);
  const std::size_t vocab = static_cast<std::size_t>(config.padded_vocab_size);
  // Exact: the middle document's logits are bitwise identical.
  for (std::size_t t = 11; t <= 20; ++t) {
    for (std::size_t c = 0; c < vocab; ++c) {
      ASSERT_EQ(logits[t * vocab + c], other_logits[t * vocab + c]) << "position " << t << " logit " << c;
    }
  }
  // The perturbed documents did change (the check has teeth).
  EXPECT_NE(logits[5 * vocab], other_logits[5 * vocab]);
  EXPECT_NE(logits[25 * vocab], other_logits[25 * vocab]);
}

TEST(ReferenceModel, WithoutTheResetMaskLaterDocumentsSeeEarlierOnes) {
  // Negative control of the isolation test: a causal (unreset) mask lets document 1 change
  // document 2's logits.
  const ModelConfig config = tiny_model();
  const ModelLayout layout = make_model_layout(config);
  const std::vector<double> params = tiny_params(config, 32);
  TestInputs inputs(32);
  const std::vector<std::int32_t> window = make_window(inputs, 32, kEodToken, {10});
  Sample original = make_sample(window, kEodToken);
  std::fill(original.attention_start.begin(), original.attention_start.end(), 0);
  std::vector<std::int32_t> other_window = window;
  other_window[3] = (window[3] + 1) % kEodToken;
  Sample perturbed = make_sample(other_window, kEodToken);
  std::fill(perturbed.attention_start.begin(), perturbed.attention_start.end(), 0);
  const std::size_t vocab = static_cast<std::size_t>(config.padded_vocab_size);
  EXPECT_NE(forward_logits(config, layout, params, original)[20 * vocab],
            forward_logits(config, layout, params, perturbed)[20 * vocab]);
}

// Kind of comparison: approximate. Shifting all positions of a document by c changes RoPE's
// angles, not their differences, so in exact arithmetic nothing changes; computed in precision
// eps, each angle p * base^(-2i/hd) carries a relative error <= 3 eps (pow, product, and the
// table entry's cos/sin rounding), i.e. an absolute error <= 3 eps (p_max + 1) in the rotation
// of every q and k, at most 4 eps p_max for p_max >= 3. Everything downstream amplifies a
// perturbation of relative size r by at most a factor we call the amplification A: the logits
// move by <= A r max|logit|. We take A = 1e3 (two layers of width 32 with O(0.02..1) weights
// and softmaxes) and verify that constant in 50 digits, where it is measured free of double's
// noise (ShiftedPositions...Fifty digits below): the same bound with eps50 must hold there.
constexpr double kShiftAmplification = 1e3;

double shift_tolerance(double epsilon, std::int32_t max_position, double max_abs_logit) {
  const double angle_error_per_position = 4;
  return kShiftAmplification * angle_error_per_position * epsilon * max_position * max_abs_logit;
}

struct ShiftResult {
  double max_difference = 0;
  double max_abs_logit = 0;
  std::int32_t max_position = 0;
};

template <class Real>
ShiftResult shift_positions_and_compare(const ModelConfig& config, const std::vector<Real>& params,
                                             std::int32_t shift, bool shift_one_token_only) {
  const ModelLayout layout = make_model_layout(config);
  TestInputs inputs(33);
  const std::size_t seq = static_cast<std::size_t>(config.seq_length);
  const std::vector<std::int32_t> window = make_window(inputs, seq, kEodToken, {12});
  const Sample original = make_sample(window, kEodToken);
  Sample shifted = original;
  // The second document is positions 13..seq-1.
  for (std::size_t t = 13; t < seq; ++t) {
    if (!shift_one_token_only || t == 15) shifted.positions[t] += shift;
  }
  const std::vector<Real> logits = forward_logits(config, layout, params, original);
  const std::vector<Real> shifted_logits = forward_logits(config, layout, params, shifted);
  const std::size_t vocab = static_cast<std::size_t>(config.padded_vocab_size);
  ShiftResult result;
  for (std::size_t t = 13; t < seq; ++t) {
    result.max_position = std::max(result.max_position, shifted.positions[t]);
    for (std::size_t c = 0; c < vocab; ++c) {
      const double difference = static_cast<double>(Real(abs(logits[t * vocab + c] - shifted_logits[t * vocab + c])));
      result.max_difference = std::max(result.max_difference, difference);
      result.max_abs_logit = std::max(result.max_abs_logit, static_cast<double>(Real(abs(logits[t * vocab + c]))));
    }
  }
  return result;
}

TEST(ReferenceModel, ShiftedPositionsChangeADocumentsLogitsOnlyWithinRoundingInDouble) {
  const ModelConfig config = tiny_model();
  const std::vector<double> params = tiny_params(config, 34);
  const std::int32_t shift = 1000;
  const ShiftResult result = shift_positions_and_compare(config, params, shift, false);
  const double tolerance = shift_tolerance(std::numeric_limits<double>::epsilon(), result.max_position, result.max_abs_logit);
  EXPECT_TRUE(std::isfinite(result.max_difference));
  EXPECT_LE(result.max_difference, tolerance);
  std::cout << "[ shift ] double: max logit change " << result.max_difference << ", bound " << tolerance
            << " (" << 100 * result.max_difference / tolerance << " % of the bound)\n";
  // Negative control: moving one token's position breaks the relative property and must be
  // seen far above the tolerance.
  const ShiftResult broken = shift_positions_and_compare(config, params, shift, true);
  EXPECT_GT(broken.max_difference, tolerance) << "moving one position went unnoticed";
}

TEST(ReferenceModel, ShiftedPositionsChangeADocumentsLogitsOnlyWithinRoundingInFiftyDigits) {
  ModelConfig config = tiny_model();
  config.seq_length = 20;  // 50-digit arithmetic is slow; a shorter window suffices
  const std::vector<Real50> params = widen<Real50>(initial_parameters(config, 34));
  const std::int32_t shift = 1000;
  const ShiftResult result = shift_positions_and_compare(config, params, shift, false);
  const double epsilon = static_cast<double>(std::numeric_limits<Real50>::epsilon());
  const double tolerance = shift_tolerance(epsilon, result.max_position, result.max_abs_logit);
  EXPECT_LE(result.max_difference, tolerance);
  std::cout << "[ shift ] 50 digits: max logit change " << result.max_difference << ", bound "
            << tolerance << " (" << 100 * result.max_difference / tolerance << " % of the bound)\n";
}

TEST(ReferenceModel, MaskedPositionsContributeNothing) {
  const ModelConfig config = tiny_model();
  const ModelLayout layout = make_model_layout(config);
  const std::vector<double> params = tiny_params(config, 35);
  TestInputs inputs(35);
  Sample sample = make_sample(make_window(inputs, 32, kEodToken, {9, 17}), kEodToken);
  sample.loss_mask[4] = 0;
  // Changing the labels of masked positions changes neither the loss nor any gradient: exact.
  Sample relabeled = sample;
  for (std::size_t t = 0; t < relabeled.labels.size(); ++t) {
    if (relabeled.loss_mask[t] == 0) relabeled.labels[t] = (relabeled.labels[t] + 11) % kEodToken;
  }
  std::vector<double> grads(params.size(), 0.0);
  std::vector<double> relabeled_grads(params.size(), 0.0);
  const LossAndCounts<double> loss = forward_backward(config, layout, params, {sample}, 1.0, grads);
  const LossAndCounts<double> relabeled_loss = forward_backward(config, layout, params, {relabeled}, 1.0, relabeled_grads);
  EXPECT_EQ(loss.masked_loss_sum, relabeled_loss.masked_loss_sum);
  EXPECT_EQ(loss.loss_tokens, 32 - 3);
  EXPECT_EQ(0, std::memcmp(grads.data(), relabeled_grads.data(), grads.size() * sizeof(double)));
  // With every position masked the loss and all gradients are exactly zero (SPEC 5).
  Sample silent = sample;
  std::fill(silent.loss_mask.begin(), silent.loss_mask.end(), 0);
  std::vector<double> silent_grads(params.size(), 0.0);
  const LossAndCounts<double> silent_loss = forward_backward(config, layout, params, {silent}, 1.0, silent_grads);
  EXPECT_EQ(silent_loss.masked_loss_sum, 0.0);
  EXPECT_EQ(silent_loss.loss_tokens, 0);
  for (double gradient : silent_grads) ASSERT_EQ(gradient, 0.0);
}

TEST(ReferenceModel, TheLossIsTheSumOfPerPositionCrossEntropiesOfTheLogits) {
  // Exact: the same CE formula applied to forward_logits, summed in the same order, is the same
  // double computation.
  const ModelConfig config = tiny_model();
  const ModelLayout layout = make_model_layout(config);
  const std::vector<double> params = tiny_params(config, 36);
  TestInputs inputs(36);
  const Sample sample = make_sample(make_window(inputs, 32, kEodToken, {7}), kEodToken);
  const std::vector<double> logits = forward_logits(config, layout, params, sample);
  const double expected = cross_entropy_forward_backward(
      logits.data(), sample.labels.data(), sample.loss_mask.data(), config.seq_length,
      config.padded_vocab_size, 1.0, static_cast<double*>(nullptr));
  EXPECT_EQ(forward_loss(config, layout, params, {sample}).masked_loss_sum, expected);
  // Approximate (statistical): at initialization the final norm's output has RMS 1, so each
  // logit is roughly N(0, s^2) with s = init_std * sqrt(d); then CE_t = log V + O(s^2/2) - z_label
  // and the mean over n loss tokens lies within s^2/2 + 4 s / sqrt(n) of log V (4 sigmas).
  const double mean = expected / static_cast<double>(sample.loss_tokens);
  const double logit_std = config.init_method_std * std::sqrt(static_cast<double>(config.hidden_size));
  const double allowed = logit_std * logit_std / 2 +
                         4 * logit_std / std::sqrt(static_cast<double>(sample.loss_tokens));
  EXPECT_NEAR(mean, std::log(static_cast<double>(config.padded_vocab_size)), allowed);
}

TEST(ReferenceModel, AccumulatedMicrobatchesEqualTheDirectBatchExactly) {
  const ModelConfig config = tiny_model();
  const ModelLayout layout = make_model_layout(config);
  const std::vector<double> params = tiny_params(config, 37);
  TestInputs inputs(37);
  const Sample first = make_sample(make_window(inputs, 32, kEodToken, {5}), kEodToken);
  const Sample second = make_sample(make_window(inputs, 32, kEodToken, {}), kEodToken);
  const double loss_scale = 1.0 / 64;
  std::vector<double> direct(params.size(), 0.0);
  const LossAndCounts<double> direct_loss = forward_backward(config, layout, params, {first, second}, loss_scale, direct);
  std::vector<double> accumulated(params.size(), 0.0);
  const LossAndCounts<double> loss_a = forward_backward(config, layout, params, {first}, loss_scale, accumulated);
  const LossAndCounts<double> loss_b = forward_backward(config, layout, params, {second}, loss_scale, accumulated);
  EXPECT_EQ(direct_loss.masked_loss_sum, loss_a.masked_loss_sum + loss_b.masked_loss_sum);
  EXPECT_EQ(direct_loss.loss_tokens, loss_a.loss_tokens + loss_b.loss_tokens);
  EXPECT_EQ(0, std::memcmp(direct.data(), accumulated.data(), direct.size() * sizeof(double)));
}

TEST(ReferenceModel, RejectsMalformedSamplesNamingTheProblem) {
  const ModelConfig config = tiny_model();
  const ModelLayout layout = make_model_layout(config);
  const std::vector<double> params = tiny_params(config, 38);
  TestInputs inputs(38);
  Sample sample = make_sample(make_window(inputs, 32, kEodToken, {}), kEodToken);
  Sample future = sample;
  future.attention_start[3] = 4;
  EXPECT_THROW(forward_logits(config, layout, params, future), std::invalid_argument);
  Sample outside = sample;
  outside.tokens[0] = static_cast<std::int32_t>(config.padded_vocab_size);
  EXPECT_THROW(forward_logits(config, layout, params, outside), std::invalid_argument);
  std::vector<double> short_grads(params.size() - 1, 0.0);
  EXPECT_THROW(forward_backward(config, layout, params, {sample}, 1.0, short_grads), std::invalid_argument);
}

}  // namespace
}  // namespace tandem::reference
