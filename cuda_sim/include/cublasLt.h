// cuda-sim's stand-in for <cublasLt.h>: only the status type and its text, which
// production/cuda/check.hpp names. The cuBLASLt calls themselves are not simulated yet
// (docs/CUDA-SIM.md "Not yet"): a source that uses one fails to compile for cuda-sim.
#pragma once

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

const char* cublasLtGetStatusString(cublasStatus_t status);
