// MPI ranks (mpi.hpp).
#include "production/collectives/mpi.hpp"

#include <mpi.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

void check(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(status, message, &length);
  throw std::runtime_error(std::string(call) + " failed: " + std::string(message, static_cast<std::size_t>(length)));
}

int int_count(std::int64_t count, const char* exchange) {
  if (count < 0 || count > INT_MAX) {
    throw std::runtime_error(std::string(exchange) + ": " + std::to_string(count) +
                             " elements exceed MPI's int counts; fix: more data-parallel ranks, or "
                             "the cuda backend (NCCL)");
  }
  return static_cast<int>(count);
}

class MpiCollectives final : public Collectives {
 public:
  // `communicator` is MPI_COMM_WORLD, or a sub-communicator this object owns and frees.
  MpiCollectives(MPI_Comm communicator, bool owned, std::string name)
      : communicator_(communicator), owned_(owned), name_(std::move(name)) {
    check(MPI_Comm_rank(communicator_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(communicator_, &size_), "MPI_Comm_size");
  }
  ~MpiCollectives() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&communicator_);  // status deliberately ignored
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string description() const override {
    return "MPI (host memory), " + (name_.empty() ? "" : name_ + " of ") + std::to_string(size_) + " ranks";
  }
  void all_gather_host(const double* sent, double* received, std::int64_t count) override {
    const int n = int_count(count, "all_gather_host");
    check(MPI_Allgather(sent, n, MPI_DOUBLE, received, n, MPI_DOUBLE, communicator_), "MPI_Allgather");
  }
  void send_receive(const Real* sent, int to, Real* received, int from, std::int64_t count) override {
    const int n = int_count(count, "send_receive");
    constexpr int kTag = 0;  // one exchange at a time: the ranks call it in the same order
    const MPI_Datatype real = kSemanticBuild ? MPI_DOUBLE : MPI_FLOAT;  // arithmetic.hpp
    check(MPI_Sendrecv(sent, n, real, to, kTag, received, n, real, from, kTag, communicator_,
                       MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  }
  void all_gather_in_place(void* buffer, std::int64_t chunk_bytes) override {
    const int n = int_count(chunk_bytes, "all_gather_in_place");
    check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, n, MPI_BYTE, communicator_),
          "MPI_Allgather");
  }
  // Nonblocking sends and receives, waited together: two ranks may send to each other at once.
  // MPI keeps the order of messages between two ranks with one tag (it does not overtake).
  void exchange_with_peers(const PeerExchange& exchange) override {
    constexpr int kPeerTag = 1;  // apart from send_receive's ring steps
    const std::size_t receives = exchange.receives.size();
    std::vector<MPI_Request> requests(receives + exchange.sends.size(), MPI_REQUEST_NULL);
    for (std::size_t i = 0; i < receives; ++i) {
      const PeerReceive& receive = exchange.receives[i];
      check(MPI_Irecv(receive.data, int_count(receive.bytes, "exchange_with_peers"), MPI_BYTE, receive.from,
                      kPeerTag, communicator_, &requests[i]),
            "MPI_Irecv");
    }
    for (std::size_t i = 0; i < exchange.sends.size(); ++i) {
      const PeerSend& send = exchange.sends[i];
      check(MPI_Isend(send.data, int_count(send.bytes, "exchange_with_peers"), MPI_BYTE, send.to, kPeerTag,
                      communicator_, &requests[receives + i]),
            "MPI_Isend");
    }
    std::vector<MPI_Status> statuses(requests.size());
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), statuses.data()), "MPI_Waitall");
    for (std::size_t i = 0; i < receives; ++i) {
      int count = 0;
      check(MPI_Get_count(&statuses[i], MPI_BYTE, &count), "MPI_Get_count");
      if (count != exchange.receives[i].bytes) {
        throw std::runtime_error("exchange_with_peers: rank " + std::to_string(exchange.receives[i].from) + " sent " +
                                 std::to_string(count) + " bytes where " +
                                 std::to_string(exchange.receives[i].bytes) + " were expected");
      }
    }
  }
  void barrier() override { check(MPI_Barrier(communicator_), "MPI_Barrier"); }
  bool callable_from_other_threads() const override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_MULTIPLE;
  }

 private:
  MPI_Comm communicator_ = MPI_COMM_NULL;
  bool owned_ = false;
  std::string name_;  // "tensor group"; empty for the world
  int rank_ = 0;
  int size_ = 1;
};

void require_session(const char* caller) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw std::logic_error(std::string(caller) + ": no active MpiSession");
}

}  // namespace

bool launched_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

MpiSession::MpiSession(bool force) {
  if (!force && !launched_by_mpi_launcher()) return;
  int initialized = 0;
  check(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) throw std::logic_error("MpiSession: MPI is already initialized (one session per process)");
  // A rank outlives its launcher only as an orphan that goes on training and saving, racing the
  // job's restart: when the launcher (mpirun, or srun's step daemon) dies, the kernel kills this
  // rank. Its last checkpoint is intact (saves are atomic).
  const pid_t launcher = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) ::raise(SIGKILL);
  int provided = 0;
  // Multiple: a lane's worker (comm_lane.hpp) exchanges the data-parallel buckets while the main
  // thread goes on with the tensor- and pipeline-parallel exchanges of the backward, two threads
  // in MPI at once; an MPI that offers less makes the cpu backend's lanes run inline.
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  active_ = true;
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(node, &local_size_), "MPI_Comm_size");
  MPI_Comm_free(&node);
}

MpiSession::~MpiSession() {
  if (active_) MPI_Finalize();  // a destructor does not throw; the status is deliberately ignored
}

void MpiSession::barrier() const {
  if (active_) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void MpiSession::abort(int exit_code) const {
  if (active_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

std::shared_ptr<Collectives> make_mpi_collectives() {
  require_session("make_mpi_collectives");
  return std::make_shared<MpiCollectives>(MPI_COMM_WORLD, false, std::string());
}

std::shared_ptr<Collectives> make_mpi_group_collectives(const RankGrid& grid, RankGroupKind kind) {
  require_session("make_mpi_group_collectives");
  int world_rank = 0;
  int world_size = 1;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size");
  if (grid.world_size() != world_size) {
    throw std::invalid_argument("make_mpi_group_collectives: the grid " + grid.describe() + " does not hold the " +
                                std::to_string(world_size) + " ranks the launcher started");
  }
  const std::int64_t index = grid.group_index(kind, world_rank);
  // The key orders a group's members by world rank, so a member's rank in the communicator is its
  // index in grid.members(kind, rank).
  MPI_Comm group = MPI_COMM_NULL;
  check(MPI_Comm_split(MPI_COMM_WORLD, index < 0 ? MPI_UNDEFINED : static_cast<int>(index), world_rank, &group),
        "MPI_Comm_split");
  if (group == MPI_COMM_NULL) return nullptr;
  check(MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  auto made = std::make_shared<MpiCollectives>(group, true, std::string(to_string(kind)) + " group");
  if (made->rank() != grid.rank_in_group(kind, world_rank)) {
    throw std::logic_error("make_mpi_group_collectives: MPI numbered world rank " + std::to_string(world_rank) +
                           " as " + std::to_string(made->rank()) + " in its " + to_string(kind) + " group, the grid as " +
                           std::to_string(grid.rank_in_group(kind, world_rank)));
  }
  return made;
}

}  // namespace tandem::production
