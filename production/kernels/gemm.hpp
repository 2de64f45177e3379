// GEMM, row-major: C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C. A and B are both f32 or
// both bf16; products and sums in fp32 (SPEC 7: bf16 in, fp32 accumulate); C is f32 or bf16 and
// is rounded once when stored (beta * C is read widened, added in fp32). Every linear layer's
// forward (X W^T), input gradient (dY W) and weight gradient (dY^T X, beta = 1 into the fp32 main
// gradient) is one call. Host twin in gemm_host.cpp (k in increasing order per element); CUDA twin
// in production/cuda/gemm_cublaslt.cpp (cuBLASLt with a fixed algorithm, no split-K atomics).
#pragma once

#include <cstdint>

#include "production/arithmetic.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

enum class Transpose : std::uint8_t { no, yes };

// A matrix as stored, row-major and dense. op(M) is M for Transpose::no; for Transpose::yes the
// stored matrix is op(M)'s transpose ([k, m] for A, [n, k] for B).
struct GemmOperand {
  const void* data = nullptr;
  DType dtype = DType::f32;
  Transpose transpose = Transpose::no;
};

struct GemmParams {
  std::int64_t m = 0;       // rows of C
  std::int64_t n = 0;       // columns of C
  std::int64_t k = 0;       // the reduction length
  GemmOperand a;            // op(A): [m, k]
  GemmOperand b;            // op(B): [k, n]
  void* c = nullptr;        // [m, n] c_dtype
  DType c_dtype = DType::f32;
  Real alpha = 1.0f;
  Real beta = 0.0f;        // 0: C is overwritten (never read); 1: accumulate into C
};

class HostWorkers;  // host_workers.hpp

// The cpu backend's GEMM (register-blocked; its tiles split among `workers` when given), and the
// same arithmetic one element at a time: the plain statement of each element's order (k
// increasing, no fused multiply-add). The two give the same bits for every input and every
// thread count (tests/production_ops_test.cpp).
void gemm_host(const GemmParams& params, HostWorkers* workers = nullptr);
void gemm_host_ordered(const GemmParams& params);
// The blocked kernel's vector paths: the x86-64 baseline's SSE2 (or arm64's NEON), AVX2, AVX-512F
// (none with FMA). gemm_host takes the widest the processor has, or the one the environment
// variable TANDEM_HOST_SIMD names (baseline, avx2, avx512; an unknown name or one the processor
// lacks is an error). For tests, benchmarks and `tandem train --verbose`.
enum class HostSimd { baseline, avx2, avx512 };
inline constexpr HostSimd kHostSimds[] = {HostSimd::baseline, HostSimd::avx2, HostSimd::avx512};
const char* host_simd_name(HostSimd simd);
HostSimd host_simd();  // the path gemm_host takes
bool host_gemm_has(HostSimd simd);
void gemm_host_with(const GemmParams& params, HostSimd simd, HostWorkers* workers = nullptr);
void gemm_cuda(const GemmParams& params, const CudaLaunch& launch);

}  // namespace tandem::production
