// The cuda backend (backend.hpp): device memory through cudaMalloc (zero-filled), one stream on
// which every op runs in call order, one cuBLASLt handle and one fixed workspace shared by the ops
// (they run one after another on the stream). Each op calls its CUDA twin *_cuda(params, launch)
// from production/kernels/; every CUDA call is checked (check.hpp names the call and the error).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "production/backend.hpp"
#include "production/cuda/check.hpp"
#include "production/cuda/device.hpp"
#include "production/cuda/gemm_cublaslt.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

// Scratch for every op: the GEMM's fixed cuBLASLt workspace and the kernels' (the embedding's
// sort, RMSNorm's weight-gradient partials, attention's D): 256 MiB, checked by each op.
constexpr std::int64_t kWorkspaceBytes = std::int64_t{256} << 20;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index) : device_index_(device_index) {
    TANDEM_CUDA_CHECK(cudaSetDevice(device_index_));
    TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&properties_, device_index_));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cublasLtHandle_t handle = nullptr;
    TANDEM_CUBLAS_CHECK(cublasLtCreate(&handle));
    blas_ = handle;
    TANDEM_CUDA_CHECK(cudaMalloc(&workspace_, static_cast<std::size_t>(kWorkspaceBytes)));
    launch_.stream = stream_;
    launch_.workspace = workspace_;
    launch_.workspace_bytes = kWorkspaceBytes;
    launch_.blas_handle = blas_;
  }

  ~CudaBackend() override {
    // Destructors do not throw: the status of these teardown calls is deliberately ignored.
    cudaStreamSynchronize(stream_);
    cudaFree(workspace_);
    cublasLtDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda; }

  std::string description() const override {
    return tandem::cuda::device_description(device_index_) + "; gemm: " + tandem::cuda::gemm_policy();
  }

  // Dense tensor-core peak for bf16, the CUDA-core fp32 rate for f32 (GEMMs in true fp32), by the
  // vendor's datasheets for the SXM parts (PCIe and NVL parts run at other clocks and power);
  // 0 (unknown, "mfu": null) for any other device.
  double peak_flops_per_second(DType compute) const override {
    const std::string name = properties_.name;
    const bool hopper_sxm = properties_.major == 9 && properties_.minor == 0 &&
                            (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) &&
                            name.find("PCIe") == std::string::npos && name.find("NVL") == std::string::npos;
    if (!hopper_sxm) return 0.0;
    return compute == DType::bf16 ? 989.4e12 : 66.9e12;
  }

  void* allocate(std::int64_t bytes) override {
    if (bytes <= 0) return nullptr;
    void* memory = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&memory, static_cast<std::size_t>(bytes)));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(memory, 0, static_cast<std::size_t>(bytes), stream_));
    return memory;
  }
  void release(void* memory) noexcept override {
    if (memory == nullptr) return;
    cudaStreamSynchronize(stream_);  // an op issued before may still read it
    cudaFree(memory);
  }
  void fill_zero(void* memory, std::int64_t bytes) override {
    if (bytes > 0) TANDEM_CUDA_CHECK(cudaMemsetAsync(memory, 0, static_cast<std::size_t>(bytes), stream_));
  }
  void copy_from_host(void* destination, const void* host_source, std::int64_t bytes) override {
    if (bytes <= 0) return;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(destination, host_source, static_cast<std::size_t>(bytes),
                                      cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may die after the call
  }
  void copy_to_host(void* host_destination, const void* source, std::int64_t bytes) override {
    if (bytes <= 0) return;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(host_destination, source, static_cast<std::size_t>(bytes),
                                      cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(void* destination, const void* source, std::int64_t bytes) override {
    if (bytes <= 0) return;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(destination, source, static_cast<std::size_t>(bytes),
                                      cudaMemcpyDeviceToDevice, stream_));
  }
  void* cuda_stream() const override { return stream_; }
  std::unique_ptr<CommLane> make_comm_lane(bool) override;
  void synchronize() override { TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void embedding_forward(const EmbeddingForwardParams& p) override { embedding_forward_cuda(p, launch_); }
  void embedding_backward(const EmbeddingBackwardParams& p) override { embedding_backward_cuda(p, launch_); }
  void rmsnorm_forward(const RmsnormForwardParams& p) override { rmsnorm_forward_cuda(p, launch_); }
  void rmsnorm_backward(const RmsnormBackwardParams& p) override { rmsnorm_backward_cuda(p, launch_); }
  void rope_table(const RopeTableParams& p) override { rope_table_cuda(p, launch_); }
  void rope_forward(const RopeParams& p) override { rope_forward_cuda(p, launch_); }
  void rope_backward(const RopeParams& p) override { rope_backward_cuda(p, launch_); }
  void swiglu_forward(const SwigluForwardParams& p) override { swiglu_forward_cuda(p, launch_); }
  void swiglu_backward(const SwigluBackwardParams& p) override { swiglu_backward_cuda(p, launch_); }
  void attention_forward(const AttentionForwardParams& p) override { attention_forward_cuda(p, launch_); }
  void attention_backward(const AttentionBackwardParams& p) override { attention_backward_cuda(p, launch_); }
  void cross_entropy(const CrossEntropyParams& p) override { cross_entropy_cuda(p, launch_); }
  void vocab_parallel_cross_entropy(const VocabParallelCrossEntropyParams& p) override {
    vocab_parallel_cross_entropy_cuda(p, launch_);
  }
  void gemm(const GemmParams& p) override { gemm_cuda(p, launch_); }
  void convert(const ConvertParams& p) override { convert_cuda(p, launch_); }
  void add(const AddParams& p) override { add_cuda(p, launch_); }
  void bias_add(const BiasAddParams& p) override { bias_add_cuda(p, launch_); }
  void bias_grad(const BiasGradParams& p) override { bias_grad_cuda(p, launch_); }
  void squared_norm(const SquaredNormParams& p) override { squared_norm_cuda(p, launch_); }
  void adamw(const AdamwParams& p) override { adamw_cuda(p, launch_); }
  void scale(const ScaleParams& p) override { scale_cuda(p, launch_); }

 private:
  int device_index_ = 0;
  cudaDeviceProp properties_{};
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  CudaLaunch launch_;

  friend class StreamLane;
};

// A second stream (comm_lane.hpp): submit makes it wait for the ops issued so far (an event),
// issues the work's ops with the backend's current stream switched to it, and records the
// ticket's event; wait makes the backend's stream wait for that event. No host thread blocks.
// The side stream runs its work in order, so once the backend's stream waits for ticket t it is
// behind every ticket <= t: their events are free again (a stream wait captures the event's state
// when it is called), and a later wait for one of them has nothing left to do.
class StreamLane final : public CommLane {
 public:
  explicit StreamLane(CudaBackend& backend) : backend_(backend) {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  }
  ~StreamLane() override {
    // Destructors do not throw: teardown statuses are deliberately ignored.
    cudaStreamSynchronize(side_);
    for (cudaEvent_t event : free_) cudaEventDestroy(event);
    for (const auto& pending : pending_) cudaEventDestroy(pending.second);
    cudaStreamDestroy(side_);
  }
  Ticket submit(std::function<void()> work) override {
    cudaEvent_t issued = take_event();
    TANDEM_CUDA_CHECK(cudaEventRecord(issued, backend_.stream_));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(side_, issued, 0));
    free_.push_back(issued);
    cudaStream_t compute = backend_.stream_;
    const auto restore = [&] {
      backend_.stream_ = compute;
      backend_.launch_.stream = compute;
    };
    backend_.stream_ = side_;
    backend_.launch_.stream = side_;
    try {
      work();
    } catch (...) {
      restore();
      throw;
    }
    restore();
    cudaEvent_t done = take_event();
    TANDEM_CUDA_CHECK(cudaEventRecord(done, side_));
    pending_.emplace_back(++submitted_, done);
    return submitted_;
  }
  void wait(Ticket ticket) override {
    if (ticket <= waited_) return;
    for (const auto& [pending_ticket, event] : pending_) {
      if (pending_ticket == ticket) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(backend_.stream_, event, 0));
    }
    waited_ = ticket;
    while (!pending_.empty() && pending_.front().first <= ticket) {
      free_.push_back(pending_.front().second);
      pending_.pop_front();
    }
  }
  const char* description() const override { return "second cuda stream"; }

 private:
  cudaEvent_t take_event() {
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return event;
    }
    cudaEvent_t event = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }

  CudaBackend& backend_;
  cudaStream_t side_ = nullptr;
  std::vector<cudaEvent_t> free_;
  std::deque<std::pair<Ticket, cudaEvent_t>> pending_;  // tickets not yet waited for, in order
  Ticket waited_ = 0;
};

std::unique_ptr<CommLane> CudaBackend::make_comm_lane(bool) { return std::make_unique<StreamLane>(*this); }

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace tandem::production
