// cuda-sim's tensor-core instructions (cuda_sim/tensor_core.hpp): the fragment maps against the
// PTX ISA's tables as the ISA writes them ("Matrix Fragments for mma.m16n8k16 with floating point
// type", "ldmatrix"), both ways; then the instructions as warp collectives in kernels written here
// (a product of small integers, exact in fp32), and their faults.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "production/cuda/kernel_support.cuh"

namespace {

using tandem::cuda_sim::MatrixCell;

// The ISA's words: groupID = %laneid >> 2, threadID_in_group = %laneid % 4; fragment element i
// (a0..a7, b0..b3, c0..c3), two 16-bit elements to a 32-bit register, a_i in register i / 2.
MatrixCell isa_a(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
  const int col = i < 4 ? thread_in_group * 2 + (i & 0x1) : thread_in_group * 2 + (i & 0x1) + 8;
  return {row, col};
}
MatrixCell isa_b(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  const int row = i < 2 ? thread_in_group * 2 + (i & 0x1) : thread_in_group * 2 + (i & 0x1) + 8;
  return {row, group};
}
MatrixCell isa_c(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  return {i < 2 ? group : group + 8, thread_in_group * 2 + (i & 0x1)};
}

// Each (lane, element) names one cell, and every cell of the rows x columns matrix is named once.
template <class Cell>
void expect_bijection(const char* name, int elements, int rows, int columns, Cell cell) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < elements; ++i) {
      const MatrixCell c = cell(lane, i);
      EXPECT_TRUE(c.row >= 0 && c.row < rows && c.column >= 0 && c.column < columns) << name << " lane " << lane << " i " << i;
      EXPECT_TRUE(seen.insert({c.row, c.column}).second) << name << ": (" << c.row << ", " << c.column << ") twice";
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), rows * columns) << name;
}

TEST(TensorCoreFragments, TheEmulationsMapsAreTheIsasTablesBothWays) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const MatrixCell isa = isa_a(lane, i), sim = tandem::cuda_sim::mma_a_cell(lane, i / 2, i % 2);
      EXPECT_EQ(isa.row, sim.row) << "A lane " << lane << " a" << i;
      EXPECT_EQ(isa.column, sim.column) << "A lane " << lane << " a" << i;
    }
    for (int i = 0; i < 4; ++i) {
      const MatrixCell isa_b_cell = isa_b(lane, i), sim_b = tandem::cuda_sim::mma_b_cell(lane, i / 2, i % 2);
      EXPECT_EQ(isa_b_cell.row, sim_b.row) << "B lane " << lane << " b" << i;
      EXPECT_EQ(isa_b_cell.column, sim_b.column) << "B lane " << lane << " b" << i;
      const MatrixCell isa_c_cell = isa_c(lane, i), sim_c = tandem::cuda_sim::mma_c_cell(lane, i);
      EXPECT_EQ(isa_c_cell.row, sim_c.row) << "C lane " << lane << " c" << i;
      EXPECT_EQ(isa_c_cell.column, sim_c.column) << "C lane " << lane << " c" << i;
    }
  }
  // The other way: every matrix element is held by exactly one (lane, element).
  expect_bijection("A", 8, 16, 16, [](int lane, int i) { return tandem::cuda_sim::mma_a_cell(lane, i / 2, i % 2); });
  expect_bijection("B", 4, 16, 8, [](int lane, int i) { return tandem::cuda_sim::mma_b_cell(lane, i / 2, i % 2); });
  expect_bijection("C", 4, 16, 8, [](int lane, int i) { return tandem::cuda_sim::mma_c_cell(lane, i); });
  // ldmatrix: lane l holds row l / 4, elements 2 (l % 4) + {0, 1} of each matrix (transposed with
  // .trans); lanes 8 m .. 8 m + 7 give matrix m's row addresses.
  expect_bijection("ldmatrix", 2, 8, 8, [](int lane, int half) { return tandem::cuda_sim::ldmatrix_cell(lane, half, false); });
  expect_bijection("ldmatrix.trans", 2, 8, 8, [](int lane, int half) { return tandem::cuda_sim::ldmatrix_cell(lane, half, true); });
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(tandem::cuda_sim::ldmatrix_cell(lane, 1, false).row, lane >> 2);
    EXPECT_EQ(tandem::cuda_sim::ldmatrix_cell(lane, 1, false).column, (lane % 4) * 2 + 1);
    EXPECT_EQ(tandem::cuda_sim::ldmatrix_address_lane(lane / 8, lane % 8), lane);
  }
}

std::uint16_t bf16_of_integer(int value) {  // small integers are exact in bf16
  const float f = static_cast<float>(value);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  return static_cast<std::uint16_t>(bits >> 16);
}

constexpr int kPitch = 24;  // 16 bf16 and a 16-byte pad per shared row, as the kernels pad

// One warp: A [16, 16] and B^T [8, 16] (B as the kernels hold K) copied to dynamic shared memory,
// loaded by ldmatrix (A as 4 matrices, B^T's two k-halves as 2 of 4), D = A B + C by one mma.
__global__ void mma_kernel(const std::uint16_t* a, const std::uint16_t* b_rows_n, const float* c, float* d,
                           int shift_matrix) {
  TANDEM_DYNAMIC_SHARED(std::uint16_t, tile);
  const int lane = static_cast<int>(threadIdx.x);
  std::uint16_t* a_tile = tile;                // [16, kPitch]
  std::uint16_t* b_tile = tile + 16 * kPitch;  // [16, kPitch]: rows 0-7 B^T, rows 8-15 zero
  for (int index = lane; index < 16 * 16; index += 32) {
    a_tile[(index / 16) * kPitch + index % 16] = a[index];
    b_tile[(index / 16) * kPitch + index % 16] = index < 8 * 16 ? b_rows_n[index] : 0;
  }
  __syncthreads();
  const int matrix = (lane / 8 + shift_matrix) % 4;  // shift_matrix != 0: the planted mapping bug
  std::uint32_t ra[4], rb[4];
  tandem::cuda_sim::ldmatrix_x4(ra, a_tile + ((matrix & 1) * 8 + lane % 8) * kPitch + (matrix >> 1) * 8, false,
                                __FILE__, __LINE__);
  tandem::cuda_sim::ldmatrix_x4(rb, b_tile + ((lane / 8 >> 1) * 8 + lane % 8) * kPitch + (lane / 8 & 1) * 8, false,
                                __FILE__, __LINE__);
  float acc[4];
  for (int i = 0; i < 4; ++i) {
    const MatrixCell cell = tandem::cuda_sim::mma_c_cell(lane, i);
    acc[i] = c[cell.row * 8 + cell.column];
  }
  tandem::cuda_sim::mma_m16n8k16_bf16(acc, ra, rb[0], rb[1], __FILE__, __LINE__);
  for (int i = 0; i < 4; ++i) {
    const MatrixCell cell = tandem::cuda_sim::mma_c_cell(lane, i);
    d[cell.row * 8 + cell.column] = acc[i];
  }
}

struct MmaCase {
  std::vector<int> a, b, c;  // A [16, 16], B [16, 8], C [16, 8]
  std::vector<float> expected;
};

MmaCase mma_case() {
  MmaCase m;
  for (int i = 0; i < 16 * 16; ++i) m.a.push_back((i * 7) % 11 - 5);
  for (int i = 0; i < 16 * 8; ++i) m.b.push_back((i * 5) % 13 - 6);
  for (int i = 0; i < 16 * 8; ++i) m.c.push_back(i % 9 - 4);
  for (int row = 0; row < 16; ++row) {
    for (int col = 0; col < 8; ++col) {
      int sum = m.c[row * 8 + col];
      for (int k = 0; k < 16; ++k) sum += m.a[row * 16 + k] * m.b[k * 8 + col];
      m.expected.push_back(static_cast<float>(sum));
    }
  }
  return m;
}

std::vector<float> run_mma(const MmaCase& m, int shift_matrix) {
  std::vector<std::uint16_t> a, b_rows_n(8 * 16);
  for (const int value : m.a) a.push_back(bf16_of_integer(value));
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 8; ++n) b_rows_n[n * 16 + k] = bf16_of_integer(m.b[k * 8 + n]);
  }
  std::vector<float> c(m.c.begin(), m.c.end()), d(16 * 8, -1.0f);
  const int shared_bytes = 32 * kPitch * 2;
  TANDEM_LAUNCH(1, 32, shared_bytes, nullptr, mma_kernel)(a.data(), b_rows_n.data(), c.data(), d.data(), shift_matrix);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
  return d;
}

class CudaSimTensorCore : public ::testing::Test {
 protected:
  void SetUp() override { cudaDeviceReset(); }
  void TearDown() override { cudaDeviceReset(); }
};

TEST_F(CudaSimTensorCore, LdmatrixAndMmaComputeTheExactProductPlusTheAccumulator) {
  const MmaCase m = mma_case();
  EXPECT_EQ(run_mma(m, 0), m.expected);
}

// Negative control: lanes giving the addresses of the next matrix (an ldmatrix lane-to-address
// mapping off by one matrix) must change the product.
TEST_F(CudaSimTensorCore, AnLdmatrixAddressMappingOffByOneMatrixChangesTheProduct) {
  const MmaCase m = mma_case();
  EXPECT_NE(run_mma(m, 1), m.expected);
}

__global__ void transposed_load_kernel(std::uint32_t* out) {
  TANDEM_DYNAMIC_SHARED(std::uint16_t, tile);  // four 8x8 matrices, element (m, r, c) = 256 m + 16 r + c
  const int lane = static_cast<int>(threadIdx.x);
  for (int index = lane; index < 4 * 64; index += 32) {
    tile[(index / 8) * 8 + index % 8] = static_cast<std::uint16_t>(256 * (index / 64) + 16 * (index / 8 % 8) + index % 8);
  }
  __syncthreads();
  std::uint32_t plain[4], transposed[4];
  tandem::cuda_sim::ldmatrix_x4(plain, tile + lane * 8, false, __FILE__, __LINE__);
  tandem::cuda_sim::ldmatrix_x4(transposed, tile + lane * 8, true, __FILE__, __LINE__);
  for (int i = 0; i < 4; ++i) {
    out[lane * 8 + i] = plain[i];
    out[lane * 8 + 4 + i] = transposed[i];
  }
}

TEST_F(CudaSimTensorCore, LdmatrixGivesEachLaneItsRowsElementsAndTransGivesTheTransposedOnes) {
  std::vector<std::uint32_t> out(32 * 8, 0);
  TANDEM_LAUNCH(1, 32, 4 * 64 * 2, nullptr, transposed_load_kernel)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int lane = 0; lane < 32; ++lane) {
    for (int matrix = 0; matrix < 4; ++matrix) {
      const auto element = [&](int row, int column) { return static_cast<std::uint32_t>(256 * matrix + 16 * row + column); };
      const int row = lane / 4, column = 2 * (lane % 4);
      EXPECT_EQ(out[lane * 8 + matrix], element(row, column) | element(row, column + 1) << 16) << "lane " << lane;
      EXPECT_EQ(out[lane * 8 + 4 + matrix], element(column, row) | element(column + 1, row) << 16) << "lane " << lane;
    }
  }
}

__global__ void misaligned_load_kernel(int offset) {
  TANDEM_DYNAMIC_SHARED(std::uint16_t, tile);
  std::uint32_t r[4];
  tandem::cuda_sim::ldmatrix_x4(r, tile + threadIdx.x * 8 + (threadIdx.x == 5 ? offset : 0), false, __FILE__, __LINE__);
}

TEST_F(CudaSimTensorCore, AnLdmatrixRowOutsideSharedMemoryOrMisalignedIsAFaultNamingTheThread) {
  TANDEM_LAUNCH(1, 32, 32 * 16, nullptr, misaligned_load_kernel)(1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  const std::string text = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(text.find("thread (5,0,0)"), std::string::npos) << text;
  EXPECT_NE(text.find("16-byte aligned"), std::string::npos) << text;
  cudaDeviceReset();
  TANDEM_LAUNCH(1, 32, 32 * 16, nullptr, misaligned_load_kernel)(8 * 32);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("dynamic shared memory"), std::string::npos);
}

__global__ void big_shared_kernel(int* out) {
  TANDEM_DYNAMIC_SHARED(int, values);
  values[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = values[(threadIdx.x + 1) % blockDim.x];
}

TEST_F(CudaSimTensorCore, DynamicSharedMemoryOver48KiBNeedsTheKernelsLimitRaisedAsOnSm90) {
  std::vector<int> out(64, -1);
  constexpr int kBytes = 64 * 1024;
  TANDEM_LAUNCH(1, 64, kBytes, nullptr, big_shared_kernel)(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(out[0], -1) << "a refused launch runs nothing";
  EXPECT_EQ(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448 + 1),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes), cudaSuccess);
  TANDEM_LAUNCH(1, 64, kBytes, nullptr, big_shared_kernel)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], (t + 1) % 64);
}

__global__ void partial_warp_mma_kernel() {
  float d[4] = {};
  const std::uint32_t a[4] = {};
  tandem::cuda_sim::mma_m16n8k16_bf16(d, a, 0u, 0u, __FILE__, __LINE__);
}

TEST_F(CudaSimTensorCore, AnMmaInAWarpWithMissingLanesIsAFault) {
  TANDEM_LAUNCH(1, 16, 0, nullptr, partial_warp_mma_kernel)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("which the block does not have"), std::string::npos);
}

}  // namespace
