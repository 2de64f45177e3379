// The cuda backend's GEMMs through cuBLASLt (kernels/gemm.hpp's gemm_cuda is defined in
// gemm_cublaslt.cpp). Policy, the same for every shape:
//   - bf16 x bf16 -> f32 or bf16, and f32 x f32 -> f32; compute CUBLAS_COMPUTE_32F (true fp32
//     accumulation, never TF32), alpha and beta fp32 on the host;
//   - the algorithm is cuBLASLt's top heuristic answer for the exact shape, transposes, dtypes and
//     pointer alignments, restricted to CUBLASLT_REDUCTION_SCHEME_NONE (no split-K reduction, so
//     no atomics and the same bits every run), with a fixed kGemmWorkspaceBytes workspace; chosen
//     once per shape and kept;
//   - when cuBLASLt offers no algorithm the call throws, naming the shape: never a silent fallback.
// Every choice is recorded for the log (gemm_algorithm_log).
#pragma once

#include <cstdint>
#include <string>

#include "production/cuda/target.hpp"

namespace tandem::cuda::inline TANDEM_CUDA_TARGET {

// The workspace every GEMM gets: the first kGemmWorkspaceBytes of the backend's workspace.
inline constexpr std::int64_t kGemmWorkspaceBytes = std::int64_t{32} << 20;

// "cuBLASLt 130000, heuristic top-1, reduction scheme none, workspace 32 MiB": the policy, for the
// log header (known before any GEMM runs).
std::string gemm_policy();

// One line per shape chosen so far, in the order they were first used:
// "m=4096 n=1024 k=1024 A=bf16/N B=bf16/T C=f32 beta=0 align=256/256/256: algo 23 tile 20
//  stages 8 splitk 1 reduction 0 swizzle 0 custom 0 waves 0.97".
std::string gemm_algorithm_log();

}  // namespace tandem::cuda::inline TANDEM_CUDA_TARGET
