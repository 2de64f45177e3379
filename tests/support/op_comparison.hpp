// The comparisons the CUDA op tests make between a CUDA twin and its host twin (exact, approximate
// within a derived bound, with the diagnosis of the worst element), and the inputs they draw.
// Shared by tests/production_cuda_ops_test.cpp (the cuda backend on a device) and
// tests/cuda_sim/cuda_sim_kernels_test.cpp (the same kernels on cuda-sim): each includes it into
// the production namespace it is compiled for.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC::op_comparison {

constexpr double kU = 0x1p-24;      // fp32 unit roundoff
constexpr double kUBf16 = 0x1p-8;   // bf16 unit roundoff
constexpr std::uint32_t kSeed = 20261130;  // every generator below; printed on failure

// A compute-typed array on the host: bytes of f32 or bf16 values.
struct HostArray {
  DType dtype = DType::f32;
  std::vector<std::uint8_t> bytes;
  HostArray() = default;
  HostArray(DType type, std::int64_t count)
      : dtype(type), bytes(static_cast<std::size_t>(count * dtype_bytes(type))) {}
  HostArray(DType type, const std::vector<float>& values) : HostArray(type, static_cast<std::int64_t>(values.size())) {
    for (std::size_t i = 0; i < values.size(); ++i) store_from_f32(data(), dtype, static_cast<std::int64_t>(i), values[i]);
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::int64_t size() const { return static_cast<std::int64_t>(bytes.size()) / dtype_bytes(dtype); }
  float at(std::int64_t i) const { return load_as_f32(data(), dtype, i); }
  std::vector<float> values() const {
    std::vector<float> out(static_cast<std::size_t>(size()));
    for (std::int64_t i = 0; i < size(); ++i) out[static_cast<std::size_t>(i)] = at(i);
    return out;
  }
};

// Dyadic values k * 2^-shift with |k| <= range: products and short sums of them are exact.
inline std::vector<float> dyadic(std::mt19937& generator, std::int64_t count, int range, int shift) {
  std::uniform_int_distribution<int> integer(-range, range);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = std::ldexp(static_cast<float>(integer(generator)), -shift);
  return values;
}

inline std::vector<float> uniform(std::mt19937& generator, std::int64_t count, float low, float high) {
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = distribution(generator);
  return values;
}

// The verdict of a comparison, with the diagnosis of the worst element.
struct Verdict {
  bool ok = true;
  std::string report;
};

// exact: the same bits (NaN payloads included).
inline Verdict compare_bits(const std::string& name, const std::vector<std::uint8_t>& host, const std::vector<std::uint8_t>& cuda,
                     int element_bytes) {
  if (host.size() != cuda.size()) return {false, name + ": sizes differ"};
  for (std::size_t i = 0; i < host.size(); i += static_cast<std::size_t>(element_bytes)) {
    if (std::memcmp(host.data() + i, cuda.data() + i, static_cast<std::size_t>(element_bytes)) != 0) {
      std::uint64_t h = 0, c = 0;  // elements of up to 8 bytes (the squared norm's doubles)
      std::memcpy(&h, host.data() + i, static_cast<std::size_t>(element_bytes));
      std::memcpy(&c, cuda.data() + i, static_cast<std::size_t>(element_bytes));
      std::ostringstream text;
      text << name << " (exact): element " << i / static_cast<std::size_t>(element_bytes) << " host bits 0x" << std::hex
           << h << " cuda bits 0x" << c << " (seed " << std::dec << kSeed << ")";
      return {false, text.str()};
    }
  }
  return {};
}

template <class T>
std::vector<std::uint8_t> as_bytes(const std::vector<T>& values) {
  std::vector<std::uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// approximate: NaN/Inf first, then |cuda - host| <= bound(i) for every i; reports the worst
// element as a % of its bound.
inline Verdict compare_within(const std::string& name, const std::vector<float>& host, const std::vector<float>& cuda,
                       const std::function<double(std::size_t)>& bound) {
  if (host.size() != cuda.size()) return {false, name + ": sizes differ"};
  double worst_ratio = 0.0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (std::isfinite(host[i]) != std::isfinite(cuda[i]) || std::isnan(host[i]) != std::isnan(cuda[i])) {
      std::ostringstream text;
      text << name << ": element " << i << " host " << host[i] << " cuda " << cuda[i] << " (not both finite)";
      return {false, text.str()};
    }
    if (!std::isfinite(host[i])) continue;
    const double error = std::fabs(static_cast<double>(cuda[i]) - static_cast<double>(host[i]));
    const double limit = bound(i);
    const double ratio = limit > 0 ? error / limit : (error > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst_ratio <= 1.0) return {};
  std::ostringstream text;
  text.precision(9);
  text << name << " (approximate): element " << worst << " host " << host[worst] << " cuda " << cuda[worst]
       << " error " << std::fabs(static_cast<double>(cuda[worst]) - host[worst]) << " bound " << bound(worst) << " = "
       << 100.0 * worst_ratio << "% of the bound (seed " << kSeed << ")";
  return {false, text.str()};
}

// One bf16 ulp of straddle when the output is stored as bf16.
inline double store_slack(DType dtype, float host_value) {
  return dtype == DType::bf16 ? 2.0 * kUBf16 * std::fabs(static_cast<double>(host_value)) : 0.0;
}

}  // namespace tandem::production::op_comparison
