// cuda-sim's stream scheduling (docs/CUDA-SIM.md "Streams"): how the work queued on streams other
// than the null stream runs. Every mode keeps each stream's order and the events' order between
// streams; they differ in when work runs, so a missing cudaStreamWaitEvent shows up either as a
// real data race (threads) or as a wrong result that is the same on every run (the deferred modes).
// No CUDA types here: <cuda_runtime.h> (cuda_sim/include) includes it for the tests.
#pragma once

#include <string>

namespace tandem::cuda_sim {

enum class StreamMode {
  // Each stream a FIFO run by a worker thread of its own, asynchronously to the host and to the
  // other streams' workers: the order of work on different streams is the OS scheduler's.
  threads,
  // Nothing queued on a stream runs until the host blocks on it (cudaStreamSynchronize,
  // cudaDeviceSynchronize, a null-stream call, cudaStreamDestroy, cudaFree); then the blocking
  // thread runs queued work one operation at a time, always the head of the most recently created
  // stream whose head can run. Newer streams (a side stream made after the compute stream) thus
  // run ahead of everything an event does not order them behind: a consumer on the newer stream
  // that lacks its wait reads too early.
  deferred,
  // As deferred, but the head of the *oldest* stream that can run goes first: the older stream
  // runs on past a producer on a newer stream it lacks a wait for (the compute stream reading what
  // the side stream has not yet written), which deferred cannot show.
  deferred_oldest,
};

// TANDEM_CUDA_SIM_STREAMS: "threads" (default), "deferred" or "deferred-oldest". Anything else throws
// std::invalid_argument naming the variable, the value and the choices.
StreamMode stream_mode_from_environment();
// The mode of this process: set_stream_mode's, else the environment's when the first stream is
// created. set_stream_mode (tests) throws std::logic_error while any stream exists: a stream's
// worker, or its absence, is fixed when it is created.
StreamMode stream_mode();
void set_stream_mode(StreamMode mode);
std::string describe(StreamMode mode);

}  // namespace tandem::cuda_sim
