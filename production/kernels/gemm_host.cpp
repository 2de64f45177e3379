// Host twin of the GEMM (gemm.hpp). Every C element is one fp32 dot product with k increasing:
//   sum = 0; for l in 0..k-1: sum = sum + a[i][l] * b[l][j]   (each product rounded, then added)
//   value = alpha * sum (+ beta * C), rounded once into C's dtype.
// gemm_host_ordered states that order plainly, one element at a time (the cpu backend's kernel
// before it was blocked, kept as the statement and for benchmarks). gemm_host, the kernel the
// cpu backend ships, computes the same operations in the same order for every element, only
// many elements at once: both operands are widened once into packed fp32 panels, and a register
// tile of C accumulates in vector lanes (one lane per C element, so no sum is split or reordered,
// and no multiply is fused into an add: no target below enables FMA, and the build does not
// contract): 4 x 8 elements with the baseline's 4 lanes, 6 x 16 with AVX2's 8, 8 x 32 with
// AVX-512F's 16, the widest the processor has chosen at run time (the shipped build targets the
// x86-64 baseline). The tiles of one product may be split among the backend's worker threads
// (host_workers.hpp): a tile is computed whole by one thread, so the thread count changes no bit.
// Every variant gives the same bits (tests/production_ops_test.cpp).
#include "production/kernels/gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "production/kernels/host_workers.hpp"

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
// in its own lane, its own sum, k increasing. Everything a tile does, from packing to the store,
// is inlined into the one function compiled for the caller's target (baseline SSE2, AVX2 or
// AVX-512F, never FMA): no call leaves the target region inside a loop (on Intel a call from
// AVX code into SSE code pays a state transition each time).
// GCC warns (-Wpsabi) that a function returning a 32- or 64-byte vector has another ABI without
// AVX: these are internal and always inlined into one target's code, so no call crosses an ABI
// (for the rest of this file: GCC reports template instantiations at its end).
#pragma GCC diagnostic ignored "-Wpsabi"
template <class Lanes>
inline constexpr std::int64_t kLanesOf = static_cast<std::int64_t>(sizeof(Lanes) / sizeof(Real));

template <class Lanes>
[[gnu::always_inline]] inline Lanes load_lanes(const Real* values) {
  Lanes lanes;
  std::memcpy(&lanes, values, sizeof(Lanes));
  return lanes;
}
template <class Lanes>
[[gnu::always_inline]] inline void store_lanes(Real* values, Lanes lanes) {
  std::memcpy(values, &lanes, sizeof(Lanes));
}
template <class Lanes>
[[gnu::always_inline]] inline Lanes splat(Real value) {
  return value - Lanes{};  // the scalar in every lane (-0 stays -0)
}

// Widens panels [first, last) of op(M) ([rows, depth]; `transposed_storage`: M is stored
// [depth, rows]), each of kWidth rows: panel t holds rows t*kWidth.. at each step d side by side
// ([depth][kWidth]); the padding rows are zeros (their results are never stored). Panels are
// independent, so threads may pack different ones.
template <std::int64_t kWidth, class Element>
[[gnu::always_inline]] inline void pack_panels(const Element* data, std::int64_t rows, std::int64_t depth,
                                               bool transposed_storage, Real* panels, std::int64_t first,
                                               std::int64_t last) {
  const auto widen = [](Element value) {
    if constexpr (std::is_same_v<Element, Bf16>) {
      return static_cast<Real>(f32_from_bf16(value));
    } else {
      return value;
    }
  };
  for (std::int64_t t = first; t < last; ++t) {
    Real* panel = panels + t * depth * kWidth;
    const std::int64_t r0 = t * kWidth;
    const std::int64_t width = std::min(kWidth, rows - r0);
    if (transposed_storage) {  // a panel's rows at step d are contiguous in M
      for (std::int64_t d = 0; d < depth; ++d) {
        const Element* row = data + d * rows + r0;
        Real* out = panel + d * kWidth;
        for (std::int64_t r = 0; r < width; ++r) out[r] = widen(row[r]);
        for (std::int64_t r = width; r < kWidth; ++r) out[r] = 0.0f;
      }
    } else {
      for (std::int64_t r = 0; r < width; ++r) {
        const Element* row = data + (r0 + r) * depth;
        for (std::int64_t d = 0; d < depth; ++d) panel[d * kWidth + r] = widen(row[d]);
      }
      if (width < kWidth) {
        for (std::int64_t d = 0; d < depth; ++d) {
          for (std::int64_t r = width; r < kWidth; ++r) panel[d * kWidth + r] = 0.0f;
        }
      }
    }
  }
}

template <std::int64_t kWidth>
[[gnu::always_inline]] inline void pack_operand(const GemmOperand& operand, std::int64_t rows, std::int64_t depth,
                                                bool transposed_storage, Real* panels, std::int64_t first,
                                                std::int64_t last) {
  if (operand.dtype == DType::f32) {
    pack_panels<kWidth>(static_cast<const Real*>(operand.data), rows, depth, transposed_storage, panels, first, last);
  } else {
    pack_panels<kWidth>(static_cast<const Bf16*>(operand.data), rows, depth, transposed_storage, panels, first, last);
  }
}

// C[i][j] = alpha * sum (+ beta * C[i][j]), rounded once into C's dtype: finish() inlined.
[[gnu::always_inline]] inline void finish_inline(const GemmParams& p, std::int64_t i, std::int64_t j, Real sum) {
  Real value = p.alpha * sum;
  if (p.beta != 0.0f) value += p.beta * load_as_f32(p.c, p.c_dtype, i * p.n + j);
  store_from_f32(p.c, p.c_dtype, i * p.n + j, value);
}

// A product's panels and tiles: the panels of op(A) (kRows rows a panel) and of op(B)^T
// (kColumns columns a panel), and how many tiles of C there are.
struct TileJob {
  const GemmParams* p = nullptr;
  Real* a_panels = nullptr;  // [row tiles][k][kRows]
  Real* b_panels = nullptr;  // [column tiles][k][kColumns]
  std::int64_t row_tiles = 0;
  std::int64_t column_tiles = 0;
};

// The job with room for its panels (the calling thread's buffers), not yet packed.
template <std::int64_t kRows, std::int64_t kColumns>
TileJob prepare(const GemmParams& p) {
  Panels& panels = thread_panels();
  TileJob job{&p, nullptr, nullptr, (p.m + kRows - 1) / kRows, (p.n + kColumns - 1) / kColumns};
  panels.a.resize(static_cast<std::size_t>(job.row_tiles * p.k * kRows));  // pack() writes every element
  panels.b.resize(static_cast<std::size_t>(job.column_tiles * p.k * kColumns));
  job.a_panels = panels.a.data();
  job.b_panels = panels.b.data();
  return job;
}

// Packs the panels that start in units [begin, end) of the job's row_tiles * kRows +
// column_tiles * kColumns: op(A)'s rows (kRows a panel), then op(B)^T's (kColumns a panel). Counting rows, not panels, splits the work evenly
// among threads when a B panel is wider than an A panel; each panel is still packed whole by one.
template <std::int64_t kRows, std::int64_t kColumns>
void pack(const TileJob& job, std::int64_t begin, std::int64_t end) {
  const GemmParams& p = *job.p;
  const std::int64_t a_units = job.row_tiles * kRows;
  const auto first_panel_at = [](std::int64_t unit, std::int64_t width) { return (unit + width - 1) / width; };
  const std::int64_t a_first = first_panel_at(std::min(begin, a_units), kRows);
  const std::int64_t a_last = first_panel_at(std::min(end, a_units), kRows);
  if (a_first < a_last) {
    pack_operand<kRows>(p.a, p.m, p.k, p.a.transpose == Transpose::yes, job.a_panels, a_first, a_last);
  }
  const std::int64_t b_first = first_panel_at(std::max(begin - a_units, std::int64_t{0}), kColumns);
  const std::int64_t b_last = first_panel_at(std::max(end - a_units, std::int64_t{0}), kColumns);
  if (b_first < b_last) {
    pack_operand<kColumns>(p.b, p.n, p.k, p.b.transpose == Transpose::no, job.b_panels, b_first, b_last);
  }
}

// Tiles [begin, end) of C in row-major tile order, each whole: its sums, then its store.
template <class Lanes, std::int64_t kRows, std::int64_t kVectors>
[[gnu::always_inline]] inline void run_tiles(const TileJob& job, std::int64_t begin, std::int64_t end) {
  constexpr std::int64_t kLanes = kLanesOf<Lanes>;
  constexpr std::int64_t kColumns = kVectors * kLanes;
  const GemmParams& p = *job.p;
  const std::int64_t k = p.k;
  for (std::int64_t tile = begin; tile < end; ++tile) {
    const std::int64_t row_tile = tile / job.column_tiles;
    const std::int64_t column_tile = tile % job.column_tiles;
    const Real* a_tile = job.a_panels + row_tile * k * kRows;        // [k][kRows]
    const Real* b_tile = job.b_panels + column_tile * k * kColumns;  // [k][kColumns]
    Lanes sums[kRows][kVectors] = {};  // one lane per C element of the tile, each its own sum
    for (std::int64_t l = 0; l < k; ++l) {
      Lanes b[kVectors];
#pragma GCC unroll 8
      for (std::int64_t v = 0; v < kVectors; ++v) b[v] = load_lanes<Lanes>(b_tile + l * kColumns + v * kLanes);
      // Unrolled whole, so that the tile's sums live in registers.
#pragma GCC unroll 16
      for (std::int64_t r = 0; r < kRows; ++r) {
        const Lanes a_lanes = splat<Lanes>(a_tile[l * kRows + r]);
        // sum + (a x b): the product rounded, then the add (no FMA: no target here has it).
#pragma GCC unroll 8
        for (std::int64_t v = 0; v < kVectors; ++v) sums[r][v] += a_lanes * b[v];
      }
    }
    const std::int64_t i0 = row_tile * kRows;
    const std::int64_t j0 = column_tile * kColumns;
    if (p.c_dtype == DType::f32 && i0 + kRows <= p.m && j0 + kColumns <= p.n) {
      // A whole fp32 tile: alpha * sum (+ beta * C) in the lanes, the same two IEEE operations.
      Real* c = static_cast<Real*>(p.c) + i0 * p.n + j0;
      const Lanes alpha = splat<Lanes>(p.alpha);
      if (p.beta == 0.0f) {
#pragma GCC unroll 16
        for (std::int64_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
          for (std::int64_t v = 0; v < kVectors; ++v) store_lanes(c + r * p.n + v * kLanes, alpha * sums[r][v]);
        }
      } else {
        const Lanes beta = splat<Lanes>(p.beta);
#pragma GCC unroll 16
        for (std::int64_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
          for (std::int64_t v = 0; v < kVectors; ++v) {
            Real* at = c + r * p.n + v * kLanes;
            store_lanes(at, alpha * sums[r][v] + beta * load_lanes<Lanes>(at));
          }
        }
      }
      continue;
    }
    for (std::int64_t r = 0; r < kRows && i0 + r < p.m; ++r) {
      for (std::int64_t c = 0; c < kColumns && j0 + c < p.n; ++c) {
        finish_inline(p, i0 + r, j0 + c, sums[r][c / kLanes][c % kLanes]);
      }
    }
  }
}

// One vector path: its tile shape and its tile loop, compiled for its target.
struct Kernel {
  std::int64_t rows = 0;
  std::int64_t columns = 0;
  TileJob (*prepare)(const GemmParams&) = nullptr;
  void (*pack)(const TileJob&, std::int64_t, std::int64_t) = nullptr;
  void (*tiles)(const TileJob&, std::int64_t, std::int64_t) = nullptr;
};

using Lanes4 = Real __attribute__((vector_size(16)));  // SSE2 / NEON: 4 fp32 (2 fp64) lanes
void baseline_tiles(const TileJob& job, std::int64_t begin, std::int64_t end) {
  run_tiles<Lanes4, 4, 2>(job, begin, end);  // 4 x 8 tile
}
constexpr Kernel kBaseline{4, 2 * kLanesOf<Lanes4>, prepare<4, 2 * kLanesOf<Lanes4>>,
                           pack<4, 2 * kLanesOf<Lanes4>>, baseline_tiles};

#if defined(__x86_64__)
using Lanes8 = Real __attribute__((vector_size(32)));
using Lanes16 = Real __attribute__((vector_size(64)));
// AVX2 without FMA (the semantics rounds each product): 8 fp32 lanes, a 6 x 16 tile in 12 of the
// 16 ymm registers.
[[gnu::target("avx2")]] void avx2_tiles(const TileJob& job, std::int64_t begin, std::int64_t end) {
  run_tiles<Lanes8, 6, 2>(job, begin, end);
}
// AVX-512F without FMA: 16 fp32 lanes, an 8 x 32 tile in 16 of the 32 zmm registers.
[[gnu::target("avx512f")]] void avx512_tiles(const TileJob& job, std::int64_t begin, std::int64_t end) {
  run_tiles<Lanes16, 8, 2>(job, begin, end);
}
constexpr Kernel kAvx2{6, 2 * kLanesOf<Lanes8>, prepare<6, 2 * kLanesOf<Lanes8>>,
                       pack<6, 2 * kLanesOf<Lanes8>>, avx2_tiles};
constexpr Kernel kAvx512{8, 2 * kLanesOf<Lanes16>, prepare<8, 2 * kLanesOf<Lanes16>>,
                         pack<8, 2 * kLanesOf<Lanes16>>, avx512_tiles};
bool cpu_has(HostSimd simd) {
  switch (simd) {
    case HostSimd::baseline: return true;
    case HostSimd::avx2: return __builtin_cpu_supports("avx2");
    case HostSimd::avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}
#else
constexpr Kernel kAvx2 = kBaseline;
constexpr Kernel kAvx512 = kBaseline;
bool cpu_has(HostSimd simd) { return simd == HostSimd::baseline; }
#endif

const Kernel& kernel_for(HostSimd simd) {
  return simd == HostSimd::avx512 ? kAvx512 : simd == HostSimd::avx2 ? kAvx2 : kBaseline;
}

// The widest path the processor has, or the one TANDEM_HOST_SIMD names (baseline, avx2, avx512:
// for tests and benchmarks that compare paths end to end); read once.
HostSimd chosen_simd() {
  static const HostSimd chosen = [] {
    if (const char* named = std::getenv("TANDEM_HOST_SIMD"); named != nullptr && *named != '\0') {
      const std::string name = named;
      for (const HostSimd simd : kHostSimds) {
        if (name != host_simd_name(simd)) continue;
        if (!cpu_has(simd)) {
          throw std::invalid_argument("TANDEM_HOST_SIMD=" + name + ": this processor has no " + name +
                                      "; use baseline" + (cpu_has(HostSimd::avx2) ? " or avx2" : "") +
                                      ", or unset it to take the widest");
        }
        return simd;
      }
      throw std::invalid_argument("TANDEM_HOST_SIMD=" + name + ": not a vector path; use baseline, avx2 or avx512, " +
                                  "or unset it to take the widest the processor has");
    }
    return cpu_has(HostSimd::avx512) ? HostSimd::avx512 : cpu_has(HostSimd::avx2) ? HostSimd::avx2 : HostSimd::baseline;
  }();
  return chosen;
}

}  // namespace

const char* host_simd_name(HostSimd simd) {
  switch (simd) {
    case HostSimd::baseline: return "baseline";
    case HostSimd::avx2: return "avx2";
    case HostSimd::avx512: return "avx512";
  }
  return "unknown";
}

HostSimd host_simd() { return chosen_simd(); }

bool host_gemm_has(HostSimd simd) { return cpu_has(simd); }

void gemm_host_with(const GemmParams& p, HostSimd simd, HostWorkers* workers) {
  require_one_input_dtype(p);
  if (p.m <= 0 || p.n <= 0) return;
  if (!host_gemm_has(simd)) {
    throw std::invalid_argument(std::string("gemm_host_with: this processor has no ") + host_simd_name(simd));
  }
  const Kernel& kernel = kernel_for(simd);
  const TileJob job = kernel.prepare(p);
  const std::int64_t pack_units = job.row_tiles * kernel.rows + job.column_tiles * kernel.columns;
  const std::int64_t tile_count = job.row_tiles * job.column_tiles;
  // Below about a million multiply-adds, waking the workers costs more than they save.
  if (workers == nullptr || workers->threads() == 1 || p.m * p.n * p.k < (std::int64_t{1} << 20)) {
    kernel.pack(job, 0, pack_units);
    kernel.tiles(job, 0, tile_count);
  } else {
    workers->for_each(pack_units, [&](std::int64_t begin, std::int64_t end) { kernel.pack(job, begin, end); });
    workers->for_each(tile_count, [&](std::int64_t begin, std::int64_t end) { kernel.tiles(job, begin, end); });
  }
}

void gemm_host(const GemmParams& p, HostWorkers* workers) { gemm_host_with(p, chosen_simd(), workers); }

}  // namespace tandem::production
