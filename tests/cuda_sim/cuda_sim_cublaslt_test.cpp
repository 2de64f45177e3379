// cuda-sim's cuBLASLt (cuda_sim/cublaslt.cpp) and the GEMM's cuda twin that ships on it
// (production/cuda/gemm_cublaslt.cpp's gemm_cuda):
//   - gemm_cuda gives the host twin gemm_host_ordered's bits (exact: the sim sums k in increasing
//     order, as the host does) for every transpose, dtype and beta, on odd shapes with m, n, k
//     all different, and beta == 0 never reads C (NaN there does not leak);
//   - the stand-in's own API computes cuBLASLt's column-major product by its definition (exact on
//     dyadic inputs), independently of gemm_cuda's mapping to it;
//   - everything the project does not use is CUBLAS_STATUS_NOT_SUPPORTED, malformed requests are
//     INVALID_VALUE or NOT_INITIALIZED as cuBLASLt documents them, and gemm_cuda's error when the
//     heuristic has no algorithm names the shape;
//   - gemm_algorithm_log lists each shape once, with the algorithm's configuration.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "production/cuda/gemm_cublaslt.hpp"
#include "production/kernels/gemm.hpp"
#include "tests/support/op_comparison.hpp"

namespace tandem::production {
namespace {

using namespace op_comparison;
static_assert(!kSemanticBuild, "cuda-sim's GEMM runs in fp32, as on the device");

// Values the stand-in does not declare, with cublas_api.h's / library_types.h's numbers.
constexpr auto kComputeTf32 = static_cast<cublasComputeType_t>(77);      // CUBLAS_COMPUTE_32F_FAST_TF32
constexpr auto kCompute16F = static_cast<cublasComputeType_t>(64);       // CUBLAS_COMPUTE_16F
constexpr auto kCompute32FPedantic = static_cast<cublasComputeType_t>(69);  // CUBLAS_COMPUTE_32F_PEDANTIC
constexpr auto kCudaR16F = static_cast<cudaDataType_t>(2);                // CUDA_R_16F
constexpr auto kDescEpilogue = static_cast<cublasLtMatmulDescAttributes_t>(7);  // CUBLASLT_MATMUL_DESC_EPILOGUE
constexpr auto kPrefSearchMode = static_cast<cublasLtMatmulPreferenceAttributes_t>(0);  // ..._PREF_SEARCH_MODE
constexpr auto kAlgoInnerShape = static_cast<cublasLtMatmulAlgoConfigAttributes_t>(7);  // ..._INNER_SHAPE_ID
constexpr auto kOpC = static_cast<std::int32_t>(2);                       // CUBLAS_OP_C

const char* dtype_name(DType dtype) { return dtype == DType::f32 ? "f32" : "bf16"; }
const char* transpose_name(Transpose transpose) { return transpose == Transpose::yes ? "T" : "N"; }
cudaDataType_t cuda_type(DType dtype) { return dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

struct Shape {
  std::int64_t m, n, k;
};
// Odd and all different (a swapped m and n or a k read as m changes the shape of the answer).
constexpr Shape kShapes[] = {{7, 5, 13}, {3, 11, 4}, {1, 6, 9}, {8, 2, 1}};

class SimCublasLt : public ::testing::Test {
 protected:
  void SetUp() override {
    cudaDeviceReset();
    ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    launch_.blas_handle = handle_;
    launch_.workspace = workspace().data();
    launch_.workspace_bytes = static_cast<std::int64_t>(workspace().size());
  }
  void TearDown() override {
    EXPECT_EQ(cublasLtDestroy(handle_), CUBLAS_STATUS_SUCCESS);
    cudaDeviceReset();
  }
  // gemm_cuda's fixed workspace (host memory: cuda-sim's device memory is the host's).
  static std::vector<std::uint8_t>& workspace() {
    static std::vector<std::uint8_t> bytes(static_cast<std::size_t>(cuda::kGemmWorkspaceBytes));
    return bytes;
  }

  cublasLtHandle_t handle_ = nullptr;
  CudaLaunch launch_;
};

// ---- gemm_cuda against the host twin ------------------------------------------------------------

TEST_F(SimCublasLt, GemmCudaGivesTheHostTwinsBitsForEveryTransposeDtypeAndBeta) {
  std::mt19937 generator(kSeed);
  int cases = 0;
  for (const Shape& shape : kShapes) {
    for (const DType ab : {DType::f32, DType::bf16}) {
      for (const DType c_dtype : {DType::f32, DType::bf16}) {
        if (ab == DType::f32 && c_dtype == DType::bf16) continue;  // f32 x f32 -> f32 only
        for (const Transpose ta : {Transpose::no, Transpose::yes}) {
          for (const Transpose tb : {Transpose::no, Transpose::yes}) {
            for (const float beta : {0.0f, 1.0f}) {
              // Uniform values: the sums round, so a different order or a misread operand shows.
              const HostArray a(ab, uniform(generator, shape.m * shape.k, -1.0f, 1.0f));
              const HostArray b(ab, uniform(generator, shape.k * shape.n, -1.0f, 1.0f));
              // beta == 0: C holds NaN, which must not be read.
              const HostArray c0 = beta == 0.0f
                                       ? HostArray(c_dtype, std::vector<float>(static_cast<std::size_t>(shape.m * shape.n),
                                                                               std::numeric_limits<float>::quiet_NaN()))
                                       : HostArray(c_dtype, uniform(generator, shape.m * shape.n, -1.0f, 1.0f));
              HostArray host_c = c0, sim_c = c0;
              GemmParams params{shape.m, shape.n, shape.k, {a.data(), ab, ta}, {b.data(), ab, tb}, host_c.data(),
                                c_dtype, 0.5f, beta};
              gemm_host_ordered(params);
              params.c = sim_c.data();
              gemm_cuda(params, launch_);
              std::ostringstream name;
              name << "gemm_cuda m=" << shape.m << " n=" << shape.n << " k=" << shape.k << " A=" << dtype_name(ab) << "/"
                   << transpose_name(ta) << " B=" << dtype_name(ab) << "/" << transpose_name(tb)
                   << " C=" << dtype_name(c_dtype) << " beta=" << beta;
              for (std::int64_t i = 0; i < sim_c.size(); ++i) {
                ASSERT_FALSE(std::isnan(sim_c.at(i))) << name.str() << ": element " << i << " is NaN";
              }
              const Verdict verdict = compare_bits(name.str(), host_c.bytes, sim_c.bytes,
                                                   static_cast<int>(dtype_bytes(c_dtype)));
              EXPECT_TRUE(verdict.ok) << verdict.report;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 3 * 4 * 2);
}

// Exact on dyadic inputs (k/4, |k| <= 8: every product and sum of <= 13 terms is exact in fp32),
// against the definition written from the stored arrays, not through any GEMM.
TEST_F(SimCublasLt, GemmCudaEqualsTheDefinitionOnDyadicInputs) {
  std::mt19937 generator(kSeed);
  for (const Shape& shape : kShapes) {
    for (const DType ab : {DType::f32, DType::bf16}) {
      const DType c_dtype = ab;
      for (const Transpose ta : {Transpose::no, Transpose::yes}) {
        for (const Transpose tb : {Transpose::no, Transpose::yes}) {
          const std::vector<float> av = dyadic(generator, shape.m * shape.k, 8, 2);
          const std::vector<float> bv = dyadic(generator, shape.k * shape.n, 8, 2);
          const std::vector<float> cv = dyadic(generator, shape.m * shape.n, 8, 2);
          const HostArray a(ab, av), b(ab, bv);
          HostArray c(c_dtype, cv);
          const float alpha = 0.5f, beta = 1.0f;
          gemm_cuda({shape.m, shape.n, shape.k, {a.data(), ab, ta}, {b.data(), ab, tb}, c.data(), c_dtype, alpha, beta},
                    launch_);
          for (std::int64_t i = 0; i < shape.m; ++i) {
            for (std::int64_t j = 0; j < shape.n; ++j) {
              double sum = 0;
              for (std::int64_t l = 0; l < shape.k; ++l) {
                // op(A)[i][l]: A stored [m, k], or [k, m] when transposed; op(B)[l][j] likewise.
                const double a_il = av[static_cast<std::size_t>(ta == Transpose::no ? i * shape.k + l : l * shape.m + i)];
                const double b_lj = bv[static_cast<std::size_t>(tb == Transpose::no ? l * shape.n + j : j * shape.k + l)];
                sum += a_il * b_lj;
              }
              const std::size_t index = static_cast<std::size_t>(i * shape.n + j);
              const float expected = round_to(c_dtype, static_cast<float>(alpha * sum + beta * cv[index]));
              ASSERT_EQ(c.at(static_cast<std::int64_t>(index)), expected)
                  << "m=" << shape.m << " n=" << shape.n << " k=" << shape.k << " " << dtype_name(ab) << " ta="
                  << transpose_name(ta) << " tb=" << transpose_name(tb) << " C[" << i << "][" << j << "]";
            }
          }
        }
      }
    }
  }
}

// Negative control: the comparison tells a transposed operand apart (square, so both shapes run).
TEST_F(SimCublasLt, TheBitwiseComparisonRejectsAnOperandReadTransposed) {
  std::mt19937 generator(kSeed);
  const std::int64_t size = 6;
  const HostArray a(DType::f32, uniform(generator, size * size, -1.0f, 1.0f));
  const HostArray b(DType::f32, uniform(generator, size * size, -1.0f, 1.0f));
  HostArray host_c(DType::f32, size * size), sim_c(DType::f32, size * size);
  gemm_host_ordered({size, size, size, {a.data(), DType::f32, Transpose::no}, {b.data(), DType::f32, Transpose::yes},
                     host_c.data(), DType::f32, 1.0f, 0.0f});
  gemm_cuda({size, size, size, {a.data(), DType::f32, Transpose::no}, {b.data(), DType::f32, Transpose::no},
             sim_c.data(), DType::f32, 1.0f, 0.0f},
            launch_);
  EXPECT_FALSE(compare_bits("control", host_c.bytes, sim_c.bytes, 4).ok);
}

// ---- The stand-in's API as cuBLASLt's callers see it --------------------------------------------

// Descriptors for D = alpha op(A) op(B) + beta C, column-major and dense, destroyed at the end.
struct Descriptors {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    cublasLtMatmulDescDestroy(operation);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulPreferenceDestroy(preference);
  }
};

// m x n = op(A) [m x k] op(B) [k x n], column-major: A stored m x k (N) or k x m (T), ld = rows.
void describe(Descriptors& d, const Shape& shape, cublasOperation_t trans_a, cublasOperation_t trans_b, DType ab,
              DType c_dtype) {
  ASSERT_EQ(cublasLtMatmulDescCreate(&d.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
            CUBLAS_STATUS_SUCCESS);
  const auto rows_a = static_cast<std::uint64_t>(trans_a == CUBLAS_OP_T ? shape.k : shape.m);
  const auto cols_a = static_cast<std::uint64_t>(trans_a == CUBLAS_OP_T ? shape.m : shape.k);
  const auto rows_b = static_cast<std::uint64_t>(trans_b == CUBLAS_OP_T ? shape.n : shape.k);
  const auto cols_b = static_cast<std::uint64_t>(trans_b == CUBLAS_OP_T ? shape.k : shape.n);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.a, cuda_type(ab), rows_a, cols_a, static_cast<std::int64_t>(rows_a)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.b, cuda_type(ab), rows_b, cols_b, static_cast<std::int64_t>(rows_b)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.c, cuda_type(c_dtype), static_cast<std::uint64_t>(shape.m),
                                       static_cast<std::uint64_t>(shape.n), shape.m),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&d.preference), CUBLAS_STATUS_SUCCESS);
  // Host vectors are aligned to their element, not to cuBLASLt's default 256 bytes.
  const std::uint32_t alignment = 4;
  for (const auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, attribute, &alignment, sizeof(alignment)),
              CUBLAS_STATUS_SUCCESS);
  }
}

cublasStatus_t heuristic(cublasLtHandle_t handle, Descriptors& d, int* returned) {
  return cublasLtMatmulAlgoGetHeuristic(handle, d.operation, d.a, d.b, d.c, d.c, d.preference, 1, &d.result, returned);
}

TEST_F(SimCublasLt, MatmulComputesTheColumnMajorProductByItsDefinitionForEveryTranspose) {
  std::mt19937 generator(kSeed);
  const Shape shape{7, 5, 13};
  for (const cublasOperation_t trans_a : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (const cublasOperation_t trans_b : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      Descriptors d;
      describe(d, shape, trans_a, trans_b, DType::f32, DType::f32);
      int returned = 0;
      ASSERT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(returned, 1);
      EXPECT_EQ(d.result.state, CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(d.result.workspaceSize, 0u);
      EXPECT_EQ(d.result.wavesCount, 1.0f);
      const std::vector<float> a = dyadic(generator, shape.m * shape.k, 8, 2);
      const std::vector<float> b = dyadic(generator, shape.k * shape.n, 8, 2);
      const std::vector<float> c0 = dyadic(generator, shape.m * shape.n, 8, 2);
      std::vector<float> c = c0;
      const float alpha = 2.0f, beta = -1.0f;
      ASSERT_EQ(cublasLtMatmul(handle_, d.operation, &alpha, a.data(), d.a, b.data(), d.b, &beta, c.data(), d.c,
                               c.data(), d.c, &d.result.algo, nullptr, 0, nullptr),
                CUBLAS_STATUS_SUCCESS);
      // Column-major: element (r, s) of a rows x cols matrix is at r + s * rows.
      const auto op_a = [&](std::int64_t i, std::int64_t l) {
        return trans_a == CUBLAS_OP_N ? a[static_cast<std::size_t>(i + l * shape.m)]
                                      : a[static_cast<std::size_t>(l + i * shape.k)];
      };
      const auto op_b = [&](std::int64_t l, std::int64_t j) {
        return trans_b == CUBLAS_OP_N ? b[static_cast<std::size_t>(l + j * shape.k)]
                                      : b[static_cast<std::size_t>(j + l * shape.n)];
      };
      for (std::int64_t i = 0; i < shape.m; ++i) {
        for (std::int64_t j = 0; j < shape.n; ++j) {
          double sum = 0;
          for (std::int64_t l = 0; l < shape.k; ++l) sum += static_cast<double>(op_a(i, l)) * op_b(l, j);
          const std::size_t index = static_cast<std::size_t>(i + j * shape.m);
          ASSERT_EQ(c[index], static_cast<float>(alpha * sum + beta * c0[index]))
              << "transa=" << trans_a << " transb=" << trans_b << " D(" << i << ", " << j << ")";
        }
      }
    }
  }
}

TEST_F(SimCublasLt, TheAlgorithmsConfigurationHasCublasLtsSizesAndFixedValues) {
  Descriptors d;
  describe(d, {7, 5, 13}, CUBLAS_OP_N, CUBLAS_OP_N, DType::bf16, DType::f32);
  int returned = 0;
  ASSERT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_SUCCESS);
  const struct {
    cublasLtMatmulAlgoConfigAttributes_t attribute;
    std::uint32_t value;
  } expected[] = {{CUBLASLT_ALGO_CONFIG_ID, 0},          {CUBLASLT_ALGO_CONFIG_TILE_ID, 0},
                  {CUBLASLT_ALGO_CONFIG_STAGES_ID, 0},   {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1},
                  {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_REDUCTION_SCHEME_NONE},
                  {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 0}, {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 0}};
  for (const auto& [attribute, value] : expected) {
    std::uint32_t read = 99;
    std::size_t written = 0;
    ASSERT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&d.result.algo, attribute, &read, sizeof(read), &written),
              CUBLAS_STATUS_SUCCESS)
        << "attribute " << attribute;
    EXPECT_EQ(read, value) << "attribute " << attribute;
    EXPECT_EQ(written, 4u) << "attribute " << attribute;
    // Size 0 asks for the size; any other wrong size is refused.
    written = 0;
    EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&d.result.algo, attribute, nullptr, 0, &written), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(written, 4u);
    EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&d.result.algo, attribute, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
    std::uint64_t wide = 0;
    EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&d.result.algo, attribute, &wide, sizeof(wide), &written),
              CUBLAS_STATUS_INVALID_VALUE);
  }
  std::uint16_t inner_shape = 0;
  EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&d.result.algo, kAlgoInnerShape, &inner_shape, sizeof(inner_shape),
                                                 nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const cublasLtMatmulAlgo_t not_from_the_heuristic{};
  std::uint32_t read = 0;
  EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&not_from_the_heuristic, CUBLASLT_ALGO_CONFIG_ID, &read, sizeof(read),
                                                 nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
}

// ---- Refusals -----------------------------------------------------------------------------------

TEST_F(SimCublasLt, ComputeAndScaleTypesOtherThanTrueFp32AreNotSupported) {
  cublasLtMatmulDesc_t desc = nullptr;
  for (const cublasComputeType_t compute : {kComputeTf32, kCompute16F, kCompute32FPedantic}) {
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), CUBLAS_STATUS_NOT_SUPPORTED) << compute;
    EXPECT_EQ(desc, nullptr);
  }
  EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_16BF), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulDescCreate(nullptr, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(SimCublasLt, DescriptorAttributesOutsideTheProjectsAreNotSupportedAndWrongSizesInvalid) {
  Descriptors d;
  ASSERT_EQ(cublasLtMatmulDescCreate(&d.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const std::uint32_t epilogue_default = 1;  // CUBLASLT_EPILOGUE_DEFAULT
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d.operation, kDescEpilogue, &epilogue_default, sizeof(epilogue_default)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const std::int64_t wide = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSB, &kOpC, sizeof(kOpC)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const std::int32_t no_operation = 9;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSB, &no_operation, sizeof(no_operation)),
            CUBLAS_STATUS_INVALID_VALUE);
  const cublasOperation_t transposed = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(nullptr, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof(transposed)),
            CUBLAS_STATUS_INVALID_VALUE);

  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&d.preference), CUBLAS_STATUS_SUCCESS);
  const std::uint32_t search_mode = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, kPrefSearchMode, &search_mode, sizeof(search_mode)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  const std::uint32_t narrow_workspace = 1024;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &narrow_workspace, sizeof(narrow_workspace)),
            CUBLAS_STATUS_INVALID_VALUE);
  const std::uint64_t wide_alignment = 16;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &wide_alignment, sizeof(wide_alignment)),
            CUBLAS_STATUS_INVALID_VALUE);
  const std::uint32_t no_such_scheme = 0x8;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &no_such_scheme, sizeof(no_such_scheme)),
            CUBLAS_STATUS_INVALID_VALUE);

  EXPECT_EQ(cublasLtMatrixLayoutCreate(&d.a, kCudaR16F, 4, 4, 4), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(d.a, nullptr);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(nullptr, CUDA_R_32F, 4, 4, 4), CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(SimCublasLt, TheHeuristicRefusesStridedMixedMisalignedAndInconsistentLayouts) {
  const Shape shape{7, 5, 13};
  int returned = -1;
  {  // ld > rows: a strided layout the project never passes.
    Descriptors d;
    describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::f32, DType::f32);
    cublasLtMatrixLayoutDestroy(d.a);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, 7, 13, 8), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(returned, 0);
    cublasLtMatrixLayoutDestroy(d.a);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_32F, 7, 13, 6), CUBLAS_STATUS_SUCCESS);  // ld < rows
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // A and B of different types.
    Descriptors d;
    describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::bf16, DType::f32);
    cublasLtMatrixLayoutDestroy(d.b);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_32F, 13, 5, 13), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // f32 x f32 -> bf16.
    Descriptors d;
    describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::f32, DType::bf16);
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // bf16 x bf16 -> bf16 is the project's; a pointer aligned to less than an element is not.
    Descriptors d;
    describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::bf16, DType::bf16);
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_SUCCESS);
    const std::uint32_t byte_aligned = 1;
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &byte_aligned, sizeof(byte_aligned)),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // Dimensions that do not chain: op(A) is 7 x 13 but op(B) read transposed is 5 x 13.
    Descriptors d;
    describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::f32, DType::f32);
    const cublasOperation_t transposed = CUBLAS_OP_T;
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSB, &transposed, sizeof(transposed)),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // C and D of different layouts (D is computed over C); null handle, descriptors, counts.
    Descriptors d;
    describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::bf16, DType::f32);
    cublasLtMatrixLayout_t bf16_d = nullptr;
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&bf16_d, CUDA_R_16BF, 7, 5, 7), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle_, d.operation, d.a, d.b, d.c, bf16_d, d.preference, 1, &d.result,
                                             &returned),
              CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatrixLayoutDestroy(bf16_d);
    EXPECT_EQ(heuristic(nullptr, d, &returned), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle_, d.operation, d.a, d.b, d.c, d.c, d.preference, 0, &d.result,
                                             &returned),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle_, nullptr, d.a, d.b, d.c, d.c, d.preference, 1, &d.result, &returned),
              CUBLAS_STATUS_INVALID_VALUE);
  }
}

TEST_F(SimCublasLt, MatmulRefusesOutOfPlaceForeignAndMisalignedCalls) {
  const Shape shape{7, 5, 13};
  Descriptors d;
  describe(d, shape, CUBLAS_OP_T, CUBLAS_OP_N, DType::f32, DType::f32);
  int returned = 0;
  ASSERT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_SUCCESS);
  std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k), 1.0f), b(static_cast<std::size_t>(shape.k * shape.n), 1.0f);
  std::vector<float> c(static_cast<std::size_t>(shape.m * shape.n), 0.0f), other(c.size(), 0.0f);
  const float alpha = 1.0f, beta = 0.0f;
  const auto matmul = [&](cublasLtHandle_t handle, void* out, const cublasLtMatmulAlgo_t* algo) {
    return cublasLtMatmul(handle, d.operation, &alpha, a.data(), d.a, b.data(), d.b, &beta, c.data(), d.c, out, d.c,
                          algo, nullptr, 0, nullptr);
  };
  EXPECT_EQ(matmul(handle_, other.data(), &d.result.algo), CUBLAS_STATUS_NOT_SUPPORTED) << "D is not C";
  EXPECT_EQ(matmul(handle_, c.data(), nullptr), CUBLAS_STATUS_NOT_SUPPORTED) << "no algorithm";
  EXPECT_EQ(matmul(nullptr, c.data(), &d.result.algo), CUBLAS_STATUS_NOT_INITIALIZED);
  const cublasLtMatmulAlgo_t not_from_the_heuristic{};
  EXPECT_EQ(matmul(handle_, c.data(), &not_from_the_heuristic), CUBLAS_STATUS_INVALID_VALUE);
  {  // An algorithm chosen for another problem (op(A) not transposed: A is 7 x 13 as stored).
    Descriptors other_problem;
    describe(other_problem, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::f32, DType::f32);
    ASSERT_EQ(heuristic(handle_, other_problem, &returned), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(matmul(handle_, c.data(), &other_problem.result.algo), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // A pointer less aligned than the preference promised when the algorithm was chosen.
    const std::uint32_t aligned_256 = 256;
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &aligned_256, sizeof(aligned_256)),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &aligned_256, sizeof(aligned_256)),
              CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t aligned{};
    ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle_, d.operation, d.a, d.b, d.c, d.c, d.preference, 1, &aligned,
                                             &returned),
              CUBLAS_STATUS_SUCCESS);
    std::vector<float> padded(c.size() + 64);
    float* misaligned = padded.data();
    while (reinterpret_cast<std::uintptr_t>(misaligned) % 256 != 4) ++misaligned;
    EXPECT_EQ(cublasLtMatmul(handle_, d.operation, &alpha, a.data(), d.a, b.data(), d.b, &beta, misaligned, d.c,
                             misaligned, d.c, &aligned.algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
  }
  EXPECT_EQ(matmul(handle_, c.data(), &d.result.algo), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c[0], static_cast<float>(shape.k)) << "a sum of k ones";
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

// After a kernel faulted, nothing more runs in the context: cuBLASLt reports an execution failure.
TEST_F(SimCublasLt, MatmulAfterAKernelFaultIsAnExecutionFailureAndWritesNothing) {
  const Shape shape{3, 2, 4};
  Descriptors d;
  describe(d, shape, CUBLAS_OP_N, CUBLAS_OP_N, DType::f32, DType::f32);
  int returned = 0;
  ASSERT_EQ(heuristic(handle_, d, &returned), CUBLAS_STATUS_SUCCESS);
  TANDEM_LAUNCH(1, 2, 0, nullptr, divergent_barrier_kernel)();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::vector<float> a(12, 1.0f), b(8, 1.0f);
  std::vector<float> c(6, -3.0f);
  const float alpha = 1.0f, beta = 0.0f;
  EXPECT_EQ(cublasLtMatmul(handle_, d.operation, &alpha, a.data(), d.a, b.data(), d.b, &beta, c.data(), d.c, c.data(),
                           d.c, &d.result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(c[0], -3.0f);
}

// gemm_cuda's own error when the heuristic has no algorithm: the shape, and the policy's fix.
TEST_F(SimCublasLt, GemmCudaNamesTheShapeWhenTheHeuristicHasNoAlgorithm) {
  const Shape shape{7, 5, 13};
  const std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k), 1.0f), b(static_cast<std::size_t>(shape.k * shape.n), 1.0f);
  HostArray c(DType::bf16, shape.m * shape.n);
  const GemmParams f32_into_bf16{shape.m, shape.n, shape.k, {a.data(), DType::f32, Transpose::no},
                                 {b.data(), DType::f32, Transpose::yes}, c.data(), DType::bf16, 1.0f, 0.0f};
  try {
    gemm_cuda(f32_into_bf16, launch_);
    FAIL() << "f32 x f32 -> bf16 ran";
  } catch (const std::runtime_error& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("cuBLASLt has no algorithm for m=7 n=5 k=13 A=f32/N B=f32/T C=bf16 beta=0"), std::string::npos)
        << text;
    EXPECT_NE(text.find("status 15"), std::string::npos) << text;  // CUBLAS_STATUS_NOT_SUPPORTED
  }
  // bf16 operands one byte off their elements.
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(2 * shape.m * shape.k + 2), 0);
  const HostArray b16(DType::bf16, shape.k * shape.n);
  const GemmParams misaligned{shape.m, shape.n, shape.k, {bytes.data() + 1, DType::bf16, Transpose::no},
                              {b16.data(), DType::bf16, Transpose::no}, c.data(), DType::bf16, 1.0f, 0.0f};
  try {
    gemm_cuda(misaligned, launch_);
    FAIL() << "a byte-aligned bf16 operand ran";
  } catch (const std::runtime_error& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("no algorithm for m=7 n=5 k=13 A=bf16/N B=bf16/N C=bf16 beta=0 align=1/"), std::string::npos)
        << text;
  }
}

// ---- The log ------------------------------------------------------------------------------------

TEST_F(SimCublasLt, TheAlgorithmLogListsEachShapeOnceWithItsConfiguration) {
  EXPECT_NE(cuda::gemm_policy().find("cuBLASLt 130100, heuristic top-1 per shape, compute 32F"), std::string::npos)
      << cuda::gemm_policy();
  // Shapes no other test uses, each run twice: one plan, one line.
  const Shape shapes[] = {{19, 3, 2}, {2, 17, 23}};
  for (const Shape& shape : shapes) {
    const HostArray a(DType::bf16, shape.m * shape.k), b(DType::bf16, shape.k * shape.n);
    HostArray c(DType::f32, shape.m * shape.n);
    for (int run = 0; run < 2; ++run) {
      gemm_cuda({shape.m, shape.n, shape.k, {a.data(), DType::bf16, Transpose::yes}, {b.data(), DType::bf16, Transpose::no},
                 c.data(), DType::f32, 1.0f, 1.0f},
                launch_);
    }
  }
  const std::string log = cuda::gemm_algorithm_log();
  for (const Shape& shape : shapes) {
    std::ostringstream prefix;
    prefix << "m=" << shape.m << " n=" << shape.n << " k=" << shape.k << " A=bf16/T B=bf16/N C=f32 beta=nonzero align=";
    const std::size_t first = log.find(prefix.str());
    ASSERT_NE(first, std::string::npos) << log;
    EXPECT_EQ(log.find(prefix.str(), first + 1), std::string::npos) << "listed twice:\n" << log;
    const std::string line = log.substr(first, log.find('\n', first) - first);
    EXPECT_NE(line.find(": algo 0 tile 0 stages 0 splitk 1 reduction 0 swizzle 0 custom 0 waves 1 workspace 0"),
              std::string::npos)
        << line;
  }
}

}  // namespace
}  // namespace tandem::production
