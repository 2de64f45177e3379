// NCCL data plane, MPI control plane (nccl.hpp).
#include "production/collectives/nccl.hpp"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "production/collectives/mpi.hpp"

namespace tandem::production {
namespace {

void check(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(status));
  }
}

class NcclCollectives final : public Collectives {
 public:
  explicit NcclCollectives(Backend& backend)
      : control_(make_mpi_collectives()), backend_(&backend) {
    ncclUniqueId id{};
    if (control_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
      throw std::runtime_error("MPI_Bcast of the NCCL unique id failed");
    }
    check(ncclCommInitRank(&comm_, control_->size(), id, control_->rank()), "ncclCommInitRank");
  }
  ~NcclCollectives() override { ncclCommDestroy(comm_); }  // status deliberately ignored

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  std::string description() const override {
    int version = 0;
    ncclGetVersion(&version);
    return "NCCL " + std::to_string(version) + " (device memory) + MPI control, " +
           std::to_string(size()) + " ranks";
  }
  void all_gather_host(const double* sent, double* received, std::int64_t count) override {
    control_->all_gather_host(sent, received, count);
  }
  // A send and a receive fused in one group (NCCL's sendrecv form), so neither blocks the other.
  void send_receive(const float* sent, int to, float* received, int from, std::int64_t count) override {
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
  void barrier() override {
    if (cudaStreamSynchronize(stream()) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize failed");
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

std::shared_ptr<Collectives> make_nccl_collectives(Backend& backend) {
  if (backend.device() != Device::cuda) {
    throw std::invalid_argument("make_nccl_collectives: NCCL moves device memory; the backend is " +
                                to_string(backend.device()));
  }
  return std::make_shared<NcclCollectives>(backend);
}

}  // namespace tandem::production
