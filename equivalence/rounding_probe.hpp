// A scalar type that runs the reference's own templates (reference/model_impl.hpp) in double and
// carries, beside each value, kRoundingProbes random first-order rounding perturbations: every
// arithmetic operation and library function adds `result x delta_k` to probe k, the delta_k
// drawn N(0, 1) per operation and probe, and the perturbations already carried propagate through
// the operation's derivative at the double value. Probe k is therefore a linearized run of the
// computation with rounding errors delta_k u (one draw of Gaussian rounding errors), and the
// spread of the probes over k estimates sigma = u ||c||, where c_j is how much rounding j moves the
// result (error = sum_j c_j delta_j). equivalence/statistical_bounds.hpp turns that estimate into a
// bound on how far two twins' values may differ; docs/EQUIVALENCE.md "Statistical bounds" derives
// it.
//
// The draws are a function of the operation, its operands' values and the seed: a twin's
// arithmetic is deterministic, so the same operation on the same operands rounds the same way
// wherever it recurs (a loss scale, a RoPE table or 1/sqrt(hd) recomputed per sample, a repeated
// token's products), and those roundings add up coherently; independent draws would treat them as
// independent and understate their sum.
//
// Probes are in units of u (the caller's; statistical_bounds.cpp takes sqrt(u_test^2 + u_ref^2)),
// so a probe is about as large as its value times the computation's amplification; held in float:
// they estimate a spread, 3 digits are plenty.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <utility>

namespace tandem::equivalence {

inline constexpr int kRoundingProbes = 32;
static_assert(kRoundingProbes % 8 == 0, "the sign flips go 8 lanes at a time");

// What one rounding is, for the run in progress on this thread (RoundingProbeScope installs it).
struct RoundingModel {
  // Each operation's rounding adds result x N(0, 1) x this weight to every probe, in probe units.
  // Arithmetic and sqrt (correctly rounded): 1; library functions (exp, log, pow, sin, cos;
  // glibc's float ones and CUDA's expf/logf err by at most 1 and 2 ulp): 2.
  float arithmetic_weight = 1;
  float function_weight = 2;
  // The loss sums' roundings relative to arithmetic_weight (reference::add_to_loss_sum): the
  // twins add their row losses in double, u_double / u of a probe unit for an fp32 twin.
  float loss_sum_weight = 1;
  // A double constant that the modeled arithmetic cannot hold (fp32: 1e-5, 1/T) is rounded once
  // when it enters; one that it holds (every teacher-forced fp32 weight) is exact.
  bool constants_round_to_fp32 = false;
  std::uint64_t seed = 0;  // the draws' stream: the same seed gives the same probes
};

namespace rounding_probe_detail {

inline constexpr int kTableRows = 4096;

// kTableRows x kRoundingProbes standard normal draws (std::normal_distribution over a fixed
// mt19937_64 seed), built once. An operation's draws are one row with an independent random sign
// on every entry: each draw is N(0, 1), the signs are independent across operations and probes,
// so two operations' perturbations are uncorrelated even when they share a row (1 in 4096).
const float* normal_table();
// The 256 sign patterns of 8 lanes: pattern b's lane j is -1 where bit j of b is set, else +1
// (an operation's 32 signs are 4 patterns, so the flips vectorize).
const float* sign_patterns();

struct Stream {
  RoundingModel model;
  const float* table = nullptr;
  const float* signs = nullptr;
  bool active = false;
};

// What an operation is, for its draw: the same kind on the same operands draws the same.
enum class Operation : std::uint64_t { constant = 1, add, subtract, multiply, divide, sqrt, exp, log, sin, cos, pow };
inline thread_local Stream stream;

// splitmix64's finalizer (Steele, Lea, Flood 2014): a 64-bit mix.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The 64 random bits of `operation` on operands a and b (b = 0 for one operand) under `seed`;
// addition and multiplication commute, so their operands are keyed in either order alike.
inline std::uint64_t draw_bits(std::uint64_t seed, Operation operation, double a, double b) {
  auto ka = std::bit_cast<std::uint64_t>(a);
  auto kb = std::bit_cast<std::uint64_t>(b);
  if ((operation == Operation::add || operation == Operation::multiply) && kb < ka) std::swap(ka, kb);
  const std::uint64_t key = seed ^ (static_cast<std::uint64_t>(operation) * 0xd1b54a32d192ed03ULL) ^
                            (ka * 0x9e3779b97f4a7c15ULL) ^ std::rotl(kb * 0xc2b2ae3d27d4eb4fULL, 31);
  return splitmix64(key);
}

}  // namespace rounding_probe_detail

class Probed {
 public:
  using Probes = std::array<float, kRoundingProbes>;

  Probed() = default;
  // A constant: exact when the modeled arithmetic holds it, rounded once otherwise.
  Probed(double value) : value_(value) {  // NOLINT(google-explicit-constructor): Real(1.5)
    const rounding_probe_detail::Stream& s = rounding_probe_detail::stream;
    if (s.active && s.model.constants_round_to_fp32 &&
        static_cast<double>(static_cast<float>(value)) != value) {
      round(s.model.arithmetic_weight, rounding_probe_detail::Operation::constant, value, 0.0);
    }
  }
  template <std::integral Integer>
  Probed(Integer value) : value_(static_cast<double>(value)) {}  // NOLINT: small integers, exact

  // A value with given probes (tests).
  static Probed with_probes(double value, const Probes& probes) {
    Probed p(value);
    p.probes_ = probes;
    return p;
  }

  double value() const { return value_; }
  const Probes& probes() const { return probes_; }

  // The probes' root mean square: the estimate of this value's rounding spread, in probe units.
  double spread() const {
    double sum = 0;
    for (const float t : probes_) sum += static_cast<double>(t) * static_cast<double>(t);
    return std::sqrt(sum / kRoundingProbes);
  }

  Probed operator-() const {
    Probed r = *this;
    r.value_ = -value_;
    for (float& t : r.probes_) t = -t;
    return r;
  }
  Probed& operator+=(const Probed& b) { return *this = *this + b; }
  Probed& operator-=(const Probed& b) { return *this = *this - b; }
  Probed& operator*=(const Probed& b) { return *this = *this * b; }
  Probed& operator/=(const Probed& b) { return *this = *this / b; }

  friend Probed operator+(const Probed& a, const Probed& b) {
    return combine(Operation::add, a.value_ + b.value_, a, 1.0, b, 1.0, arithmetic());
  }
  friend Probed operator-(const Probed& a, const Probed& b) {
    return combine(Operation::subtract, a.value_ - b.value_, a, 1.0, b, -1.0, arithmetic());
  }
  friend Probed operator*(const Probed& a, const Probed& b) {
    return combine(Operation::multiply, a.value_ * b.value_, a, b.value_, b, a.value_, arithmetic());
  }
  friend Probed operator/(const Probed& a, const Probed& b) {
    const double q = a.value_ / b.value_;
    return combine(Operation::divide, q, a, 1.0 / b.value_, b, -q / b.value_, arithmetic());
  }
  friend bool operator<(const Probed& a, const Probed& b) { return a.value_ < b.value_; }
  friend bool operator>(const Probed& a, const Probed& b) { return a.value_ > b.value_; }
  friend bool operator<=(const Probed& a, const Probed& b) { return a.value_ <= b.value_; }
  friend bool operator>=(const Probed& a, const Probed& b) { return a.value_ >= b.value_; }
  // Equal values with equal perturbations: a value that is exactly 0 in double but perturbed by
  // the roundings before it is not "exactly zero" (reference/model_ops' linear_backward skips an
  // upstream gradient == 0 as adding nothing; a twin whose roundings leave it at 1e-22 does not).
  friend bool operator==(const Probed& a, const Probed& b) {
    return a.value_ == b.value_ && a.probes_ == b.probes_;
  }

  // reference::add_to_loss_sum for the probe (found by argument-dependent lookup): the sum's
  // rounding at RoundingModel::loss_sum_weight.
  friend void add_to_loss_sum(Probed& sum, const Probed& part) {
    sum = combine(Operation::add, sum.value_ + part.value_, sum, 1.0, part, 1.0,
                  arithmetic() * rounding_probe_detail::stream.model.loss_sum_weight);
  }

  // reference::attention_expected_grad for the probe: D_t as production forms it, dctx_t .
  // context_t, with context_t recomputed in the forward's order (the same operations on the same
  // operands draw the same roundings, so it carries the forward's). The two formulas agree in exact
  // arithmetic but not in their roundings: where D_t cancels against dp_ts (a span of equal values),
  // only the context's roundings are left (found by the soak: a query gradient 14 of the reference
  // formula's spreads off).
  friend Probed attention_expected_grad(const Probed* probabilities, const Probed* /*probability_grads*/,
                                        std::int64_t first, std::int64_t last, const Probed* context_grad,
                                        const Probed* values, std::int64_t value_stride, std::int64_t head_dim) {
    Probed expected = 0;
    for (std::int64_t i = 0; i < head_dim; ++i) {
      Probed context = 0;
      for (std::int64_t s = first; s <= last; ++s) context += probabilities[s] * values[s * value_stride + i];
      expected += context_grad[i] * context;
    }
    return expected;
  }

  // The functions reference/model_ops_impl.hpp calls, found by argument-dependent lookup.
  friend Probed sqrt(const Probed& a) {
    const double r = std::sqrt(a.value_);
    return unary(Operation::sqrt, r, a, r > 0 ? 0.5 / r : 0.0, arithmetic());
  }
  friend Probed exp(const Probed& a) {
    const double r = std::exp(a.value_);
    return unary(Operation::exp, r, a, r, function());
  }
  friend Probed log(const Probed& a) {
    return unary(Operation::log, std::log(a.value_), a, 1.0 / a.value_, function());
  }
  friend Probed sin(const Probed& a) {
    return unary(Operation::sin, std::sin(a.value_), a, std::cos(a.value_), function());
  }
  friend Probed cos(const Probed& a) {
    return unary(Operation::cos, std::cos(a.value_), a, -std::sin(a.value_), function());
  }
  friend Probed pow(const Probed& base, const Probed& exponent) {
    const double r = std::pow(base.value_, exponent.value_);
    return combine(Operation::pow, r, base, exponent.value_ * r / base.value_, exponent,
                   r * std::log(base.value_), function());
  }

 private:
  using Operation = rounding_probe_detail::Operation;

  static float arithmetic() {
    const rounding_probe_detail::Stream& s = rounding_probe_detail::stream;
    return s.active ? s.model.arithmetic_weight : 0.0F;
  }
  static float function() {
    const rounding_probe_detail::Stream& s = rounding_probe_detail::stream;
    return s.active ? s.model.function_weight : 0.0F;
  }

  // result = f(a, b): the probes carried by a and b through f's partial derivatives da, db, plus
  // f's own rounding.
  static Probed combine(Operation operation, double result, const Probed& a, double da, const Probed& b, double db,
                        float weight) {
    Probed r;
    r.value_ = result;
    const auto fa = static_cast<float>(da);
    const auto fb = static_cast<float>(db);
    for (int k = 0; k < kRoundingProbes; ++k) r.probes_[k] = fa * a.probes_[k] + fb * b.probes_[k];
    r.round(weight, operation, a.value_, b.value_);
    return r;
  }
  static Probed unary(Operation operation, double result, const Probed& a, double da, float weight) {
    Probed r;
    r.value_ = result;
    const auto fa = static_cast<float>(da);
    for (int k = 0; k < kRoundingProbes; ++k) r.probes_[k] = fa * a.probes_[k];
    r.round(weight, operation, a.value_, 0.0);
    return r;
  }

  // This value's own rounding by `operation` on operands a, b: value x weight x N(0, 1) on every
  // probe.
  void round(float weight, Operation operation, double a, double b) {
    if (weight == 0.0F || value_ == 0.0) return;
    const rounding_probe_detail::Stream& s = rounding_probe_detail::stream;
    const std::uint64_t draw = rounding_probe_detail::draw_bits(s.model.seed, operation, a, b);
    const float* row = s.table + (draw % rounding_probe_detail::kTableRows) * kRoundingProbes;
    const auto scale = static_cast<float>(value_) * weight;
    for (int lanes = 0; lanes < kRoundingProbes; lanes += 8) {
      const float* sign = s.signs + ((draw >> (32 + lanes)) & 0xffU) * 8;  // bits 32..63 of the draw
      for (int j = 0; j < 8; ++j) probes_[lanes + j] += scale * row[lanes + j] * sign[j];
    }
  }

  double value_ = 0;
  alignas(32) Probes probes_{};  // in RoundingModel units; zero for an exact value
};

// Installs `model` on this thread for its lifetime (the previous one is restored after).
class RoundingProbeScope {
 public:
  explicit RoundingProbeScope(const RoundingModel& model);
  ~RoundingProbeScope();
  RoundingProbeScope(const RoundingProbeScope&) = delete;
  RoundingProbeScope& operator=(const RoundingProbeScope&) = delete;

 private:
  rounding_probe_detail::Stream previous_;
};

// Within a RoundingProbeScope: the roundings of a stretch of the computation done in another
// arithmetic (a sum the twins take in double), `relative` times the model's weights, for this
// object's lifetime.
class RoundingWeightScope {
 public:
  explicit RoundingWeightScope(float relative);
  ~RoundingWeightScope();
  RoundingWeightScope(const RoundingWeightScope&) = delete;
  RoundingWeightScope& operator=(const RoundingWeightScope&) = delete;

 private:
  float arithmetic_ = 0;
  float function_ = 0;
};

}  // namespace tandem::equivalence
