// Host twin of the GEMM (gemm.hpp). Every C element is one fp32 dot product with k increasing:
//   sum = 0; for l in 0..k-1: sum = sum + a[i][l] * b[l][j]   (each product rounded, then added)
//   value = alpha * sum (+ beta * C), rounded once into C's dtype.
// gemm_host_ordered states that order plainly, one element at a time (the cpu backend's kernel
// before it was blocked, kept as the statement and for benchmarks). gemm_host, the kernel the
// cpu backend ships, computes the same operations in the same order for every element, only
// many elements at once: both operands are widened once into packed fp32 panels, and a register
// tile of C accumulates in vector lanes (one lane per C element, so no sum is split or reordered,
// and no multiply is fused into an add: neither SSE2 nor AVX2 has FMA, and the build does not
// contract): 4 x 8 elements with the baseline's 4 lanes, 6 x 16 with AVX2's 8 when the processor
// has it (chosen at run time; the shipped build targets the x86-64 baseline). Every variant gives
// the same bits (tests/production_ops_test.cpp).
#include "production/kernels/gemm.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

void require_one_input_dtype(const GemmParams& p) {
  if (p.a.dtype != p.b.dtype) {
    throw std::invalid_argument("gemm: A and B must share a dtype (both f32 or both bf16)");
  }
}

// op(M)[r][d] as fp32, whatever M's storage (`transposed_storage`: M is stored [depth, rows]).
Real element(const GemmOperand& operand, std::int64_t rows, std::int64_t depth, bool transposed_storage,
              std::int64_t r, std::int64_t d) {
  return load_as_f32(operand.data, operand.dtype, transposed_storage ? d * rows + r : r * depth + d);
}

// C[i][j] = alpha * sum (+ beta * C[i][j]), rounded once into C's dtype.
void finish(const GemmParams& p, std::int64_t i, std::int64_t j, Real sum) {
  Real value = p.alpha * sum;
  if (p.beta != 0.0f) value += p.beta * load_as_f32(p.c, p.c_dtype, i * p.n + j);
  store_from_f32(p.c, p.c_dtype, i * p.n + j, value);
}

// Panels reused across calls (no allocation per call once they are large enough).
struct Panels {
  std::vector<Real> a;  // [m tiles][k][kTileRows]: a tile's 4 rows at step l side by side
  std::vector<Real> b;  // [n tiles][k][kTileColumns]: a tile's 8 columns at step l side by side
};
Panels& thread_panels() {
  thread_local Panels panels;
  return panels;
}

}  // namespace

void gemm_host_ordered(const GemmParams& p) {
  require_one_input_dtype(p);
  // op(A) as [m, k] and op(B)^T as [n, k], widened to fp32; then each C element one dot product.
  std::vector<Real> a(static_cast<std::size_t>(p.m * p.k));  // [m, k]
  std::vector<Real> b(static_cast<std::size_t>(p.n * p.k));  // [n, k]
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t l = 0; l < p.k; ++l) a[static_cast<std::size_t>(i * p.k + l)] = element(p.a, p.m, p.k, p.a.transpose == Transpose::yes, i, l);
  }
  for (std::int64_t j = 0; j < p.n; ++j) {
    for (std::int64_t l = 0; l < p.k; ++l) b[static_cast<std::size_t>(j * p.k + l)] = element(p.b, p.n, p.k, p.b.transpose == Transpose::no, j, l);
  }
  for (std::int64_t i = 0; i < p.m; ++i) {
    const Real* a_row = a.data() + i * p.k;  // [k]
    for (std::int64_t j = 0; j < p.n; ++j) {
      const Real* b_row = b.data() + j * p.k;  // [k]
      Real sum = 0.0f;
      for (std::int64_t l = 0; l < p.k; ++l) sum += a_row[l] * b_row[l];
      finish(p, i, j, sum);
    }
  }
}

namespace {

// The blocked product for `Lanes` (a GCC/Clang vector of fp32 lanes whose + and * are the lanes'
// IEEE operations) and a register tile of kRows x (kVectors x lanes) elements of C: each element
// in its own lane, its own sum, k increasing. Always inlined, so that the target the caller is
// compiled for (baseline SSE2, or AVX2 without FMA) is the one its vectors use.
template <class Lanes, std::int64_t kRows, std::int64_t kVectors>
[[gnu::always_inline]] inline void gemm_blocked(const GemmParams& p) {
  constexpr std::int64_t kLanes = sizeof(Lanes) / sizeof(Real);
  constexpr std::int64_t kColumns = kVectors * kLanes;
  const bool a_transposed = p.a.transpose == Transpose::yes;
  const bool b_plain = p.b.transpose == Transpose::no;
  const std::int64_t row_tiles = (p.m + kRows - 1) / kRows;
  const std::int64_t column_tiles = (p.n + kColumns - 1) / kColumns;
  const std::int64_t k = p.k;

  // Widen and pack once: a tile's rows (columns) at step l side by side; the padding rows and
  // columns are zeros whose results are never stored.
  Panels& panels = thread_panels();
  panels.a.assign(static_cast<std::size_t>(row_tiles * k * kRows), 0.0f);
  panels.b.assign(static_cast<std::size_t>(column_tiles * k * kColumns), 0.0f);
  for (std::int64_t i = 0; i < p.m; ++i) {
    Real* tile = panels.a.data() + (i / kRows) * k * kRows + i % kRows;
    for (std::int64_t l = 0; l < k; ++l) tile[l * kRows] = element(p.a, p.m, k, a_transposed, i, l);
  }
  for (std::int64_t j = 0; j < p.n; ++j) {
    Real* tile = panels.b.data() + (j / kColumns) * k * kColumns + j % kColumns;
    for (std::int64_t l = 0; l < k; ++l) tile[l * kColumns] = element(p.b, p.n, k, b_plain, j, l);
  }

  for (std::int64_t row_tile = 0; row_tile < row_tiles; ++row_tile) {
    const Real* a_tile = panels.a.data() + row_tile * k * kRows;  // [k][kRows]
    for (std::int64_t column_tile = 0; column_tile < column_tiles; ++column_tile) {
      const Real* b_tile = panels.b.data() + column_tile * k * kColumns;  // [k][kColumns]
      Lanes sums[kRows][kVectors] = {};  // one lane per C element of the tile, each its own sum
      for (std::int64_t l = 0; l < k; ++l) {
        Lanes b[kVectors];
#pragma GCC unroll 8
        for (std::int64_t v = 0; v < kVectors; ++v) std::memcpy(&b[v], b_tile + l * kColumns + v * kLanes, sizeof(Lanes));
        // Unrolled whole, so that the tile's sums live in registers.
#pragma GCC unroll 16
        for (std::int64_t r = 0; r < kRows; ++r) {
          const Lanes a_lanes = a_tile[l * kRows + r] - Lanes{};  // the scalar in every lane
          // sum + (a x b): the product rounded, then the add (no FMA: the targets have none).
#pragma GCC unroll 8
          for (std::int64_t v = 0; v < kVectors; ++v) sums[r][v] += a_lanes * b[v];
        }
      }
      for (std::int64_t r = 0; r < kRows; ++r) {
        const std::int64_t i = row_tile * kRows + r;
        if (i >= p.m) break;
        for (std::int64_t c = 0; c < kColumns; ++c) {
          const std::int64_t j = column_tile * kColumns + c;
          if (j >= p.n) break;
          finish(p, i, j, sums[r][c / kLanes][c % kLanes]);
        }
      }
    }
  }
}

using Lanes4 = Real __attribute__((vector_size(16)));  // SSE2 / NEON: 4 fp32 (2 fp64) lanes

void gemm_baseline(const GemmParams& p) { gemm_blocked<Lanes4, 4, 2>(p); }  // 4 x 8 tile

#if defined(__x86_64__)
using Lanes8 = Real __attribute__((vector_size(32)));
// AVX2 without FMA (the target has no fused multiply-add to contract into): 8 fp32 lanes, 6 x 16 tile.
[[gnu::target("avx2")]] void gemm_avx2(const GemmParams& p) { gemm_blocked<Lanes8, 6, 2>(p); }
bool avx2_answers() { return __builtin_cpu_supports("avx2"); }
#else
void gemm_avx2(const GemmParams& p) { gemm_baseline(p); }
bool avx2_answers() { return false; }
#endif

}  // namespace

bool host_gemm_has(HostSimd simd) { return simd == HostSimd::baseline || avx2_answers(); }

void gemm_host_with(const GemmParams& p, HostSimd simd) {
  require_one_input_dtype(p);
  if (p.m <= 0 || p.n <= 0) return;
  if (!host_gemm_has(simd)) throw std::invalid_argument("gemm_host_with: this processor has no AVX2");
  simd == HostSimd::avx2 ? gemm_avx2(p) : gemm_baseline(p);
}

void gemm_host(const GemmParams& p) {
  static const HostSimd widest = avx2_answers() ? HostSimd::avx2 : HostSimd::baseline;
  gemm_host_with(p, widest);
}

}  // namespace tandem::production
