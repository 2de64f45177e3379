// cuda-sim's streams and events (cuda_sim/streams.cpp, docs/CUDA-SIM.md "Streams"): work queued on
// a stream runs after the call returns, in the stream's order; events order two streams; the null
// stream waits for the blocking streams; a fault on a stream is the sticky error of every later
// call; a launch's own errors are still the launch call's. Each test names its scheduling mode
// (set_stream_mode): `deferred` makes a missing cudaStreamWaitEvent give the same wrong result on
// every run, which is what shows the race is there to be caught.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using tandem::cuda_sim::StreamMode;

constexpr int kCount = 256;  // one block's worth of elements

__global__ void fill_kernel(float* out, float value) { out[threadIdx.x] = value; }

__global__ void add_kernel(const float* a, const float* b, float* out) {
  out[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}

// Threads waiting at two different barriers: a fault (engine.cpp's rule), raised while the
// launch runs, on the stream's worker in threads mode.
__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

// Waits until the host opens the gate (or gives up after 10 s and writes -1): it can finish only
// if the launch returned to the host before the kernel ran to its end.
__global__ void gated_kernel(const std::atomic<int>* gate, int* out) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (gate->load() == 0) {
    if (std::chrono::steady_clock::now() > give_up) {
      *out = -1;
      return;
    }
    std::this_thread::yield();
  }
  *out = 1;
}

// A device buffer of kCount floats (cuda-sim's device memory is the host's: the tests read it
// directly once the stream that wrote it is synchronized).
struct DeviceFloats {
  float* data = nullptr;
  DeviceFloats() { EXPECT_EQ(cudaMalloc(&data, kCount * sizeof(float)), cudaSuccess); }
  ~DeviceFloats() { cudaFree(data); }
  // Elements that are not `expected` (exact: small integers).
  int wrong(float expected) const {
    int count = 0;
    for (int i = 0; i < kCount; ++i) count += data[i] != expected;
    return count;
  }
};

// gated_kernel's gate, closed, and the device int it answers in (0 until it has run).
struct Gate {
  std::atomic<int> open{0};
  int* answer = nullptr;
  Gate() {
    EXPECT_EQ(cudaMalloc(&answer, sizeof(int)), cudaSuccess);
    *answer = 0;
  }
  ~Gate() { cudaFree(answer); }
};

struct OwnedStream {
  cudaStream_t stream = nullptr;
  explicit OwnedStream(unsigned int flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, flags), cudaSuccess);
  }
  ~OwnedStream() { cudaStreamDestroy(stream); }
};

struct OwnedEvent {
  cudaEvent_t event = nullptr;
  OwnedEvent() { EXPECT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess); }
  ~OwnedEvent() { cudaEventDestroy(event); }
};

// A clean runtime in the test's mode (no stream outlives a test, so each may choose).
class StreamsIn : public ::testing::Test {
 protected:
  explicit StreamsIn(StreamMode mode) : mode_(mode) {}
  void SetUp() override {
    tandem::cuda_sim::set_stream_mode(mode_);
    cudaDeviceReset();
  }
  void TearDown() override { cudaDeviceReset(); }

 private:
  StreamMode mode_;
};

class DeferredStreams : public StreamsIn {
 protected:
  DeferredStreams() : StreamsIn(StreamMode::deferred) {}
};

class ThreadStreams : public StreamsIn {
 protected:
  ThreadStreams() : StreamsIn(StreamMode::threads) {}
};

class Streams : public StreamsIn, public ::testing::WithParamInterface<StreamMode> {
 protected:
  Streams() : StreamsIn(GetParam()) {}
};

TEST_F(DeferredStreams, AKernelQueuedOnAStreamHasNotRunBeforeTheHostWaitsForIt) {
  DeviceFloats x;
  ASSERT_EQ(cudaMemsetAsync(x.data, 0, kCount * sizeof(float)), cudaSuccess);  // null stream: done at once
  OwnedStream stream;
  TANDEM_LAUNCH(1, kCount, 0, stream.stream, fill_kernel)(x.data, 3.0f);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(x.wrong(0.0f), 0) << "the launch ran before the host waited for its stream";
  ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  EXPECT_EQ(x.wrong(3.0f), 0);
}

TEST_F(ThreadStreams, ALaunchReturnsBeforeItsKernelHasRun) {
  Gate gate;
  OwnedStream stream;
  TANDEM_LAUNCH(1, 1, 0, stream.stream, gated_kernel)(&gate.open, gate.answer);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  gate.open.store(1);  // reached only if the launch returned while its kernel waits for the gate
  ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  EXPECT_EQ(*gate.answer, 1) << "-1: the kernel ran to its end (10 s) before the launch returned";
}

// first: x = 1 -> e; second: waits e, y = x + x -> f; first: waits f, z = y + y. Exact: 4.
TEST_P(Streams, EventsOrderTwoStreamsBothWays) {
  DeviceFloats x, y, z;
  OwnedStream first, second;
  OwnedEvent e, f;
  TANDEM_LAUNCH(1, kCount, 0, first.stream, fill_kernel)(x.data, 1.0f);
  ASSERT_EQ(cudaEventRecord(e.event, first.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(second.stream, e.event, 0), cudaSuccess);
  TANDEM_LAUNCH(1, kCount, 0, second.stream, add_kernel)(x.data, x.data, y.data);
  ASSERT_EQ(cudaEventRecord(f.event, second.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(first.stream, f.event, 0), cudaSuccess);
  TANDEM_LAUNCH(1, kCount, 0, first.stream, add_kernel)(y.data, y.data, z.data);
  ASSERT_EQ(cudaStreamSynchronize(first.stream), cudaSuccess);
  EXPECT_EQ(y.wrong(1.0f + 1.0f), 0);
  EXPECT_EQ(z.wrong(2.0f + 2.0f), 0);
}

// The negative control of the test above: without the wait, the second stream (the newer) runs
// first in deferred mode, and reads x before the first stream writes it, on every run.
TEST_F(DeferredStreams, ARemovedWaitGivesTheWrongResultOnEveryRun) {
  for (int run = 0; run < 3; ++run) {
    DeviceFloats x, y;
    ASSERT_EQ(cudaMemsetAsync(x.data, 0, kCount * sizeof(float)), cudaSuccess);
    OwnedStream first, second;
    TANDEM_LAUNCH(1, kCount, 0, first.stream, fill_kernel)(x.data, 1.0f);
    TANDEM_LAUNCH(1, kCount, 0, second.stream, add_kernel)(x.data, x.data, y.data);  // no wait for first
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(x.wrong(1.0f), 0);
    EXPECT_EQ(y.wrong(0.0f + 0.0f), 0) << "run " << run << ": the second stream did not run ahead of the first";
  }
}

class OldestFirstStreams : public StreamsIn {
 protected:
  OldestFirstStreams() : StreamsIn(StreamMode::deferred_oldest) {}
};

// The other half: the consumer on the older stream lacks its wait for the newer stream's producer.
// Newest first would run the producer first and hide it; oldest first reads x before it is written.
TEST_F(OldestFirstStreams, ARemovedWaitForANewerStreamsWorkGivesTheWrongResultOnEveryRun) {
  for (int run = 0; run < 3; ++run) {
    DeviceFloats x, y;
    ASSERT_EQ(cudaMemsetAsync(x.data, 0, kCount * sizeof(float)), cudaSuccess);
    OwnedStream older, newer;
    TANDEM_LAUNCH(1, kCount, 0, newer.stream, fill_kernel)(x.data, 1.0f);
    TANDEM_LAUNCH(1, kCount, 0, older.stream, add_kernel)(x.data, x.data, y.data);  // no wait for newer
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(x.wrong(1.0f), 0);
    EXPECT_EQ(y.wrong(0.0f + 0.0f), 0) << "run " << run << ": the older stream did not run ahead of the newer";
  }
}

// The same missing wait in threads mode is a data race in the C++ memory model, as it is on a
// device: nothing the two workers share orders the second stream's reads after the first's
// writes. A race on purpose, so it runs only where ThreadSanitizer judges it: ctest in a
// -DTANDEM_TSAN=ON build (tests/cuda_sim/CMakeLists.txt) passes only if TSan reports it; the
// ordinary builds do not register it.
TEST_F(ThreadStreams, ARemovedWaitIsADataRaceThreadSanitizerReports) {
  const char* armed = std::getenv("TANDEM_CUDA_SIM_RACE_ON_PURPOSE");
  if (armed == nullptr || std::string(armed) != "1") {
    GTEST_SKIP() << "a data race on purpose: set TANDEM_CUDA_SIM_RACE_ON_PURPOSE=1 under ThreadSanitizer";
  }
  DeviceFloats x, y;
  OwnedStream first, second;
  TANDEM_LAUNCH(1, kCount, 0, first.stream, fill_kernel)(x.data, 1.0f);
  TANDEM_LAUNCH(1, kCount, 0, second.stream, add_kernel)(x.data, x.data, y.data);  // no wait for first
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// CUDA's rule: a wait is for the event's record at the time of the call, not for one made later.
// first: x = 1 -> e (record 1); second waits (record 1); first: x = 2 -> e (record 2). The newer
// stream runs as soon as record 1 is reached: y = 1 + 1; a wait for record 2 would give 4.
TEST_F(DeferredStreams, AWaitIsForTheRecordBeforeItAndANeverRecordedEventWaitsForNothing) {
  DeviceFloats x, y;
  OwnedStream first, second;
  OwnedEvent e, never_recorded;
  ASSERT_EQ(cudaStreamWaitEvent(second.stream, never_recorded.event, 0), cudaSuccess);
  TANDEM_LAUNCH(1, kCount, 0, first.stream, fill_kernel)(x.data, 1.0f);
  ASSERT_EQ(cudaEventRecord(e.event, first.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(second.stream, e.event, 0), cudaSuccess);
  TANDEM_LAUNCH(1, kCount, 0, second.stream, add_kernel)(x.data, x.data, y.data);
  TANDEM_LAUNCH(1, kCount, 0, first.stream, fill_kernel)(x.data, 2.0f);
  ASSERT_EQ(cudaEventRecord(e.event, first.stream), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(y.wrong(1.0f + 1.0f), 0);
  EXPECT_EQ(x.wrong(2.0f), 0);
}

// The legacy default stream: a null-stream call runs after everything queued on a blocking stream
// (created without cudaStreamNonBlocking), and leaves a non-blocking stream's work where it is.
// The non-blocking stream is the older: deferred mode would otherwise run it first, newest first.
TEST_F(DeferredStreams, TheNullStreamWaitsForBlockingStreamsOnly) {
  DeviceFloats x, y, other;
  ASSERT_EQ(cudaMemsetAsync(other.data, 0, kCount * sizeof(float)), cudaSuccess);
  OwnedStream non_blocking(cudaStreamNonBlocking), blocking(cudaStreamDefault);
  TANDEM_LAUNCH(1, kCount, 0, non_blocking.stream, fill_kernel)(other.data, 5.0f);
  TANDEM_LAUNCH(1, kCount, 0, blocking.stream, fill_kernel)(x.data, 1.0f);
  TANDEM_LAUNCH(1, kCount, 0, nullptr, add_kernel)(x.data, x.data, y.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(y.wrong(1.0f + 1.0f), 0) << "the null stream ran before the blocking stream's work";
  EXPECT_EQ(other.wrong(0.0f), 0) << "the null stream waited for the non-blocking stream";
  ASSERT_EQ(cudaStreamSynchronize(non_blocking.stream), cudaSuccess);
  EXPECT_EQ(other.wrong(5.0f), 0);
}

// In threads mode too: a null-stream call returns while a non-blocking stream's kernel still
// waits for the host (were it waited for, the kernel would give up after 10 s and write -1).
TEST_F(ThreadStreams, TheNullStreamDoesNotWaitForANonBlockingStream) {
  Gate gate;
  DeviceFloats x;
  OwnedStream non_blocking(cudaStreamNonBlocking);
  TANDEM_LAUNCH(1, 1, 0, non_blocking.stream, gated_kernel)(&gate.open, gate.answer);
  TANDEM_LAUNCH(1, kCount, 0, nullptr, fill_kernel)(x.data, 1.0f);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(x.wrong(1.0f), 0);
  gate.open.store(1);
  ASSERT_EQ(cudaStreamSynchronize(non_blocking.stream), cudaSuccess);
  EXPECT_EQ(*gate.answer, 1) << "-1: the null stream's launch waited for the non-blocking stream";
}

// A fault raised while the launch runs (on a stream's worker in threads mode) is the next
// synchronize's error and every later call's, with its text; the work queued after it is dropped.
TEST_P(Streams, AFaultInAKernelOnAStreamIsStickyForTheNextSynchronizeAndEveryLaterCall) {
  DeviceFloats x, y;
  ASSERT_EQ(cudaMemsetAsync(y.data, 0, kCount * sizeof(float)), cudaSuccess);
  std::vector<float> host(kCount, 7.0f);
  OwnedStream stream;
  TANDEM_LAUNCH(1, 32, 0, stream.stream, divergent_barrier_kernel)(x.data);
  // Deferred, nothing has run yet; in threads mode the worker may already have faulted.
  if (GetParam() != StreamMode::threads) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the launch itself was valid";
  }
  TANDEM_LAUNCH(1, kCount, 0, stream.stream, fill_kernel)(y.data, 1.0f);  // queued behind the fault
  const cudaError_t synchronized = cudaStreamSynchronize(stream.stream);
  ASSERT_EQ(synchronized, cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(synchronized);
  EXPECT_NE(text.find("kernel divergent_barrier_kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("block (0,0,0)"), std::string::npos) << text;
  EXPECT_NE(text.find("cuda_sim_streams_test.cpp:"), std::string::npos) << "the barriers' lines: " << text;
  EXPECT_EQ(y.wrong(0.0f), 0) << "work queued after the fault ran";
  EXPECT_EQ(cudaMemcpyAsync(y.data, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, stream.stream),
            cudaErrorLaunchFailure);
  EXPECT_EQ(cudaMemsetAsync(y.data, 0, kCount * sizeof(float), stream.stream), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(stream.stream), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "sticky: not cleared by reading it";
  EXPECT_EQ(y.wrong(0.0f), 0) << "a copy was made after the fault";
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
}

// An invalid configuration and too much dynamic shared memory are the launch call's errors, seen
// by cudaGetLastError right after it, whatever waits in the stream; not sticky; nothing runs.
TEST_P(Streams, ALaunchsOwnErrorIsReportedRightAfterTheLaunchCall) {
  DeviceFloats x;
  ASSERT_EQ(cudaMemsetAsync(x.data, 0, kCount * sizeof(float)), cudaSuccess);
  OwnedStream stream;
  TANDEM_LAUNCH(1, 2048, 0, stream.stream, fill_kernel)(x.data, 1.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not sticky";
  TANDEM_LAUNCH(1, kCount, tandem::cuda_sim::kDefaultDynamicSharedBytes + 16, stream.stream, fill_kernel)(x.data, 1.0f);
  const cudaError_t too_much_shared = cudaGetLastError();
  EXPECT_EQ(too_much_shared, cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(too_much_shared)).find("dynamic shared memory"), std::string::npos);
  EXPECT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  EXPECT_EQ(x.wrong(0.0f), 0) << "a refused launch ran";
}

TEST_P(Streams, DestroyingAStreamRunsTheWorkStillQueuedOnIt) {
  DeviceFloats x;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  TANDEM_LAUNCH(1, kCount, 0, stream, fill_kernel)(x.data, 1.0f);
  TANDEM_LAUNCH(1, kCount, 0, stream, add_kernel)(x.data, x.data, x.data);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(x.wrong(1.0f + 1.0f), 0);
}

// Queues a copy and a memset whose every argument is a local of this frame, then returns.
void queue_with_locals(cudaStream_t stream, float* destination, const float* source, float* cleared) {
  const std::size_t copy_bytes = kCount * sizeof(float);
  const std::size_t clear_bytes = copy_bytes / 2;
  const int zero_bytes = 0;
  EXPECT_EQ(cudaMemcpyAsync(destination, source, copy_bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(cleared, zero_bytes, clear_bytes, stream), cudaSuccess);
}

// Writes over the stack where queue_with_locals kept its locals.
[[gnu::noinline]] int scribble_on_the_stack() {
  volatile unsigned char junk[4096];
  for (std::size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<unsigned char>(0xA5 ^ i);
  return junk[100];
}

TEST_P(Streams, CopiesAndMemsetsHoldTheirArgumentsByValue) {
  DeviceFloats destination, cleared;
  ASSERT_EQ(cudaMemsetAsync(cleared.data, 0xFF, kCount * sizeof(float)), cudaSuccess);  // NaN
  std::vector<float> source(kCount, 2.0f);  // the source buffer itself must live until the copy runs
  OwnedStream stream;
  queue_with_locals(stream.stream, destination.data, source.data(), cleared.data);
  EXPECT_NE(scribble_on_the_stack(), 0);
  ASSERT_EQ(cudaStreamSynchronize(stream.stream), cudaSuccess);
  EXPECT_EQ(destination.wrong(2.0f), 0);
  int cleared_wrong = 0, kept_wrong = 0;
  for (int i = 0; i < kCount; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &cleared.data[i], sizeof(bits));
    if (i < kCount / 2) cleared_wrong += bits != 0u;
    if (i >= kCount / 2) kept_wrong += bits != 0xFFFFFFFFu;
  }
  EXPECT_EQ(cleared_wrong, 0) << "the memset's first half";
  EXPECT_EQ(kept_wrong, 0) << "the memset wrote past its byte count";
}

INSTANTIATE_TEST_SUITE_P(Modes, Streams, ::testing::Values(StreamMode::threads, StreamMode::deferred, StreamMode::deferred_oldest),
                         [](const ::testing::TestParamInfo<StreamMode>& info) {
                           return info.param == StreamMode::deferred_oldest ? std::string("deferred_oldest")
                                                                            : tandem::cuda_sim::describe(info.param);
                         });

TEST(CudaSimStreams, TheEnvironmentNamesTheModeAndAnythingElseIsRefusedWithTheChoices) {
  const char* saved = std::getenv("TANDEM_CUDA_SIM_STREAMS");
  const std::string restore = saved == nullptr ? "" : saved;
  setenv("TANDEM_CUDA_SIM_STREAMS", "deferred", 1);
  EXPECT_EQ(tandem::cuda_sim::stream_mode_from_environment(), StreamMode::deferred);
  setenv("TANDEM_CUDA_SIM_STREAMS", "deferred-oldest", 1);
  EXPECT_EQ(tandem::cuda_sim::stream_mode_from_environment(), StreamMode::deferred_oldest);
  setenv("TANDEM_CUDA_SIM_STREAMS", "threads", 1);
  EXPECT_EQ(tandem::cuda_sim::stream_mode_from_environment(), StreamMode::threads);
  unsetenv("TANDEM_CUDA_SIM_STREAMS");
  EXPECT_EQ(tandem::cuda_sim::stream_mode_from_environment(), StreamMode::threads);
  setenv("TANDEM_CUDA_SIM_STREAMS", "fifo", 1);
  try {
    tandem::cuda_sim::stream_mode_from_environment();
    ADD_FAILURE() << "\"fifo\" was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("TANDEM_CUDA_SIM_STREAMS=\"fifo\""), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("threads"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("deferred (a"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("deferred-oldest"), std::string::npos) << error.what();
  }
  if (saved == nullptr) {
    unsetenv("TANDEM_CUDA_SIM_STREAMS");
  } else {
    setenv("TANDEM_CUDA_SIM_STREAMS", restore.c_str(), 1);
  }
}

TEST(CudaSimStreams, TheModeCannotChangeWhileAStreamExists) {
  tandem::cuda_sim::set_stream_mode(StreamMode::threads);
  OwnedStream stream;
  EXPECT_THROW(tandem::cuda_sim::set_stream_mode(StreamMode::deferred), std::logic_error);
  EXPECT_EQ(tandem::cuda_sim::stream_mode(), StreamMode::threads);
}

}  // namespace
