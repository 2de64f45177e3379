// cuda-sim's stand-in for <cublasLt.h>: what production/cuda/gemm_cublaslt.cpp (its one user) and
// production/cuda/check.hpp call of cuBLASLt, with the Toolkit's names and numeric values
// (cublas_api.h, cublasLt.h, library_types.h of CUDA 13.1), implemented on the CPU by
// cuda_sim/cublaslt.cpp (docs/CUDA-SIM.md "cuBLASLt").
//
// Declared here and nothing more, so a source that needs something else fails to compile:
//   - the handle (cublasLtCreate/Destroy, cublasLtGetVersion) and the status text;
//   - a matmul descriptor of compute type CUBLAS_COMPUTE_32F and scale type CUDA_R_32F, with the
//     attributes TRANSA and TRANSB;
//   - column-major layouts of CUDA_R_32F or CUDA_R_16BF;
//   - the heuristic's preferences MAX_WORKSPACE_BYTES, REDUCTION_SCHEME_MASK, MIN_ALIGNMENT_*;
//   - cublasLtMatmulAlgoGetHeuristic (one algorithm), its configuration attributes, cublasLtMatmul.
// Every enumeration has int as its underlying type, as the C headers' enums have in practice, so
// a value the stand-in does not name (a caller's cast) is representable and refused at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"

// library_types.h
enum cudaDataType_t : int {
  CUDA_R_32F = 0,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;

// cublas_api.h
enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

enum cublasOperation_t : int {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
};

enum cublasComputeType_t : int {
  CUBLAS_COMPUTE_32F = 68,
};

// cublasLt.h
struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;

// The descriptors are opaque in the stand-in (the Toolkit's are semi-opaque 64- and 256-byte
// structs that callers never read); the algorithm is the Toolkit's 64-byte value type.
struct cublasLtMatmulDescOpaque_t;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
struct cublasLtMatrixLayoutOpaque_t;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
struct cublasLtMatmulPreferenceOpaque_t;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;
struct cublasLtMatmulAlgo_t {
  std::uint64_t data[8];
};

enum cublasLtMatmulDescAttributes_t : int {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,  // int32_t (cublasOperation_t)
  CUBLASLT_MATMUL_DESC_TRANSB = 4,  // int32_t (cublasOperation_t)
};

enum cublasLtReductionScheme_t : int {
  CUBLASLT_REDUCTION_SCHEME_NONE = 0,
};

enum cublasLtMatmulPreferenceAttributes_t : int {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,  // uint32_t
};

enum cublasLtMatmulAlgoConfigAttributes_t : int {
  CUBLASLT_ALGO_CONFIG_ID = 0,                // int32_t
  CUBLASLT_ALGO_CONFIG_TILE_ID = 1,           // uint32_t
  CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,        // int32_t
  CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,  // uint32_t
  CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,     // uint32_t
  CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5,     // uint32_t
  CUBLASLT_ALGO_CONFIG_STAGES_ID = 6,         // uint32_t
};

struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
const char* cublasLtGetStatusString(cublasStatus_t status);
std::size_t cublasLtGetVersion();

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, std::size_t size_in_bytes);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, std::uint64_t rows,
                                          std::uint64_t cols, std::int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, std::size_t size_in_bytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                              cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                              cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                              cublasLtMatmulPreference_t preference, int requested_algo_count,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned_algo_count);
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attribute, void* buffer,
                                                    std::size_t size_in_bytes, std::size_t* size_written);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, std::size_t workspace_size_in_bytes,
                              cudaStream_t stream);
