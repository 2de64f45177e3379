// cuda-sim's cuBLASLt (include/cublasLt.h, docs/CUDA-SIM.md "cuBLASLt"): exactly the GEMMs
// production/cuda/gemm_cublaslt.cpp asks for, computed on the CPU by the host twin gemm_host
// (one thread; the blocked kernel gives gemm_host_ordered's bits: k in increasing order per
// element), in stream order. Whatever the project
// does not use is CUBLAS_STATUS_NOT_SUPPORTED, never accepted on a guess.
//
// cuBLASLt is column-major: a layout of `rows` x `cols` with ld == rows is, read row-major, the
// [cols, rows] array of its transpose. So D = alpha op(A) op(B) + beta C (column-major, D [m x n])
// is the row-major D^T[n, m] = alpha op(B)^T op(A)^T + beta C^T: the host GEMM with m and n
// swapped, cuBLASLt's B as its A and cuBLASLt's A as its B, each with its own transpose flag
// (B stored k x n with OP_N reads row-major as op(B)^T [n, k] itself; stored n x k with OP_T it
// reads as [k, n], op(B)^T's transpose).
#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "cuda_sim/checks.hpp"
#include "production/kernels/gemm.hpp"

struct cublasLtContext {
  int unused = 0;  // a handle is only an address: the sim keeps no per-handle state
};

struct cublasLtMatmulDescOpaque_t {
  cublasOperation_t trans_a = CUBLAS_OP_N;
  cublasOperation_t trans_b = CUBLAS_OP_N;
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::int64_t ld = 0;
};

// cuBLASLt's defaults: every workspace size, every reduction scheme, 256-byte aligned pointers.
struct cublasLtMatmulPreferenceOpaque_t {
  std::uint64_t max_workspace_bytes = 0;
  std::uint32_t reduction_scheme_mask = 0x7;  // CUBLASLT_REDUCTION_SCHEME_MASK: all schemes
  std::uint32_t min_alignment_bytes[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

using tandem::production::DType;
using tandem::production::GemmParams;
using tandem::production::Transpose;

// The one algorithm: what the heuristic reports of it, and what cublasLtMatmul checks it against.
constexpr std::uint64_t kAlgoMagic = 0x63756461'53696d31;  // "cudaSim1": made by this heuristic
constexpr std::uint64_t kAlgoWorkspaceBytes = 0;            // the host GEMM needs no workspace
constexpr float kAlgoWavesCount = 1.0f;
// The words of cublasLtMatmulAlgo_t::data the sim uses.
enum AlgoWord : std::size_t {
  kWordMagic = 0,
  kWordWorkspace = 1,
  kWordAlignmentA = 2,  // .. kWordAlignmentA + 3: A, B, C, D, the alignments it was chosen for
  kWordProblem = 6,     // the problem it was chosen for (problem_fingerprint)
};

// The algorithm's configuration, with the value types cublasLt.h documents for each attribute.
constexpr std::int32_t kConfigId = 0;
constexpr std::uint32_t kConfigTileId = 0;       // CUBLASLT_MATMUL_TILE_UNDEFINED
constexpr std::int32_t kConfigSplitK = 1;        // no split: one sum per element
constexpr std::uint32_t kConfigReduction = CUBLASLT_REDUCTION_SCHEME_NONE;
constexpr std::uint32_t kConfigSwizzle = 0;
constexpr std::uint32_t kConfigCustom = 0;
constexpr std::uint32_t kConfigStagesId = 0;     // CUBLASLT_MATMUL_STAGES_UNDEFINED

// The largest dimension the sim takes (its row-major products are int64 element counts).
constexpr std::uint64_t kMaxDimension = std::numeric_limits<std::int32_t>::max();

std::int64_t element_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }
DType dtype_of(cudaDataType_t type) { return type == CUDA_R_32F ? DType::f32 : DType::bf16; }
Transpose transpose_of(cublasOperation_t operation) {
  return operation == CUBLAS_OP_T ? Transpose::yes : Transpose::no;
}

bool same_layout(const cublasLtMatrixLayoutOpaque_t& x, const cublasLtMatrixLayoutOpaque_t& y) {
  return x.type == y.type && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld;
}

// ld < rows overlaps columns (cuBLASLt's INVALID_VALUE); ld > rows is a strided layout, which the
// project never passes and the sim does not compute.
cublasStatus_t check_dense(const cublasLtMatrixLayoutOpaque_t& layout) {
  if (layout.ld < 0 || static_cast<std::uint64_t>(layout.ld) < layout.rows) return CUBLAS_STATUS_INVALID_VALUE;
  if (static_cast<std::uint64_t>(layout.ld) != layout.rows) return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

// The problem of a matmul as the host GEMM's row-major parameters (pointers left null), or why
// the sim refuses it.
struct Problem {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  GemmParams params;
};

Problem problem_of(const cublasLtMatmulDescOpaque_t& operation, const cublasLtMatrixLayoutOpaque_t& a,
                   const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                   const cublasLtMatrixLayoutOpaque_t& d) {
  Problem problem;
  for (const cublasLtMatrixLayoutOpaque_t* layout : {&a, &b, &c, &d}) {
    problem.status = check_dense(*layout);
    if (problem.status != CUBLAS_STATUS_SUCCESS) return problem;
  }
  // D is computed in place over C (the project's only use): C and D share one layout.
  if (!same_layout(c, d)) return {CUBLAS_STATUS_NOT_SUPPORTED, {}};
  // Column-major op(A) [m x k], op(B) [k x n], D [m x n].
  const bool a_transposed = operation.trans_a == CUBLAS_OP_T, b_transposed = operation.trans_b == CUBLAS_OP_T;
  const std::uint64_t m = d.rows, n = d.cols;
  const std::uint64_t a_rows = a_transposed ? a.cols : a.rows, a_cols = a_transposed ? a.rows : a.cols;
  const std::uint64_t b_rows = b_transposed ? b.cols : b.rows, b_cols = b_transposed ? b.rows : b.cols;
  if (a_rows != m || b_cols != n || a_cols != b_rows) return {CUBLAS_STATUS_INVALID_VALUE, {}};
  // bf16 x bf16 -> f32 or bf16; f32 x f32 -> f32 (gemm_cublaslt.hpp's policy).
  if (a.type != b.type) return {CUBLAS_STATUS_NOT_SUPPORTED, {}};
  if (a.type == CUDA_R_32F && d.type != CUDA_R_32F) return {CUBLAS_STATUS_NOT_SUPPORTED, {}};
  GemmParams& params = problem.params;
  params.m = static_cast<std::int64_t>(n);
  params.n = static_cast<std::int64_t>(m);
  params.k = static_cast<std::int64_t>(a_cols);
  params.a = {nullptr, dtype_of(b.type), transpose_of(operation.trans_b)};
  params.b = {nullptr, dtype_of(a.type), transpose_of(operation.trans_a)};
  params.c_dtype = dtype_of(d.type);
  return problem;
}

// Everything the algorithm was chosen for, folded into one word (FNV-1a).
std::uint64_t problem_fingerprint(const GemmParams& params) {
  std::uint64_t hash = 0xcbf29ce484222325;
  const auto mix = [&hash](std::uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xFF;
      hash *= 0x100000001b3;
    }
  };
  mix(static_cast<std::uint64_t>(params.m));
  mix(static_cast<std::uint64_t>(params.n));
  mix(static_cast<std::uint64_t>(params.k));
  mix(static_cast<std::uint64_t>(params.a.dtype) | static_cast<std::uint64_t>(params.a.transpose) << 8 |
      static_cast<std::uint64_t>(params.b.dtype) << 16 | static_cast<std::uint64_t>(params.b.transpose) << 24 |
      static_cast<std::uint64_t>(params.c_dtype) << 32);
  return hash;
}

std::uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  return address == 0 ? 256u : static_cast<std::uint32_t>(std::min<std::uintptr_t>(address & (~address + 1), 256));
}

// A set attribute's value: the buffer must hold exactly the attribute's type.
template <class Value>
cublasStatus_t read_attribute(const void* buffer, std::size_t size_in_bytes, Value* value) {
  if (buffer == nullptr || size_in_bytes != sizeof(Value)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(value, buffer, sizeof(Value));
  return CUBLAS_STATUS_SUCCESS;
}

// A configuration attribute's value, with cuBLASLt's size protocol: size 0 asks for the size.
template <class Value>
cublasStatus_t write_attribute(Value value, void* buffer, std::size_t size_in_bytes, std::size_t* size_written) {
  if (size_in_bytes == 0) {
    if (size_written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *size_written = sizeof(Value);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buffer == nullptr || size_in_bytes != sizeof(Value)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buffer, &value, sizeof(Value));
  if (size_written != nullptr) *size_written = sizeof(Value);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasLtContext;
  return *handle == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (by cuda-sim: docs/CUDA-SIM.md \"cuBLASLt\")";
  }
  return "unrecognized status";
}

// The version of the Toolkit headers the stand-in follows (CUDA 13.1: cuBLAS 13.1.0).
std::size_t cublasLtGetVersion() { return 130100; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // True fp32 accumulation with fp32 alpha and beta only: no TF32, half, double or integer.
  if (compute_type != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new (std::nothrow) cublasLtMatmulDescOpaque_t;
  return *desc == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, std::size_t size_in_bytes) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attribute != CUBLASLT_MATMUL_DESC_TRANSA && attribute != CUBLASLT_MATMUL_DESC_TRANSB) {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // epilogues, pointer modes, scales, ...
  }
  std::int32_t value = 0;
  const cublasStatus_t status = read_attribute(buffer, size_in_bytes, &value);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  // cublas_api.h's CUBLAS_OP_C (2) and CUBLAS_OP_CONJG (3) are operations the project never asks
  // for; anything else is no operation at all.
  if (value == 2 || value == 3) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (value != CUBLAS_OP_N && value != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
  (attribute == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = static_cast<cublasOperation_t>(value);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, std::uint64_t rows,
                                          std::uint64_t cols, std::int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Empty matrices never reach cuBLASLt (gemm_cuda returns or throws first).
  if (rows == 0 || cols == 0 || rows > kMaxDimension || cols > kMaxDimension) return CUBLAS_STATUS_NOT_SUPPORTED;
  *layout = new (std::nothrow) cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return *layout == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *preference = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t;
  return *preference == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, std::size_t size_in_bytes) {
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return read_attribute(buffer, size_in_bytes, &preference->max_workspace_bytes);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: {
      std::uint32_t mask = 0;
      const cublasStatus_t status = read_attribute(buffer, size_in_bytes, &mask);
      if (status != CUBLAS_STATUS_SUCCESS) return status;
      if ((mask & ~0x7u) != 0) return CUBLAS_STATUS_INVALID_VALUE;  // no such scheme
      preference->reduction_scheme_mask = mask;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return read_attribute(buffer, size_in_bytes,
                            &preference->min_alignment_bytes[attribute - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES]);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;  // search mode, waves count, implementation mask, ...
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                              cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                              cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                              cublasLtMatmulPreference_t preference, int requested_algo_count,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned_algo_count) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (operation == nullptr || a_desc == nullptr || b_desc == nullptr || c_desc == nullptr || d_desc == nullptr ||
      preference == nullptr || requested_algo_count <= 0 || results == nullptr || returned_algo_count == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returned_algo_count = 0;
  const Problem problem = problem_of(*operation, *a_desc, *b_desc, *c_desc, *d_desc);
  if (problem.status != CUBLAS_STATUS_SUCCESS) return problem.status;
  // The host GEMM reads whole elements: pointers aligned to less than an element have no algorithm.
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {a_desc, b_desc, c_desc, d_desc};
  for (int matrix = 0; matrix < 4; ++matrix) {
    const std::uint32_t alignment = preference->min_alignment_bytes[matrix];
    const auto bytes = static_cast<std::uint32_t>(element_bytes(layouts[matrix]->type));
    if (alignment == 0 || alignment % bytes != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // The algorithm needs no workspace and uses no reduction scheme, so every preference of the
  // workspace size and the scheme mask admits it.
  cublasLtMatmulHeuristicResult_t& result = results[0];
  result = cublasLtMatmulHeuristicResult_t{};
  result.algo.data[kWordMagic] = kAlgoMagic;
  result.algo.data[kWordWorkspace] = kAlgoWorkspaceBytes;
  for (int matrix = 0; matrix < 4; ++matrix) {
    result.algo.data[kWordAlignmentA + static_cast<std::size_t>(matrix)] = preference->min_alignment_bytes[matrix];
  }
  result.algo.data[kWordProblem] = problem_fingerprint(problem.params);
  result.workspaceSize = kAlgoWorkspaceBytes;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = kAlgoWavesCount;
  *returned_algo_count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attribute, void* buffer,
                                                    std::size_t size_in_bytes, std::size_t* size_written) {
  if (algo == nullptr || algo->data[kWordMagic] != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attribute) {
    case CUBLASLT_ALGO_CONFIG_ID: return write_attribute(kConfigId, buffer, size_in_bytes, size_written);
    case CUBLASLT_ALGO_CONFIG_TILE_ID: return write_attribute(kConfigTileId, buffer, size_in_bytes, size_written);
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: return write_attribute(kConfigSplitK, buffer, size_in_bytes, size_written);
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
      return write_attribute(kConfigReduction, buffer, size_in_bytes, size_written);
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING: return write_attribute(kConfigSwizzle, buffer, size_in_bytes, size_written);
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION: return write_attribute(kConfigCustom, buffer, size_in_bytes, size_written);
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: return write_attribute(kConfigStagesId, buffer, size_in_bytes, size_written);
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;  // inner shape, cluster shape, ...
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, std::size_t workspace_size_in_bytes,
                              cudaStream_t stream) {
  (void)workspace;  // the algorithm needs none
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (operation == nullptr || a_desc == nullptr || b_desc == nullptr || c_desc == nullptr || d_desc == nullptr ||
      alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // cuBLASLt's own search when no algorithm is given: the project always passes the heuristic's.
  if (algo == nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo->data[kWordMagic] != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
  Problem problem = problem_of(*operation, *a_desc, *b_desc, *c_desc, *d_desc);
  if (problem.status != CUBLAS_STATUS_SUCCESS) return problem.status;
  // The algorithm must be the one chosen for this problem, with a workspace as large as it asked.
  if (algo->data[kWordProblem] != problem_fingerprint(problem.params)) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace_size_in_bytes < algo->data[kWordWorkspace]) return CUBLAS_STATUS_INVALID_VALUE;
  // In place only: D is C (cuBLASLt reads C and writes D; the project passes one matrix twice).
  if (c != d) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a == nullptr || b == nullptr || d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // Each pointer as aligned as the preference promised when the algorithm was chosen.
  const void* pointers[4] = {a, b, c, d};
  for (std::size_t matrix = 0; matrix < 4; ++matrix) {
    if (alignment_of(pointers[matrix]) < algo->data[kWordAlignmentA + matrix]) return CUBLAS_STATUS_INVALID_VALUE;
  }
  GemmParams& params = problem.params;
  params.a.data = b;
  params.b.data = a;
  params.c = d;
  std::memcpy(&params.alpha, alpha, sizeof(float));  // scale type CUDA_R_32F, host pointer mode
  std::memcpy(&params.beta, beta, sizeof(float));    // 0: C is not read (gemm_host_ordered's rule too)
  const cudaError_t error =
      tandem::cuda_sim::run_on_stream(stream, [params] {
        tandem::production::gemm_host(params);
        if (const auto* checks = tandem::cuda_sim::device_memory_checks()) {
          checks->written(params.c, static_cast<std::size_t>(params.m * params.n * tandem::production::dtype_bytes(params.c_dtype)));
        }
      });
  return error == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
