// Our own IEEE-754 value generator (STYLE: RapidCheck's built-in float generator does not aim at
// NaN, +-Inf, subnormals or -0). Values are built from bit patterns per class, so every class is
// reached with a known weight and shrinks toward the simple classes (0, then small dyadic values).
// Used wherever an input may carry such values: AdamW element inputs, injected gradients, the
// loss/norm finite check.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <rapidcheck.h>

namespace tandem::equivalence {

// The classes an IEEE value falls in, as the comparisons check them first (STYLE: NaN/Inf and
// sign before the metric).
enum class FloatClass { nan, positive_infinity, negative_infinity, zero, subnormal, normal };

template <class Float>
FloatClass classify(Float value) {
  if (std::isnan(value)) return FloatClass::nan;
  if (std::isinf(value)) return value > 0 ? FloatClass::positive_infinity : FloatClass::negative_infinity;
  if (value == Float(0)) return FloatClass::zero;
  if (std::fpclassify(value) == FP_SUBNORMAL) return FloatClass::subnormal;
  return FloatClass::normal;
}

inline std::string to_string(FloatClass value_class) {
  switch (value_class) {
    case FloatClass::nan: return "nan";
    case FloatClass::positive_infinity: return "+inf";
    case FloatClass::negative_infinity: return "-inf";
    case FloatClass::zero: return "zero";
    case FloatClass::subnormal: return "subnormal";
    case FloatClass::normal: return "normal";
  }
  return "?";
}

namespace float_detail {

template <class Float>
using Bits = std::conditional_t<sizeof(Float) == 8, std::uint64_t, std::uint32_t>;

template <class Float>
constexpr int kMantissaBits = std::numeric_limits<Float>::digits - 1;  // 52 or 23
template <class Float>
constexpr int kExponentBits = static_cast<int>(sizeof(Float) * 8) - 1 - kMantissaBits<Float>;

template <class Float>
Float from_fields(bool negative, Bits<Float> exponent, Bits<Float> mantissa) {
  using B = Bits<Float>;
  const B sign = negative ? (B(1) << (sizeof(Float) * 8 - 1)) : B(0);
  return std::bit_cast<Float>(sign | (exponent << kMantissaBits<Float>) | mantissa);
}

template <class Float>
rc::Gen<Bits<Float>> mantissa_bits() {
  using B = Bits<Float>;
  const B mask = (B(1) << kMantissaBits<Float>) - 1;
  return rc::gen::map(rc::gen::arbitrary<B>(), [mask](B bits) { return bits & mask; });
}

}  // namespace float_detail

// How often each class is drawn (relative weights; 0 removes the class).
struct FloatClassWeights {
  std::size_t zero = 2;          // +0 and -0
  std::size_t dyadic = 6;        // k / 2^j, small k and j: exact answers are knowable
  std::size_t ordinary = 10;     // sign x [1e-4, 1e2) log-uniform-ish: typical gradients/weights
  std::size_t normal = 4;        // any normal: random sign, exponent, mantissa (incl. max finite)
  std::size_t subnormal = 3;     // smallest, largest and random subnormals, both signs
  std::size_t infinity = 2;      // +inf and -inf
  std::size_t nan = 2;           // quiet NaN, both sign bits, and a payload NaN
};

inline FloatClassWeights only_finite() {
  FloatClassWeights weights;
  weights.infinity = 0;
  weights.nan = 0;
  return weights;
}
inline FloatClassWeights only_nonfinite() {
  FloatClassWeights weights{};
  weights.zero = weights.dyadic = weights.ordinary = weights.normal = weights.subnormal = 0;
  weights.infinity = 1;
  weights.nan = 1;
  return weights;
}

// An IEEE value of type Float (float or double) drawn by class.
template <class Float>
rc::Gen<Float> ieee_value(FloatClassWeights weights = {}) {
  static_assert(std::is_same_v<Float, float> || std::is_same_v<Float, double>);
  using namespace float_detail;
  using B = Bits<Float>;
  using Limits = std::numeric_limits<Float>;
  const B max_exponent = (B(1) << kExponentBits<Float>) - 1;  // all ones: inf / nan
  const auto sign = rc::gen::arbitrary<bool>();

  const rc::Gen<Float> zero = rc::gen::element(Float(0), -Float(0));
  const rc::Gen<Float> dyadic = rc::gen::map(
      rc::gen::tuple(rc::gen::inRange(-16, 17), rc::gen::inRange(0, 11)),
      [](const std::tuple<int, int>& kj) {
        return std::ldexp(static_cast<Float>(std::get<0>(kj)), -std::get<1>(kj));
      });
  const rc::Gen<Float> ordinary = rc::gen::map(
      rc::gen::tuple(sign, rc::gen::inRange(-4, 2), rc::gen::inRange(100, 1000)),
      [](const std::tuple<bool, int, int>& t) {
        const Float magnitude = static_cast<Float>(std::get<2>(t)) / Float(100) *
                                static_cast<Float>(std::pow(10.0, std::get<1>(t)));
        return std::get<0>(t) ? -magnitude : magnitude;
      });
  const rc::Gen<Float> normal = rc::gen::oneOf(
      rc::gen::element(Limits::max(), -Limits::max(), Limits::min(), -Limits::min()),
      rc::gen::map(rc::gen::tuple(sign, rc::gen::inRange<B>(1, max_exponent), mantissa_bits<Float>()),
                   [](const std::tuple<bool, B, B>& t) {
                     return from_fields<Float>(std::get<0>(t), std::get<1>(t), std::get<2>(t));
                   }));
  const rc::Gen<Float> subnormal = rc::gen::oneOf(
      rc::gen::element(Limits::denorm_min(), -Limits::denorm_min(),
                       from_fields<Float>(false, 0, (B(1) << kMantissaBits<Float>) - 1),
                       from_fields<Float>(true, 0, (B(1) << kMantissaBits<Float>) - 1)),
      rc::gen::map(rc::gen::tuple(sign, mantissa_bits<Float>()), [](const std::tuple<bool, B>& t) {
        const B mantissa = std::get<1>(t) == 0 ? B(1) : std::get<1>(t);
        return from_fields<Float>(std::get<0>(t), 0, mantissa);
      }));
  const rc::Gen<Float> infinity = rc::gen::element(Limits::infinity(), -Limits::infinity());
  const rc::Gen<Float> nan = rc::gen::element(
      Limits::quiet_NaN(), -Limits::quiet_NaN(),
      from_fields<Float>(false, max_exponent, B(1)));  // a payload NaN (signalling pattern)

  return rc::gen::weightedOneOf<Float>({{weights.zero, zero},
                                        {weights.dyadic, dyadic},
                                        {weights.ordinary, ordinary},
                                        {weights.normal, normal},
                                        {weights.subnormal, subnormal},
                                        {weights.infinity, infinity},
                                        {weights.nan, nan}});
}

// Exact comparison of two IEEE values: the same class, the same sign (zeros included), and the
// same value; any NaN equals any NaN (the payload is not part of the contract).
template <class Float>
bool same_ieee_value(Float a, Float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

}  // namespace tandem::equivalence
