// NCCL data plane, MPI control plane (nccl.hpp).
#include "production/collectives/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "production/collectives/mpi.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

void check(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(status) + " (" +
                             ncclGetLastError(nullptr) + ")");
  }
}

class NcclCollectives final : public Collectives {
 public:
  // Over the ranks of `control` (host-memory collectives: MPI_COMM_WORLD or a grid group), which
  // also carries the unique id from the group's first rank to the others.
  NcclCollectives(Backend& backend, std::shared_ptr<Collectives> control)
      : control_(std::move(control)), backend_(&backend) {
    std::vector<ncclUniqueId> ids(static_cast<std::size_t>(control_->size()));  // [ranks]; rank 0's is used
    if (control_->rank() == 0) check(ncclGetUniqueId(&ids[0]), "ncclGetUniqueId");
    control_->all_gather_in_place(ids.data(), static_cast<std::int64_t>(sizeof(ncclUniqueId)));
    check(ncclCommInitRank(&comm_, control_->size(), ids[0], control_->rank()), "ncclCommInitRank");
  }
  ~NcclCollectives() override { ncclCommDestroy(comm_); }  // status deliberately ignored

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  std::string description() const override {
    int version = 0;
    ncclGetVersion(&version);
    return "NCCL " + std::to_string(version) + " (device memory) + control by " + control_->description();
  }
  void all_gather_host(const double* sent, double* received, std::int64_t count) override {
    control_->all_gather_host(sent, received, count);
  }
  // A send and a receive fused in one group (NCCL's sendrecv form), so neither blocks the other.
  void send_receive(const Real* sent, int to, Real* received, int from, std::int64_t count) override {
    const auto elements = static_cast<std::size_t>(count);
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(sent, elements, ncclFloat32, to, comm_, stream()), "ncclSend");
    check(ncclRecv(received, elements, ncclFloat32, from, comm_, stream()), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
  }
  void all_gather_in_place(void* buffer, std::int64_t chunk_bytes) override {
    auto* bytes = static_cast<char*>(buffer);
    check(ncclAllGather(bytes + static_cast<std::size_t>(rank()) * static_cast<std::size_t>(chunk_bytes), bytes,
                        static_cast<std::size_t>(chunk_bytes), ncclInt8, comm_, stream()),
          "ncclAllGather");
  }
  // NCCL's grouped sends and receives: none blocks another; operations between two ranks are
  // matched in the order they are issued.
  void exchange_with_peers(const PeerExchange& exchange) override {
    check(ncclGroupStart(), "ncclGroupStart");
    for (const PeerSend& send : exchange.sends) {
      check(ncclSend(send.data, static_cast<std::size_t>(send.bytes), ncclInt8, send.to, comm_, stream()), "ncclSend");
    }
    for (const PeerReceive& receive : exchange.receives) {
      check(ncclRecv(receive.data, static_cast<std::size_t>(receive.bytes), ncclInt8, receive.from, comm_, stream()),
            "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }
  void barrier() override {
    if (const cudaError_t status = cudaStreamSynchronize(stream()); status != cudaSuccess) {
      throw std::runtime_error(std::string("cudaStreamSynchronize failed: ") + cudaGetErrorString(status));
    }
    control_->barrier();
  }

 private:
  // The backend's current stream: its own, or a lane's while the lane's work is issued
  // (comm_lane.hpp).
  cudaStream_t stream() const { return static_cast<cudaStream_t>(backend_->cuda_stream()); }

  std::shared_ptr<Collectives> control_;
  Backend* backend_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::shared_ptr<Collectives> make_nccl_collectives(Backend& backend, std::shared_ptr<Collectives> control) {
  if (backend.device() != Device::cuda) {
    throw std::invalid_argument("make_nccl_collectives: NCCL moves device memory; the backend is " +
                                to_string(backend.device()));
  }
  if (!control) control = make_mpi_collectives();
  return std::make_shared<NcclCollectives>(backend, std::move(control));
}

}  // namespace tandem::production
