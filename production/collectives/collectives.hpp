// How the data-parallel ranks of the production trainer exchange data. The trainer
// (production/trainer.hpp) is written once against `Collectives`; the implementations differ only
// in transport:
//   - one rank:        single_rank_collectives() (every exchange is the identity);
//   - MPI ranks:       mpi.hpp (mpirun / srun; host memory: the cpu backend, and CI);
//   - NCCL:            nccl.hpp (device memory on the cuda backend; MPI is the control plane);
//   - threads:         thread_group.hpp (several ranks inside one process, for the tests and the
//                      equivalence harness; host memory).
// None of them reduces: every exchange only moves bytes, and the trainer sums what it receives in
// a fixed order with its backend's own ops. So the result of a reduction is the same bits on every
// transport, and a run is bitwise reproducible whatever algorithm MPI or NCCL would pick.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "production/arithmetic.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

// One rank's part of a point-to-point exchange (pipeline stages): each send's `bytes` of `data`
// to rank `to`, each receive's `bytes` into `data` from rank `from`. Messages from one rank to
// another arrive in the order they were sent (across calls, and in `sends` order within one) and
// are taken in `receives` order: two stages may send each other two messages in one call (the
// interleaved schedule's step with PP = 2). Memory of the trainer's backend.
struct PeerSend {
  const void* data = nullptr;
  std::int64_t bytes = 0;
  int to = -1;
};
struct PeerReceive {
  void* data = nullptr;
  std::int64_t bytes = 0;
  int from = -1;
};
struct PeerExchange {
  std::vector<PeerSend> sends;
  std::vector<PeerReceive> receives;
  bool empty() const { return sends.empty() && receives.empty(); }
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  Collectives() = default;
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // For the log header: "one rank", "MPI (host memory), 4 ranks", "threads of one process, 2
  // ranks", "NCCL 22703 (device memory) + MPI control, 8 ranks".
  virtual std::string description() const = 0;

  // Control plane, host memory, every rank calls it with the same `count`:
  // received[r * count + i] = rank r's sent[i]. Counts and partial sums of a step.
  virtual void all_gather_host(const double* sent, double* received, std::int64_t count) = 0;

  // Data plane, memory of the trainer's backend: one step of a ring. This rank sends `count`
  // floats to rank `to` and receives `count` floats from rank `from` into `received`; every rank
  // calls it together, and the pairs fit (the rank this one sends to receives from it). The
  // reduce-scatter of the main gradients is size() - 1 such steps (the trainer sums as it goes).
  virtual void send_receive(const Real* sent, int to, Real* received, int from, std::int64_t count) = 0;

  // Data plane, in place: `buffer` is [size, chunk_bytes]; afterwards every rank holds every
  // rank's part r (its bytes [r * chunk_bytes, (r + 1) * chunk_bytes)) as that rank had it.
  virtual void all_gather_in_place(void* buffer, std::int64_t chunk_bytes) = 0;

  // Data plane, point to point: only the ranks a message names take part (not the whole group).
  // Messages between two ranks arrive in the order they were sent; the receiver must expect the
  // sender's byte count. The send and the receive progress together, so two ranks may send to each
  // other in one call each. Returns when this rank's received bytes are in place and its sent
  // memory may be reused.
  virtual void exchange_with_peers(const PeerExchange& exchange) = 0;

  virtual void barrier() = 0;

  // Whether a thread other than the one that made these collectives may call them (never two at
  // once): a cpu backend's lane (comm_lane.hpp) exchanges on its worker thread when true.
  virtual bool callable_from_other_threads() const { return true; }
};

// The identity: one rank, nothing to exchange.
std::shared_ptr<Collectives> single_rank_collectives();

// all_gather_host on a vector: [size() * values.size()] in rank order.
std::vector<double> all_gather_values(Collectives& collectives, std::span<const double> values);

// Every rank's `text`, in rank order (each rank may send a different length). For short control
// messages (a path, an error, a file's digest): every byte travels as one double.
std::vector<std::string> all_gather_strings(Collectives& collectives, const std::string& text);

}  // namespace tandem::production
