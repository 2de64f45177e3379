// gemm_cuda (kernels/gemm.hpp) through cuBLASLt, with the policy of gemm_cublaslt.hpp.
// Row-major C[m, n] = op(A) op(B) is computed as the column-major C^T[n, m] = op(B)^T op(A)^T:
// cuBLASLt's A is our B and its B is our A, each described as stored.
#include "production/cuda/gemm_cublaslt.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "production/cuda/check.hpp"
#include "production/kernels/gemm.hpp"

namespace tandem::cuda::inline TANDEM_CUDA_TARGET {
namespace {

using production::DType;
using production::GemmParams;
using production::Transpose;

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }
const char* dtype_name(DType dtype) { return dtype == DType::f32 ? "f32" : "bf16"; }

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment preference).
std::uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// Everything the algorithm choice depends on.
struct PlanKey {
  void* handle = nullptr;
  std::int64_t m = 0, n = 0, k = 0;
  DType ab = DType::f32, c = DType::f32;
  Transpose ta = Transpose::no, tb = Transpose::no;
  bool reads_c = false;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0;
  auto tie() const { return std::tie(handle, m, n, k, ab, c, ta, tb, reads_c, align_a, align_b, align_c); }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

// A chosen algorithm with its descriptors (owned; destroyed with the process's plan table).
struct Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A: our B as stored
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B: our A as stored
  cublasLtMatrixLayout_t layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct PlanTable {
  std::mutex mutex;
  std::map<PlanKey, Plan> plans;
  std::vector<std::string> log;
};

PlanTable& plan_table() {
  static PlanTable* table = new PlanTable;  // never destroyed: handles may outlive static teardown
  return *table;
}

template <class Value>
Value algo_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  Value value{};
  std::size_t written = 0;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof(value), &written));
  return value;
}

std::string describe(const PlanKey& key) {
  std::ostringstream text;
  text << "m=" << key.m << " n=" << key.n << " k=" << key.k << " A=" << dtype_name(key.ab) << "/"
       << (key.ta == Transpose::yes ? "T" : "N") << " B=" << dtype_name(key.ab) << "/"
       << (key.tb == Transpose::yes ? "T" : "N") << " C=" << dtype_name(key.c) << " beta="
       << (key.reads_c ? "nonzero" : "0") << " align=" << key.align_a << "/" << key.align_b << "/" << key.align_c;
  return text.str();
}

Plan make_plan(const PlanKey& key) {
  Plan plan;
  const auto lt = static_cast<cublasLtHandle_t>(key.handle);
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's op(A) is op(B)^T: stored B [k, n] (no) is column-major [n, k] as is; stored [n, k]
  // (yes) is column-major [k, n], transposed.
  const cublasOperation_t trans_a = key.tb == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = key.ta == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const auto rows_a = static_cast<std::uint64_t>(key.tb == Transpose::yes ? key.k : key.n);
  const auto cols_a = static_cast<std::uint64_t>(key.tb == Transpose::yes ? key.n : key.k);
  const auto rows_b = static_cast<std::uint64_t>(key.ta == Transpose::yes ? key.m : key.k);
  const auto cols_b = static_cast<std::uint64_t>(key.ta == Transpose::yes ? key.k : key.m);
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_a, cuda_type(key.ab), rows_a, cols_a, static_cast<std::int64_t>(rows_a)));
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_b, cuda_type(key.ab), rows_b, cols_b, static_cast<std::int64_t>(rows_b)));
  TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.layout_c, cuda_type(key.c), static_cast<std::uint64_t>(key.n),
                                                 static_cast<std::uint64_t>(key.m), key.n));

  cublasLtMatmulPreference_t preference = nullptr;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const auto workspace = static_cast<std::uint64_t>(kGemmWorkspaceBytes);
  const std::uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_NONE;
  // cuBLASLt's A is our B and its B our A.
  const std::uint32_t align_a = key.align_b, align_b = key.align_a, align_c = key.align_c;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask, sizeof(reduction_mask)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, plan.operation, plan.layout_a, plan.layout_b, plan.layout_c,
                                                               plan.layout_c, preference, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    // No plan is kept: its descriptors go before the error (teardown statuses ignored).
    cublasLtMatrixLayoutDestroy(plan.layout_c);
    cublasLtMatrixLayoutDestroy(plan.layout_b);
    cublasLtMatrixLayoutDestroy(plan.layout_a);
    cublasLtMatmulDescDestroy(plan.operation);
    throw std::runtime_error("gemm_cuda: cuBLASLt has no algorithm for " + describe(key) +
                             " with reduction scheme none and a " + std::to_string(kGemmWorkspaceBytes >> 20) +
                             " MiB workspace (status " + std::to_string(static_cast<int>(status)) + ", " +
                             std::to_string(returned) +
                             " results); fix: use supported dtypes (bf16 x bf16 -> f32/bf16, f32 x f32 -> f32) "
                             "or aligned buffers; tandem does not fall back silently");
  }
  plan.algo = result.algo;
  std::ostringstream line;
  line << describe(key) << ": algo " << algo_attribute<int>(plan.algo, CUBLASLT_ALGO_CONFIG_ID) << " tile "
       << algo_attribute<std::uint32_t>(plan.algo, CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
       << algo_attribute<std::uint32_t>(plan.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID) << " splitk "
       << algo_attribute<std::uint32_t>(plan.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) << " reduction "
       << algo_attribute<std::uint32_t>(plan.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) << " swizzle "
       << algo_attribute<std::uint32_t>(plan.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) << " custom "
       << algo_attribute<std::uint32_t>(plan.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) << " waves "
       << result.wavesCount << " workspace " << result.workspaceSize;
  plan_table().log.push_back(line.str());
  return plan;
}

}  // namespace

std::string gemm_policy() {
  return "cuBLASLt " + std::to_string(cublasLtGetVersion()) +
         ", heuristic top-1 per shape, compute 32F, reduction scheme none, workspace " +
         std::to_string(kGemmWorkspaceBytes >> 20) + " MiB";
}

std::string gemm_algorithm_log() {
  PlanTable& table = plan_table();
  const std::lock_guard lock(table.mutex);
  std::string text;
  for (const std::string& line : table.log) text += line + "\n";
  return text;
}

}  // namespace tandem::cuda::inline TANDEM_CUDA_TARGET

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void gemm_cuda(const GemmParams& p, const CudaLaunch& launch) {
  if (p.a.dtype != p.b.dtype) {
    throw std::invalid_argument("gemm: A and B must share a dtype (both f32 or both bf16)");
  }
  if (p.m <= 0 || p.n <= 0) return;
  if (launch.blas_handle == nullptr) throw std::invalid_argument("gemm_cuda: the launch has no cuBLASLt handle");
  if (launch.workspace == nullptr || launch.workspace_bytes < cuda::kGemmWorkspaceBytes) {
    throw std::invalid_argument("gemm_cuda: needs a workspace of " + std::to_string(cuda::kGemmWorkspaceBytes) +
                                " bytes, the launch has " + std::to_string(launch.workspace_bytes));
  }
  if (p.k <= 0) {
    throw std::invalid_argument("gemm_cuda: k must be > 0 (got " + std::to_string(p.k) + ")");
  }
  cuda::PlanKey key;
  key.handle = launch.blas_handle;
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.ab = p.a.dtype;
  key.c = p.c_dtype;
  key.ta = p.a.transpose;
  key.tb = p.b.transpose;
  key.reads_c = p.beta != 0.0f;
  key.align_a = cuda::alignment_of(p.a.data);
  key.align_b = cuda::alignment_of(p.b.data);
  key.align_c = cuda::alignment_of(p.c);
  cuda::PlanTable& table = cuda::plan_table();
  const std::lock_guard lock(table.mutex);
  auto found = table.plans.find(key);
  if (found == table.plans.end()) found = table.plans.emplace(key, cuda::make_plan(key)).first;
  const cuda::Plan& plan = found->second;
  const float alpha = p.alpha;
  const float beta = p.beta;
  // cuBLASLt's A is our B, its B our A; C and D are the same matrix (beta 0: C is not read).
  TANDEM_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(launch.blas_handle), plan.operation, &alpha,
                                     p.b.data, plan.layout_a, p.a.data, plan.layout_b, &beta, p.c, plan.layout_c, p.c,
                                     plan.layout_c, &plan.algo, launch.workspace,
                                     static_cast<std::size_t>(cuda::kGemmWorkspaceBytes),
                                     static_cast<cudaStream_t>(launch.stream)));
}

}  // namespace tandem::production
