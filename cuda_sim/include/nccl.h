// cuda-sim's stand-in for <nccl.h> (docs/CUDA-SIM.md "NCCL"): what production/collectives/nccl.cpp
// calls of NCCL, over ranks that are threads of one process (cuda_sim/nccl.cpp). Only targets
// built for cuda-sim put this directory on their include path; nothing else may include it.
//
// Declared here and nothing more: the version and error text, unique ids, ncclCommInitRank and
// ncclCommDestroy, ncclAllGather, ncclSend and ncclRecv, ncclGroupStart and ncclGroupEnd. The
// names, values and signatures are NCCL's, so the project's source compiles unchanged.
#pragma once

#include <cstddef>

#include "cuda_sim/include/cuda_runtime.h"

// The release the stand-in answers for (its rules are those of NCCL 2.28's documentation).
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE (NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH)

// C++ linkage, as cuda_runtime.h here: the tandem binary links NCCL itself beside these.
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,  // a rank that never arrives (a timeout): the stand-in's only way to stop a hang
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,  // ranks that disagree (counts, types, calls), a device twice in a communicator
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm* ncclComm_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);
// The text of the last error a call returned on this thread (which ranks, which call, what
// differed); `comm` is not consulted. Errors inside a stream's work become the stream's sticky
// CUDA error, with their text in cudaGetErrorString.
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int ranks, ncclUniqueId unique_id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclAllGather(const void* sent, void* received, std::size_t sent_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sent, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* received, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

namespace tandem::cuda_sim {

// How long a rank waits for the others (ncclCommInitRank's joining ranks, a collective's posts, a
// send's matching receive) before the wait becomes an error naming the missing ranks and the call:
// TANDEM_CUDA_SIM_NCCL_TIMEOUT seconds, 300 by default (a rank of a slow 8-rank case on 2 cores
// may wait a whole pipeline stage's forward for its peer). Tests set it shorter.
double nccl_timeout_seconds();
void set_nccl_timeout_seconds(double seconds);  // tests; 0 restores the environment's

}  // namespace tandem::cuda_sim
