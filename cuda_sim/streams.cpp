// cuda-sim's streams and events (docs/CUDA-SIM.md "Streams"): each stream other than the null
// stream is a FIFO of operations (a kernel launch, a copy, a memset, a library call, an event's
// record, a wait for one), run in order, asynchronously to the host, either by a worker thread of
// the stream's own or, in deferred mode, by the host when it blocks (streams.hpp). The null stream
// stays synchronous on the calling thread.
//
// What is checked before every operation, the sticky error, is one relaxed atomic load: nothing
// two streams share is locked on the way, so the only happens-before between two streams' work is
// an event's (a record and the wait for it) and ThreadSanitizer sees a missing wait as the race it
// is. The host's own calls do go through each stream's mutex (queueing, synchronizing).
#include "cuda_sim/streams.hpp"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_sim/checks.hpp"
#include "cuda_sim/include/cuda_runtime.h"
#include "cuda_sim/runtime_internal.hpp"

namespace tandem::cuda_sim {
namespace {

// One cudaEventRecord: reached once its stream has run everything queued on it before the record
// (at once for a record on the null stream).
struct Record {
  std::mutex mutex;
  std::condition_variable reached_changed;
  bool reached = false;

  void reach() {
    {
      const std::lock_guard lock(mutex);
      reached = true;
    }
    reached_changed.notify_all();
  }
  bool is_reached() {
    const std::lock_guard lock(mutex);
    return reached;
  }
  void wait() {
    std::unique_lock lock(mutex);
    reached_changed.wait(lock, [this] { return reached; });
  }
};

// One queued operation: work, a record to reach, or a record to wait for. Everything it needs it
// holds by value (the caller's locals are gone by the time it runs).
struct Operation {
  std::function<void()> work;          // a kernel launch, a copy, a memset, a library call
  std::shared_ptr<Record> record;      // cudaEventRecord: reached when the stream gets here
  std::shared_ptr<Record> wait_for;    // cudaStreamWaitEvent: the stream goes on once it is reached
};

}  // namespace
}  // namespace tandem::cuda_sim

struct CUstream_st {
  unsigned int flags = 0;
  std::uint64_t creation = 0;  // 1, 2, ... in creation order: the deferred modes' preference
  int device = 0;              // the creating thread's (cudaSetDevice): what a device-wide wait waits for
  std::mutex mutex;
  std::condition_variable changed;  // an operation queued or finished, or the worker told to stop
  std::deque<tandem::cuda_sim::Operation> queue;
  bool running = false;  // an operation taken from the queue has not finished yet
  bool stop = false;
  std::thread worker;  // threads mode only
};

struct CUevent_st {
  unsigned int flags = 0;
  // The most recent cudaEventRecord (null: never recorded). cudaStreamWaitEvent waits for the one
  // it finds here at the call, as CUDA captures the event's state then; shared with the queued
  // operations, so an event destroyed while a wait for it is queued leaves the wait valid.
  std::shared_ptr<tandem::cuda_sim::Record> latest;
};

namespace tandem::cuda_sim {
namespace {

// Every stream, in creation order, and the mode. Locked by the host's calls only (create,
// destroy, record, wait, synchronize); deferred mode runs queued work under it, on the host.
struct Streams {
  std::mutex mutex;
  std::vector<CUstream_st*> all;
  std::uint64_t created = 0;
  bool mode_chosen = false;
  StreamMode mode = StreamMode::threads;
};
Streams& streams() {
  static Streams* state = new Streams;  // never destroyed: streams may be destroyed from static teardown
  return *state;
}

StreamMode mode_locked(Streams& registry) {
  if (!registry.mode_chosen) {
    registry.mode = stream_mode_from_environment();
    registry.mode_chosen = true;
  }
  return registry.mode;
}

bool is_blocking(const CUstream_st* stream) { return (stream->flags & cudaStreamNonBlocking) == 0; }

// Runs work unless the context has faulted; a fault (a KernelFault from a kernel, any exception
// from a library call) becomes the sticky error, with its text.
void run_work(const std::function<void()>& work) {
  if (sticky_error() != cudaSuccess) return;  // a faulted context runs nothing more
  try {
    work();
  } catch (const std::exception& error) {
    record_error(cudaErrorLaunchFailure, error.what(), true);
  } catch (...) {
    record_error(cudaErrorLaunchFailure, "cuda-sim: work on a stream threw something that is not a std::exception",
                 true);
  }
}

// Runs one operation. A wait blocks until its record is reached (deferred mode only takes a wait
// whose record is reached). Records are reached even after a fault, so no stream waits forever.
void execute(const Operation& operation) {
  if (operation.wait_for != nullptr && sticky_error() == cudaSuccess) operation.wait_for->wait();
  if (operation.work) run_work(operation.work);
  if (operation.record != nullptr) operation.record->reach();
}

// threads mode: a stream's worker runs its FIFO until told to stop with nothing left.
void work_loop(CUstream_st* stream) {
  std::unique_lock lock(stream->mutex);
  while (true) {
    stream->changed.wait(lock, [stream] { return stream->stop || !stream->queue.empty(); });
    if (stream->queue.empty()) return;
    Operation operation = std::move(stream->queue.front());
    stream->queue.pop_front();
    stream->running = true;
    lock.unlock();
    execute(operation);
    operation = Operation{};  // what it captured goes before the host hears the stream is idle
    lock.lock();
    stream->running = false;
    stream->changed.notify_all();
  }
}

void enqueue(CUstream_st* stream, Operation operation) {
  {
    const std::lock_guard lock(stream->mutex);
    stream->queue.push_back(std::move(operation));
  }
  stream->changed.notify_all();
}

bool is_idle(CUstream_st* stream) {
  const std::lock_guard lock(stream->mutex);
  return stream->queue.empty() && !stream->running;
}

bool can_run(const Operation& operation) {
  return operation.wait_for == nullptr || sticky_error() != cudaSuccess || operation.wait_for->is_reached();
}

// The deferred modes: run queued operations on the calling (host) thread until `done`, one at a
// time, each the head of the most recently created stream whose head can run (deferred_oldest:
// the least recently created). Every wait is for a
// record queued before it (cudaStreamWaitEvent takes the event's record at the call), so some
// head can always run while work is left; were none to, that is reported as the sticky error,
// and the queues are then emptied without running anything, rather than hanging.
template <class Done>
void run_deferred(Streams& registry, Done done) {
  const bool newest_first = registry.mode != StreamMode::deferred_oldest;
  const std::size_t count = registry.all.size();
  while (!done()) {
    CUstream_st* chosen = nullptr;
    std::string blocked;
    for (std::size_t rank = 0; rank < count; ++rank) {
      CUstream_st* stream = registry.all[newest_first ? count - 1 - rank : rank];
      const std::lock_guard lock(stream->mutex);
      if (stream->queue.empty()) continue;
      if (can_run(stream->queue.front())) {
        chosen = stream;
        break;
      }
      blocked += (blocked.empty() ? "" : ", ") + std::string("stream ") + std::to_string(stream->creation);
    }
    if (chosen == nullptr) {
      if (blocked.empty()) return;  // nothing queued anywhere: `done` waits for nothing a stream holds
      record_error(cudaErrorLaunchFailure,
                   "cuda-sim (TANDEM_CUDA_SIM_STREAMS=" + describe(registry.mode) + "): every stream with work left waits for an event "
                   "record no stream can reach (" + blocked + ", numbered in creation order)",
                   true);
      continue;
    }
    Operation operation;
    {
      const std::lock_guard lock(chosen->mutex);
      operation = std::move(chosen->queue.front());
      chosen->queue.pop_front();
    }
    execute(operation);
  }
}

// Waits until every stream `selected` picks has run everything queued on it.
template <class Select>
void drain(Streams& registry, Select selected) {
  if (mode_locked(registry) != StreamMode::threads) {
    run_deferred(registry, [&] {
      for (CUstream_st* stream : registry.all) {
        if (selected(stream) && !is_idle(stream)) return false;
      }
      return true;
    });
    return;
  }
  // Waited for without the registry's lock (held by every caller), which other host threads need
  // meanwhile: ranks of an NCCL communicator on threads, one waiting here for its stream while
  // that stream's collective waits for another rank's part (nccl.cpp). A stream is not destroyed
  // while another thread waits for it (its device's threads are the ones that destroy it).
  std::vector<CUstream_st*> waited;
  for (CUstream_st* stream : registry.all) {
    if (selected(stream)) waited.push_back(stream);
  }
  registry.mutex.unlock();
  for (CUstream_st* stream : waited) {
    std::unique_lock lock(stream->mutex);
    stream->changed.wait(lock, [stream] { return stream->queue.empty() && !stream->running; });
  }
  registry.mutex.lock();
}

// Before anything on the null stream: the legacy default stream waits for every blocking stream
// (one created without cudaStreamNonBlocking). Its own work then runs on the calling thread, so
// work queued later on any stream comes after it.
// The calling thread's device only, as on a device (cuda-sim's devices are names: runtime.cpp).
void drain_blocking(Streams& registry) {
  const int device = current_device();
  drain(registry, [device](const CUstream_st* stream) { return stream->device == device && is_blocking(stream); });
}

// The runtime's answer to a malformed TANDEM_CUDA_SIM_STREAMS, or another refusal, at the call.
cudaError_t refuse(const std::exception& error) {
  record_error(cudaErrorInvalidValue, error.what(), false);
  return cudaErrorInvalidValue;
}

}  // namespace

StreamMode stream_mode_from_environment() {
  const char* text = std::getenv("TANDEM_CUDA_SIM_STREAMS");
  if (text == nullptr || *text == '\0') return StreamMode::threads;
  const std::string value(text);
  if (value == "threads") return StreamMode::threads;
  if (value == "deferred") return StreamMode::deferred;
  if (value == "deferred-oldest") return StreamMode::deferred_oldest;
  throw std::invalid_argument("TANDEM_CUDA_SIM_STREAMS=\"" + value +
                              "\": the streams' scheduling must be threads (a worker thread per stream), deferred (a "
                              "stream's work runs when the host waits for it, the newest stream first) or "
                              "deferred-oldest (the same, the oldest first); fix: one of those, or unset for threads");
}

StreamMode stream_mode() {
  Streams& registry = streams();
  const std::lock_guard lock(registry.mutex);
  return mode_locked(registry);
}

void set_stream_mode(StreamMode mode) {
  Streams& registry = streams();
  const std::lock_guard lock(registry.mutex);
  if (!registry.all.empty()) {
    throw std::logic_error("cuda-sim: set_stream_mode(" + describe(mode) + ") while " +
                           std::to_string(registry.all.size()) + " stream(s) exist: destroy them first");
  }
  registry.mode = mode;
  registry.mode_chosen = true;
}

std::string describe(StreamMode mode) {
  switch (mode) {
    case StreamMode::threads: return "threads";
    case StreamMode::deferred: return "deferred";
    case StreamMode::deferred_oldest: return "deferred-oldest";
  }
  return "?";
}

void drain_all_streams() {
  Streams& registry = streams();
  const std::lock_guard lock(registry.mutex);
  if (registry.all.empty()) return;
  const int device = current_device();
  drain(registry, [device](const CUstream_st* stream) { return stream->device == device; });
}

cudaError_t run_on_stream(cudaStream_t stream, std::function<void()> work) {
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (stream != nullptr) {
    enqueue(stream, Operation{std::move(work), nullptr, nullptr});
    return cudaSuccess;
  }
  {
    Streams& registry = streams();
    const std::lock_guard lock(registry.mutex);
    try {
      drain_blocking(registry);
    } catch (const std::exception& error) {
      return refuse(error);
    }
  }
  run_work(work);
  return sticky_error();
}

void run_launch(const LaunchSite& site, std::function<void()> thread_body) {
  if (sticky_error() != cudaSuccess) return;  // a faulted context runs nothing more
  // The launch's own errors are the launch call's, on the calling thread (cudaGetLastError right
  // after it), however long the launch then waits in its stream.
  PreparedLaunch prepared;
  try {
    prepared = prepare_launch(site);
  } catch (const InvalidConfiguration& error) {
    record_error(cudaErrorInvalidConfiguration, error.what(), false);
    return;
  } catch (const InvalidLaunchArgument& error) {
    record_error(cudaErrorInvalidValue, error.what(), false);
    return;
  } catch (const std::exception& error) {
    record_error(cudaErrorLaunchFailure, error.what(), true);
    return;
  }
  run_on_stream(static_cast<cudaStream_t>(site.stream),
                [prepared, body = std::move(thread_body)] { run_prepared(prepared, body); });
}

}  // namespace tandem::cuda_sim

using tandem::cuda_sim::Operation;
using tandem::cuda_sim::Record;
using tandem::cuda_sim::StreamMode;

cudaError_t cudaMemsetAsync(void* destination, int value, std::size_t bytes, cudaStream_t stream) {
  return tandem::cuda_sim::run_on_stream(stream, [destination, value, bytes] {
    std::memset(destination, value, bytes);
    if (const auto* checks = tandem::cuda_sim::device_memory_checks()) checks->written(destination, bytes);
  });
}

// Every host buffer is treated as pinned: the copy reads (or writes) it when the stream runs the
// copy, so it must live until then, where a device stages a pageable source before returning.
cudaError_t cudaMemcpyAsync(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
  return tandem::cuda_sim::run_on_stream(stream, [destination, source, bytes] {
    if (bytes != 0) std::memmove(destination, source, bytes);
    if (const auto* checks = tandem::cuda_sim::device_memory_checks()) checks->copied(destination, source, bytes);
  });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  auto& registry = tandem::cuda_sim::streams();
  const std::lock_guard lock(registry.mutex);
  StreamMode mode = StreamMode::threads;
  try {
    mode = tandem::cuda_sim::mode_locked(registry);
  } catch (const std::exception& error) {
    return tandem::cuda_sim::refuse(error);
  }
  auto created = std::make_unique<CUstream_st>();
  created->flags = flags;
  created->creation = ++registry.created;
  created->device = tandem::cuda_sim::current_device();
  if (mode == StreamMode::threads) created->worker = std::thread(tandem::cuda_sim::work_loop, created.get());
  registry.all.push_back(created.get());
  *stream = created.release();
  return cudaSuccess;
}

// Runs everything queued on the stream first (CUDA may return at once and let it finish; waiting
// is one of the orders that allows), then stops its worker.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  auto& registry = tandem::cuda_sim::streams();
  const std::lock_guard lock(registry.mutex);
  tandem::cuda_sim::drain(registry, [stream](const CUstream_st* other) { return other == stream; });
  if (stream->worker.joinable()) {
    {
      const std::lock_guard stream_lock(stream->mutex);
      stream->stop = true;
    }
    stream->changed.notify_all();
    stream->worker.join();
  }
  std::erase(registry.all, stream);
  delete stream;
  return tandem::cuda_sim::sticky_error();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  auto& registry = tandem::cuda_sim::streams();
  const std::lock_guard lock(registry.mutex);
  try {
    if (stream == nullptr) {
      tandem::cuda_sim::drain_blocking(registry);
    } else {
      tandem::cuda_sim::drain(registry, [stream](const CUstream_st* other) { return other == stream; });
    }
  } catch (const std::exception& error) {
    return tandem::cuda_sim::refuse(error);
  }
  return tandem::cuda_sim::sticky_error();
}

cudaError_t cudaDeviceSynchronize() {
  tandem::cuda_sim::drain_all_streams();
  return tandem::cuda_sim::sticky_error();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return cudaErrorInvalidValue;
  *event = new CUevent_st{flags, nullptr};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return cudaErrorInvalidValue;
  if (tandem::cuda_sim::sticky_error() != cudaSuccess) return tandem::cuda_sim::sticky_error();
  auto& registry = tandem::cuda_sim::streams();
  const std::lock_guard lock(registry.mutex);
  auto record = std::make_shared<Record>();
  event->latest = record;
  if (stream != nullptr) {
    tandem::cuda_sim::enqueue(stream, Operation{{}, record, nullptr});
    return cudaSuccess;
  }
  try {
    tandem::cuda_sim::drain_blocking(registry);
  } catch (const std::exception& error) {
    return tandem::cuda_sim::refuse(error);
  }
  record->reach();
  return tandem::cuda_sim::sticky_error();
}

// Waits for the event's most recent record at the time of the call; an event never recorded has
// nothing to wait for (CUDA's rule too).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr) return cudaErrorInvalidValue;
  if (tandem::cuda_sim::sticky_error() != cudaSuccess) return tandem::cuda_sim::sticky_error();
  auto& registry = tandem::cuda_sim::streams();
  const std::lock_guard lock(registry.mutex);
  const std::shared_ptr<Record> record = event->latest;
  if (record == nullptr) return cudaSuccess;
  if (stream != nullptr) {
    tandem::cuda_sim::enqueue(stream, Operation{{}, nullptr, record});
    return cudaSuccess;
  }
  // The null stream is the host's: it waits here.
  try {
    tandem::cuda_sim::drain_blocking(registry);
    if (tandem::cuda_sim::mode_locked(registry) != StreamMode::threads) {
      tandem::cuda_sim::run_deferred(registry, [&record] {
        return tandem::cuda_sim::sticky_error() != cudaSuccess || record->is_reached();
      });
    } else {
      record->wait();
    }
  } catch (const std::exception& error) {
    return tandem::cuda_sim::refuse(error);
  }
  return tandem::cuda_sim::sticky_error();
}
