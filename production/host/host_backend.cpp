// The cpu backend (backend.hpp): host memory and the host twins of every op, in call order on the
// calling thread. The same orchestration as the cuda backend, so CI (no GPU) runs production code.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "production/backend.hpp"
#include "production/kernels/host_workers.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

class HostBackend final : public Backend {
 public:
  // Reads TANDEM_HOST_SIMD now (gemm.hpp), so that a wrong name stops the run before it starts.
  HostBackend(HostKernels kernels, int threads) : kernels_(kernels), workers_(threads) { host_simd(); }
  Device device() const override { return Device::cpu; }
  // "cpu (host, 2 threads, avx512 kernels)": the thread count and the vector path the processor's
  // features chose (gemm.hpp), or "ordered kernels" (one thread: the ordered kernels use no workers).
  std::string description() const override {
    if (kernels_ == HostKernels::ordered) return "cpu (host, 1 thread, ordered kernels)";
    const int threads = workers_.threads();
    return "cpu (host, " + std::to_string(threads) + (threads == 1 ? " thread, " : " threads, ") +
           host_simd_name(host_simd()) + " kernels)";
  }
  double peak_flops_per_second(DType) const override { return 0.0; }  // unknown: no MFU

  void* allocate(std::int64_t bytes) override {
    // 64-byte alignment (a cache line), rounded up as aligned_alloc requires.
    constexpr std::size_t kAlignment = 64;
    const std::size_t rounded = (static_cast<std::size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
    void* memory = std::aligned_alloc(kAlignment, rounded);
    if (memory == nullptr) throw std::bad_alloc();
    std::memset(memory, 0, rounded);
    return memory;
  }
  void release(void* memory) noexcept override { std::free(memory); }
  void fill_zero(void* memory, std::int64_t bytes) override {
    std::memset(memory, 0, static_cast<std::size_t>(bytes));
  }
  void copy_from_host(void* destination, const void* host_source, std::int64_t bytes) override {
    std::memcpy(destination, host_source, static_cast<std::size_t>(bytes));
  }
  void copy_to_host(void* host_destination, const void* source, std::int64_t bytes) override {
    std::memcpy(host_destination, source, static_cast<std::size_t>(bytes));
  }
  void copy(void* destination, const void* source, std::int64_t bytes) override {
    std::memmove(destination, source, static_cast<std::size_t>(bytes));
  }
  void synchronize() override {}
  std::unique_ptr<CommLane> make_comm_lane(bool worker_thread) override {
    return worker_thread ? make_thread_lane() : make_inline_lane();
  }

  void embedding_forward(const EmbeddingForwardParams& p) override { embedding_forward_host(p); }
  void embedding_backward(const EmbeddingBackwardParams& p) override { embedding_backward_host(p); }
  void rmsnorm_forward(const RmsnormForwardParams& p) override { rmsnorm_forward_host(p); }
  void rmsnorm_backward(const RmsnormBackwardParams& p) override { rmsnorm_backward_host(p); }
  void rope_table(const RopeTableParams& p) override { rope_table_host(p); }
  void rope_forward(const RopeParams& p) override { rope_forward_host(p); }
  void rope_backward(const RopeParams& p) override { rope_backward_host(p); }
  void swiglu_forward(const SwigluForwardParams& p) override { swiglu_forward_host(p); }
  void swiglu_backward(const SwigluBackwardParams& p) override { swiglu_backward_host(p); }
  void attention_forward(const AttentionForwardParams& p) override {
    kernels_ == HostKernels::fast ? attention_forward_host(p, &workers_) : attention_forward_host_ordered(p);
  }
  void attention_backward(const AttentionBackwardParams& p) override {
    kernels_ == HostKernels::fast ? attention_backward_host(p, &workers_) : attention_backward_host_ordered(p);
  }
  void cross_entropy(const CrossEntropyParams& p) override { cross_entropy_host(p); }
  void vocab_parallel_cross_entropy(const VocabParallelCrossEntropyParams& p) override {
    vocab_parallel_cross_entropy_host(p);
  }
  void gemm(const GemmParams& p) override {
    kernels_ == HostKernels::fast ? gemm_host(p, &workers_) : gemm_host_ordered(p);
  }
  void convert(const ConvertParams& p) override { convert_host(p); }
  void add(const AddParams& p) override { add_host(p); }
  void bias_add(const BiasAddParams& p) override { bias_add_host(p); }
  void bias_grad(const BiasGradParams& p) override { bias_grad_host(p); }
  void squared_norm(const SquaredNormParams& p) override { squared_norm_host(p); }
  void adamw(const AdamwParams& p) override { adamw_host(p); }
  void scale(const ScaleParams& p) override { scale_host(p); }

 private:
  HostKernels kernels_;
  HostWorkers workers_;  // the fast GEMM's and attention's threads (--cpu-threads)
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(HostKernels kernels, int threads) {
  return std::make_unique<HostBackend>(kernels, threads);
}

}  // namespace tandem::production
