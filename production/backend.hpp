// The production backend interface: where memory lives and every operation one production step
// needs. The trainer (production/trainer.hpp) is written once against `Backend`; two backends
// implement it with the same orchestration:
//   - cpu:  production/host/host_backend.cpp, calling the host twins `*_host(params)`;
//   - cuda: production/cuda/cuda_backend.cpp (the CUDA side), calling the CUDA twins
//           `*_cuda(params, launch)`. It exists when that file does: production/CMakeLists.txt
//           then defines TANDEM_HAVE_CUDA_BACKEND and make_backend(Device::cuda) builds it.
// Each op's params struct, its exact semantics and both twins' entry points are declared in
// production/kernels/<op>.hpp; the host twin sits beside the CUDA one (kernels/<op>_host.cpp and
// kernels/<op>.cu, STYLE "each CUDA kernel sits beside its host twin").
//
// Rules every backend keeps (SPEC 7, the determinism contract):
//   - compute dtype f32 (default) or bf16 (--bf16) for activations and compute weights; inside an
//     op everything is fp32 and the ONLY roundings are the stores of compute-typed outputs
//     (types.hpp's bf16_from_f32), so the cpu backend rounds exactly where the cuda one does;
//   - main weights, main gradients (accumulated over microbatches), m and v are fp32;
//   - no float atomics in reductions; every reduction has a fixed order, so a run is bitwise
//     reproducible on the same backend;
//   - ops run in call order on one stream; memory copies to the host synchronize.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "production/arithmetic.hpp"
#include "production/comm_lane.hpp"
#include "production/kernels/attention.hpp"
#include "production/kernels/cross_entropy.hpp"
#include "production/kernels/elementwise.hpp"
#include "production/kernels/embedding.hpp"
#include "production/kernels/gemm.hpp"
#include "production/kernels/optimizer.hpp"
#include "production/kernels/rmsnorm.hpp"
#include "production/kernels/rope.hpp"
#include "production/kernels/swiglu.hpp"
#include "production/kernels/types.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

enum class Device { cpu, cuda };
std::string to_string(Device device);  // "cpu" | "cuda"

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual Device device() const = 0;
  // For the log header: "cpu (host, 2 threads, avx512 kernels)" or "NVIDIA H200 (sm_90, 139 GiB)".
  virtual std::string description() const = 0;
  // Dense peak FLOP/s of the device for GEMMs with these inputs, for MFU (docs/PRODUCTION.md);
  // 0 when unknown (the cpu backend): the log then carries "mfu": null.
  virtual double peak_flops_per_second(DType compute) const = 0;

  // Memory owned by this backend (host memory for cpu, device memory for cuda). Use Buffer<T>.
  virtual void* allocate(std::int64_t bytes) = 0;          // zero-filled; throws on failure
  virtual void release(void* memory) noexcept = 0;
  virtual void fill_zero(void* memory, std::int64_t bytes) = 0;
  virtual void copy_from_host(void* destination, const void* host_source, std::int64_t bytes) = 0;
  virtual void copy_to_host(void* host_destination, const void* source, std::int64_t bytes) = 0;
  virtual void copy(void* destination, const void* source, std::int64_t bytes) = 0;
  virtual void synchronize() = 0;  // waits for every op issued so far
  // The cudaStream_t every op runs on (NCCL enqueues there); null for the cpu backend. While a
  // lane's work is issued, the lane's stream.
  virtual void* cuda_stream() const { return nullptr; }
  // A lane for work beside this backend's ops (comm_lane.hpp); the cpu backend's runs on a worker
  // thread when `worker_thread` (the collectives allow it), else inline.
  virtual std::unique_ptr<CommLane> make_comm_lane(bool worker_thread) = 0;

  // The step's operations (production/kernels/*.hpp say exactly what each computes).
  virtual void embedding_forward(const EmbeddingForwardParams& params) = 0;
  virtual void embedding_backward(const EmbeddingBackwardParams& params) = 0;
  virtual void rmsnorm_forward(const RmsnormForwardParams& params) = 0;
  virtual void rmsnorm_backward(const RmsnormBackwardParams& params) = 0;
  virtual void rope_table(const RopeTableParams& params) = 0;
  virtual void rope_forward(const RopeParams& params) = 0;
  virtual void rope_backward(const RopeParams& params) = 0;
  virtual void swiglu_forward(const SwigluForwardParams& params) = 0;
  virtual void swiglu_backward(const SwigluBackwardParams& params) = 0;
  virtual void attention_forward(const AttentionForwardParams& params) = 0;
  virtual void attention_backward(const AttentionBackwardParams& params) = 0;
  virtual void cross_entropy(const CrossEntropyParams& params) = 0;
  virtual void vocab_parallel_cross_entropy(const VocabParallelCrossEntropyParams& params) = 0;
  virtual void gemm(const GemmParams& params) = 0;
  virtual void convert(const ConvertParams& params) = 0;
  virtual void add(const AddParams& params) = 0;
  virtual void bias_add(const BiasAddParams& params) = 0;
  virtual void bias_grad(const BiasGradParams& params) = 0;
  virtual void squared_norm(const SquaredNormParams& params) = 0;
  virtual void adamw(const AdamwParams& params) = 0;
  virtual void scale(const ScaleParams& params) = 0;

  // Bytes held in this backend's Buffers now, and the most held at once so far: what the trainer
  // keeps (docs/PRODUCTION.md "Memory"; the cuda backend's own workspaces and the CUDA context
  // are not counted). Buffer reports its allocations here.
  std::int64_t bytes_in_use() const { return in_use_.load(); }
  std::int64_t peak_bytes_in_use() const { return peak_.load(); }
  void account(std::int64_t bytes) {
    const std::int64_t now = in_use_.fetch_add(bytes) + bytes;
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }

 private:
  std::atomic<std::int64_t> in_use_{0};
  std::atomic<std::int64_t> peak_{0};
};

// A typed, owning handle to `size` elements of backend memory (zero-filled at creation).
// Move-only; the memory goes back to its backend when the handle dies. T is Real, Bf16, double,
// std::int32_t or std::uint8_t.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, std::int64_t size)
      : backend_(&backend),
        data_(size > 0 ? static_cast<T*>(backend.allocate(size * static_cast<std::int64_t>(sizeof(T))))
                       : nullptr),
        size_(size) {
    if (data_ != nullptr) backend.account(bytes());
  }
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~Buffer() {
    if (backend_ != nullptr && data_ != nullptr) {
      backend_->release(data_);
      backend_->account(-bytes());
    }
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  T* at(std::int64_t offset) { return data_ + offset; }  // element `offset` (no bounds check)
  const T* at(std::int64_t offset) const { return data_ + offset; }
  std::int64_t size() const { return size_; }
  std::int64_t bytes() const { return size_ * static_cast<std::int64_t>(sizeof(T)); }

  void zero() {
    if (size_ > 0) backend_->fill_zero(data_, bytes());
  }
  // Whole-buffer copies between host vectors and backend memory (sizes must match).
  void upload(std::span<const T> host);
  std::vector<T> download() const;
  // Elements [offset, offset + count) to the host (e.g. audited elements).
  std::vector<T> download(std::int64_t offset, std::int64_t count) const;

 private:
  void swap(Buffer& other) noexcept {
    std::swap(backend_, other.backend_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  std::int64_t size_ = 0;
};

template <class T>
void Buffer<T>::upload(std::span<const T> host) {
  if (static_cast<std::int64_t>(host.size()) != size_) {
    throw std::invalid_argument("Buffer::upload: " + std::to_string(host.size()) +
                                " host elements for a buffer of " + std::to_string(size_));
  }
  if (size_ > 0) backend_->copy_from_host(data_, host.data(), bytes());
}

template <class T>
std::vector<T> Buffer<T>::download() const {
  return download(0, size_);
}

template <class T>
std::vector<T> Buffer<T>::download(std::int64_t offset, std::int64_t count) const {
  if (offset < 0 || count < 0 || offset + count > size_) {
    throw std::out_of_range("Buffer::download: [" + std::to_string(offset) + ", " +
                            std::to_string(offset + count) + ") outside a buffer of " +
                            std::to_string(size_));
  }
  std::vector<T> host(static_cast<std::size_t>(count));
  if (count > 0) {
    backend_->copy_to_host(host.data(), data_ + offset, count * static_cast<std::int64_t>(sizeof(T)));
  }
  return host;
}

// A compute-typed buffer: `size` elements of f32 or bf16 chosen at run time (--bf16), for the
// activations and compute weights whose type the ops take as a DType.
class ComputeBuffer {
 public:
  ComputeBuffer() = default;
  ComputeBuffer(Backend& backend, DType dtype, std::int64_t size)
      : dtype_(dtype), size_(size), bytes_(backend, size * dtype_bytes(dtype)) {}
  DType dtype() const { return dtype_; }
  std::int64_t size() const { return size_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  void* at(std::int64_t element) { return bytes_.data() + element * dtype_bytes(dtype_); }
  const void* at(std::int64_t element) const { return bytes_.data() + element * dtype_bytes(dtype_); }

 private:
  DType dtype_ = DType::f32;
  std::int64_t size_ = 0;
  Buffer<std::uint8_t> bytes_;
};

// Whether this build holds the cuda backend (production/cuda/cuda_backend.cpp).
bool cuda_backend_built();

// Which host kernels the cpu backend runs: the shipped, blocked ones, or the plain statements of
// the same arithmetic one value at a time (gemm_host_ordered, attention_*_host_ordered), which
// give the same bits, slowly: tests and benchmarks compare the two.
enum class HostKernels { fast, ordered };

// The backend for `device` (for cuda, on CUDA device `device_index`: a rank's local rank; for
// cpu, with `host_kernels` on `cpu_threads` threads). Device::cuda throws std::runtime_error naming the
// CUDA error when no device answers, and in the semantic build (Real = double), which has no cuda backend.
std::unique_ptr<Backend> make_backend(Device device, int device_index = 0, HostKernels host_kernels = HostKernels::fast,
                                      int cpu_threads = 1);

// The cpu backend (host twins), always built: the fast kernels split a GEMM's tiles and
// attention's (sample, group) pairs among `threads` threads (kernels/host_workers.hpp; the same
// bits for every count; >= 1).
std::unique_ptr<Backend> make_host_backend(HostKernels kernels = HostKernels::fast, int threads = 1);

// Defined by production/cuda/cuda_backend.cpp, on CUDA device `device_index`.
std::unique_ptr<Backend> make_cuda_backend(int device_index);

}  // namespace tandem::production
