// cuda-sim's NCCL (include/nccl.h, docs/CUDA-SIM.md "NCCL"): communicators whose ranks are threads
// of this process, each on a cuda-sim device of its own. Every operation is work queued on the
// caller's stream (streams.cpp), so it runs in the stream's order, asynchronously to the host, and
// waits there for its peers as a device's kernel would:
//   - ncclAllGather: the k-th collective every rank issues on a communicator meets the others'
//     k-th; each rank copies every rank's part into its own output, and none leaves before all have
//     read its input;
//   - ncclSend / ncclRecv: a send is posted to the (sender, receiver) queue, in issue order, and
//     completes when the receiver has copied it; a receive takes the oldest send from its peer. A
//     group posts all its sends before it waits on any receive, so two ranks may send to each
//     other in one group each; ungrouped, two such sends wait for each other, as on NCCL.
// What NCCL would leave as a hang or as wrong bytes is an error here, naming the ranks and the
// call: ranks that disagree on a count or a type, a device twice in a communicator, and a rank that
// never arrives (a timeout, nccl_timeout_seconds). A rank's failure is every waiting peer's too.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_sim/checks.hpp"
#include "cuda_sim/include/nccl.h"
#include "cuda_sim/runtime_internal.hpp"
#include "cuda_sim/streams.hpp"

namespace tandem::cuda_sim {
namespace {

std::atomic<double> timeout_override{0.0};

// The text ncclGetLastError gives: the last error a call returned on this thread.
thread_local std::string last_error_text;

ncclResult_t fail(ncclResult_t code, std::string text) {
  last_error_text = std::move(text);
  return code;
}

std::size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    case ncclNumTypes: break;
  }
  return 0;
}

std::string type_name(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclNumTypes: break;
  }
  return "type " + std::to_string(static_cast<int>(type));
}

// "16 x ncclFloat32": what a rank passed.
std::string elements_text(std::size_t count, ncclDataType_t type) {
  return std::to_string(count) + " x " + type_name(type);
}

// "ranks 1, 3" / "rank 2".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

std::string seconds_text(double seconds) {
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text + " s";
}

std::chrono::steady_clock::time_point deadline() {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(nccl_timeout_seconds()));
}

// One rank's k-th collective on a communicator, as it passed it.
struct Post {
  std::size_t count = 0;
  ncclDataType_t type = ncclInt8;
  const void* sent = nullptr;
  void* received = nullptr;
};

// A send posted and not yet completed: its receiver copies it, then marks it taken.
struct Message {
  const void* data = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclInt8;
  bool taken = false;
};

// A communicator's shared state, one for all its ranks.
struct Clique {
  explicit Clique(int ranks) : size(ranks), devices(static_cast<std::size_t>(ranks), -1) {}

  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int> devices;  // [size] each rank's device, -1 until it has joined
  int joined = 0;
  struct Call {
    std::vector<std::optional<Post>> posts;  // [size]
    int arrived = 0;
    int copied = 0;
    int left = 0;
  };
  std::map<std::uint64_t, Call> calls;  // by the ranks' common call number
  // Sends posted and not yet taken, oldest first, by (sender, receiver).
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> in_flight;
  std::string failure;  // the first error of any rank's work: every waiter then throws it
};

// Throws the clique's failure, if any (the lock held).
void throw_if_failed(const Clique& clique) {
  if (!clique.failure.empty()) throw std::runtime_error(clique.failure);
}

// Runs one rank's queued work; an error it throws becomes the clique's failure (its peers' waits
// end with it) and, through streams.cpp, the stream's sticky error with its text.
template <class Work>
void run_for_rank(Clique& clique, Work&& work) {
  try {
    work();
  } catch (const std::exception& error) {
    const std::lock_guard lock(clique.mutex);
    if (clique.failure.empty()) clique.failure = std::string("cuda-sim NCCL: ") + error.what();
    clique.changed.notify_all();
    throw std::runtime_error(clique.failure);
  }
}

void copy_device_bytes(void* destination, const void* source, std::size_t bytes) {
  if (bytes == 0 || destination == source) return;
  std::memmove(destination, source, bytes);
  if (const auto* checks = device_memory_checks()) checks->copied(destination, source, bytes);
}

// Every rank's part into `post.received` at its place, once every rank has posted call `call`.
void all_gather(Clique& clique, int rank, std::uint64_t call, const Post& post) {
  const std::string what = "ncclAllGather (call " + std::to_string(call + 1) + " on the communicator)";
  std::unique_lock lock(clique.mutex);
  throw_if_failed(clique);
  Clique::Call& mine = clique.calls[call];
  if (mine.posts.empty()) mine.posts.resize(static_cast<std::size_t>(clique.size));
  mine.posts[static_cast<std::size_t>(rank)] = post;
  ++mine.arrived;
  clique.changed.notify_all();
  const auto until = deadline();
  const auto arrived = [&] { return !clique.failure.empty() || mine.arrived == clique.size; };
  if (!clique.changed.wait_until(lock, until, arrived)) {
    std::vector<int> missing;
    for (int other = 0; other < clique.size; ++other) {
      if (!mine.posts[static_cast<std::size_t>(other)]) missing.push_back(other);
    }
    throw std::runtime_error(what + " on rank " + std::to_string(rank) + ": " + ranks_text(missing) + " of " +
                             std::to_string(clique.size) + " never issued it within " +
                             seconds_text(nccl_timeout_seconds()));
  }
  throw_if_failed(clique);
  const std::vector<std::optional<Post>> posts = mine.posts;
  lock.unlock();
  for (int other = 0; other < clique.size; ++other) {
    const Post& theirs = *posts[static_cast<std::size_t>(other)];
    if (theirs.count != post.count || theirs.type != post.type) {
      throw std::runtime_error(what + ": rank " + std::to_string(rank) + " gathers " +
                               elements_text(post.count, post.type) + " a rank, rank " + std::to_string(other) +
                               " " + elements_text(theirs.count, theirs.type));
    }
  }
  const std::size_t bytes = post.count * type_bytes(post.type);
  for (int other = 0; other < clique.size; ++other) {
    copy_device_bytes(static_cast<char*>(post.received) + static_cast<std::size_t>(other) * bytes,
                      posts[static_cast<std::size_t>(other)]->sent, bytes);
  }
  // No rank leaves (and reuses its input) before every rank has read it.
  lock.lock();
  ++mine.copied;
  clique.changed.notify_all();
  const auto copied = [&] { return !clique.failure.empty() || mine.copied == clique.size; };
  if (!clique.changed.wait_until(lock, deadline(), copied)) {
    throw std::runtime_error(what + " on rank " + std::to_string(rank) + ": the other ranks never finished reading "
                             "within " + seconds_text(nccl_timeout_seconds()));
  }
  throw_if_failed(clique);
  if (++mine.left == clique.size) clique.calls.erase(call);
}

// One ncclSend or ncclRecv of a group.
struct PointToPoint {
  bool send = false;
  const void* sent = nullptr;
  void* received = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclInt8;
  int peer = -1;
};

// A group's sends posted, then its receives taken in order, then its sends waited for.
void exchange(Clique& clique, int rank, const std::vector<PointToPoint>& operations) {
  const std::string timeout = seconds_text(nccl_timeout_seconds());
  std::vector<std::pair<const PointToPoint*, std::shared_ptr<Message>>> sends;
  std::unique_lock lock(clique.mutex);
  throw_if_failed(clique);
  for (const PointToPoint& operation : operations) {
    if (!operation.send) continue;
    auto message = std::make_shared<Message>(Message{operation.sent, operation.count, operation.type, false});
    clique.in_flight[{rank, operation.peer}].push_back(message);
    sends.emplace_back(&operation, std::move(message));
  }
  clique.changed.notify_all();
  for (const PointToPoint& operation : operations) {
    if (operation.send) continue;
    auto& queue = clique.in_flight[{operation.peer, rank}];
    const std::string what = "ncclRecv on rank " + std::to_string(rank) + " of " +
                             elements_text(operation.count, operation.type) + " from rank " +
                             std::to_string(operation.peer);
    if (!clique.changed.wait_until(lock, deadline(), [&] { return !clique.failure.empty() || !queue.empty(); })) {
      throw std::runtime_error(what + ": no matching ncclSend within " + timeout);
    }
    throw_if_failed(clique);
    const std::shared_ptr<Message> message = queue.front();
    queue.pop_front();
    if (message->count != operation.count || message->type != operation.type) {
      throw std::runtime_error(what + ": rank " + std::to_string(operation.peer) + "'s ncclSend sends " +
                               elements_text(message->count, message->type));
    }
    lock.unlock();
    copy_device_bytes(operation.received, message->data, operation.count * type_bytes(operation.type));
    lock.lock();
    message->taken = true;
    clique.changed.notify_all();
  }
  for (const auto& [operation, message] : sends) {
    const auto taken = [&, &message = message] { return !clique.failure.empty() || message->taken; };
    if (!clique.changed.wait_until(lock, deadline(), taken)) {
      throw std::runtime_error("ncclSend on rank " + std::to_string(rank) + " of " +
                               elements_text(operation->count, operation->type) + " to rank " +
                               std::to_string(operation->peer) + ": no matching ncclRecv within " + timeout +
                               " (a send and a receive issued outside one group wait for each other, on NCCL too)");
    }
    throw_if_failed(clique);
  }
}

// Unique ids: a magic and a number; the cliques of ids whose ranks are still joining.
constexpr char kIdMagic[] = "tandem cuda-sim NCCL id";
struct Registry {
  std::mutex mutex;
  std::uint64_t issued = 0;
  std::map<std::uint64_t, std::shared_ptr<Clique>> joining;
};
Registry& registry() {
  static Registry* state = new Registry;  // never destroyed: ranks may join from detached threads
  return *state;
}

std::optional<std::uint64_t> id_number(const ncclUniqueId& id) {
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0) return std::nullopt;
  std::uint64_t number = 0;
  std::memcpy(&number, id.internal + sizeof(kIdMagic), sizeof(number));
  return number;
}

// The calls of this thread between ncclGroupStart and its ncclGroupEnd.
struct Group {
  int depth = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<PointToPoint> operations;
};
thread_local Group group;

}  // namespace

double nccl_timeout_seconds() {
  if (const double seconds = timeout_override.load(); seconds > 0) return seconds;
  const char* text = std::getenv("TANDEM_CUDA_SIM_NCCL_TIMEOUT");
  if (text == nullptr || *text == '\0') return 300.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*end != '\0' || !(seconds > 0)) {
    throw std::invalid_argument(std::string("TANDEM_CUDA_SIM_NCCL_TIMEOUT=") + text +
                                ": must be a number of seconds above 0");
  }
  return seconds;
}

void set_nccl_timeout_seconds(double seconds) { timeout_override.store(seconds); }

}  // namespace tandem::cuda_sim

struct ncclComm {
  std::shared_ptr<tandem::cuda_sim::Clique> clique;
  int rank = 0;
  int device = 0;
  std::uint64_t next_call = 0;  // the number of this rank's next collective
};

using tandem::cuda_sim::fail;

namespace {

// Queues a group's (or a lone call's) sends and receives on its stream.
ncclResult_t launch_exchange(ncclComm_t comm, cudaStream_t stream, std::vector<tandem::cuda_sim::PointToPoint> operations) {
  if (operations.empty()) return ncclSuccess;
  const cudaError_t status = tandem::cuda_sim::run_on_stream(
      stream, [clique = comm->clique, rank = comm->rank, operations = std::move(operations)] {
        tandem::cuda_sim::run_for_rank(*clique, [&] { tandem::cuda_sim::exchange(*clique, rank, operations); });
      });
  if (status != cudaSuccess) return fail(ncclUnhandledCudaError, std::string("the stream: ") + cudaGetErrorString(status));
  return ncclSuccess;
}

// What every data call checks first: a communicator, a known type, a peer of the communicator.
ncclResult_t check_call(const char* call, ncclComm_t comm, ncclDataType_t type, const void* buffer, std::size_t count) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(call) + ": the communicator is null");
  if (tandem::cuda_sim::type_bytes(type) == 0) {
    return fail(ncclInvalidArgument, std::string(call) + ": " + tandem::cuda_sim::type_name(type) + " is not a type");
  }
  if (buffer == nullptr && count > 0) return fail(ncclInvalidArgument, std::string(call) + ": the buffer is null");
  return ncclSuccess;
}

ncclResult_t point_to_point(const char* call, tandem::cuda_sim::PointToPoint operation, ncclComm_t comm,
                            cudaStream_t stream) {
  const void* buffer = operation.send ? operation.sent : operation.received;
  if (const ncclResult_t result = check_call(call, comm, operation.type, buffer, operation.count); result != ncclSuccess) {
    return result;
  }
  if (operation.peer < 0 || operation.peer >= comm->clique->size) {
    return fail(ncclInvalidArgument, std::string(call) + " on rank " + std::to_string(comm->rank) + ": peer " +
                                         std::to_string(operation.peer) + " is not a rank of the communicator's " +
                                         std::to_string(comm->clique->size));
  }
  auto& group = tandem::cuda_sim::group;
  if (group.depth == 0) return launch_exchange(comm, stream, {operation});
  if (group.operations.empty()) {
    group.comm = comm;
    group.stream = stream;
  } else if (group.comm != comm || group.stream != stream) {
    return fail(ncclInvalidUsage, std::string(call) + ": cuda-sim runs a group's calls on one communicator and one "
                                  "stream; this group already has another");
  }
  group.operations.push_back(operation);
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (a rank never arrived)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t) { return tandem::cuda_sim::last_error_text.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: the id is null");
  auto& ids = tandem::cuda_sim::registry();
  const std::lock_guard lock(ids.mutex);
  const std::uint64_t number = ++ids.issued;
  *unique_id = ncclUniqueId{};
  std::memcpy(unique_id->internal, tandem::cuda_sim::kIdMagic, sizeof(tandem::cuda_sim::kIdMagic));
  std::memcpy(unique_id->internal + sizeof(tandem::cuda_sim::kIdMagic), &number, sizeof(number));
  return ncclSuccess;
}

// Blocks until all `ranks` have joined, as NCCL's does; the rank's device is the calling thread's.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int ranks, ncclUniqueId unique_id, int rank) {
  using namespace tandem::cuda_sim;
  const std::string what = "ncclCommInitRank(rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ")";
  if (comm == nullptr) return fail(ncclInvalidArgument, what + ": comm is null");
  if (ranks < 1 || rank < 0 || rank >= ranks) return fail(ncclInvalidArgument, what + ": the rank is not in [0, ranks)");
  if (group.depth > 0) return fail(ncclInvalidUsage, what + ": inside a group (not implemented by cuda-sim)");
  try {
    if (stream_mode() != StreamMode::threads) {
      return fail(ncclInvalidUsage, what + ": needs TANDEM_CUDA_SIM_STREAMS=threads (a rank's collective waits on its "
                                           "stream for its peers; in " + describe(stream_mode()) +
                                           " mode one host would run every rank's work)");
    }
  } catch (const std::exception& error) {
    return fail(ncclInvalidUsage, what + ": " + error.what());
  }
  const std::optional<std::uint64_t> number = id_number(unique_id);
  if (!number) return fail(ncclInvalidArgument, what + ": the id is not one of ncclGetUniqueId's");
  const int device = current_device();
  std::shared_ptr<Clique> clique;
  {
    auto& ids = registry();
    const std::lock_guard lock(ids.mutex);
    auto& joining = ids.joining[*number];
    if (!joining) joining = std::make_shared<Clique>(ranks);
    clique = joining;
  }
  std::unique_lock lock(clique->mutex);
  if (clique->size != ranks) {
    return fail(ncclInvalidUsage, what + ": another rank joined this id's communicator of " +
                                      std::to_string(clique->size) + " ranks");
  }
  if (clique->devices[static_cast<std::size_t>(rank)] >= 0) return fail(ncclInvalidUsage, what + ": joined twice");
  for (int other = 0; other < ranks; ++other) {
    if (clique->devices[static_cast<std::size_t>(other)] == device) {
      return fail(ncclInvalidUsage, what + ": duplicate GPU detected: rank " + std::to_string(rank) + " and rank " +
                                        std::to_string(other) + " both on cuda-sim device " + std::to_string(device) +
                                        " (fix: cudaSetDevice to a device of its own on each rank's thread)");
    }
  }
  clique->devices[static_cast<std::size_t>(rank)] = device;
  ++clique->joined;
  clique->changed.notify_all();
  if (!clique->changed.wait_until(lock, deadline(), [&] { return clique->joined == ranks; })) {
    std::vector<int> missing;
    for (int other = 0; other < ranks; ++other) {
      if (clique->devices[static_cast<std::size_t>(other)] < 0) missing.push_back(other);
    }
    return fail(ncclSystemError, what + ": " + ranks_text(missing) + " never joined within " +
                                     seconds_text(nccl_timeout_seconds()));
  }
  lock.unlock();
  {
    auto& ids = registry();
    const std::lock_guard registry_lock(ids.mutex);
    ids.joining.erase(*number);  // an id makes one communicator
  }
  *comm = new ncclComm{std::move(clique), rank, device, 0};
  return ncclSuccess;
}

// Work already queued keeps the communicator's shared state alive until it has run.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommDestroy: the communicator is null");
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sent, void* received, std::size_t sent_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  using namespace tandem::cuda_sim;
  if (const ncclResult_t result = check_call("ncclAllGather", comm, type, received, sent_count); result != ncclSuccess) {
    return result;
  }
  if (sent == nullptr && sent_count > 0) return fail(ncclInvalidArgument, "ncclAllGather: the input is null");
  if (group.depth > 0) {
    return fail(ncclInvalidUsage, "ncclAllGather inside a group: not implemented by cuda-sim (the project issues its "
                                  "collectives one at a time)");
  }
  const std::uint64_t call = comm->next_call++;
  const cudaError_t status = run_on_stream(
      stream, [clique = comm->clique, rank = comm->rank, call, post = Post{sent_count, type, sent, received}] {
        run_for_rank(*clique, [&] { all_gather(*clique, rank, call, post); });
      });
  if (status != cudaSuccess) return fail(ncclUnhandledCudaError, std::string("the stream: ") + cudaGetErrorString(status));
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sent, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point("ncclSend", {true, sent, nullptr, count, type, peer}, comm, stream);
}

ncclResult_t ncclRecv(void* received, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point("ncclRecv", {false, nullptr, received, count, type, peer}, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++tandem::cuda_sim::group.depth;
  return ncclSuccess;
}

// The outermost end queues the group's calls as one piece of work on their stream.
ncclResult_t ncclGroupEnd() {
  auto& group = tandem::cuda_sim::group;
  if (group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without an ncclGroupStart");
  if (--group.depth > 0) return ncclSuccess;
  std::vector<tandem::cuda_sim::PointToPoint> operations = std::move(group.operations);
  group.operations.clear();
  const ncclComm_t comm = group.comm;
  const cudaStream_t stream = group.stream;
  group.comm = nullptr;
  group.stream = nullptr;
  if (operations.empty()) return ncclSuccess;
  return launch_exchange(comm, stream, std::move(operations));
}
