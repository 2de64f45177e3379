// The tensor-core instructions as warp collectives (tensor_core.hpp).
#include "cuda_sim/tensor_core.hpp"

#include <bit>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <string>

#include "cuda_sim/engine.hpp"

namespace tandem::cuda_sim {
namespace {

constexpr unsigned int kFullWarp = 0xFFFFFFFFu;

float bf16_value(std::uint32_t reg, int half) {
  return std::bit_cast<float>(((reg >> (16 * half)) & 0xFFFFu) << 16);
}

// What one lane contributes to an mma.
struct MmaOperands {
  std::uint32_t a[4];
  std::uint32_t b[2];
};

}  // namespace

void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                       const char* file, int line) {
  const MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
  MmaOperands lanes[32];
  warp_exchange(kFullWarp, &mine, lanes, sizeof(MmaOperands), file, line);
  float matrix_a[16][16];
  float matrix_b[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int half = 0; half < 2; ++half) {
      for (int reg = 0; reg < 4; ++reg) {
        const MatrixCell cell = mma_a_cell(lane, reg, half);
        matrix_a[cell.row][cell.column] = bf16_value(lanes[lane].a[reg], half);
      }
      for (int reg = 0; reg < 2; ++reg) {
        const MatrixCell cell = mma_b_cell(lane, reg, half);
        matrix_b[cell.row][cell.column] = bf16_value(lanes[lane].b[reg], half);
      }
    }
  }
  const int own = thread_lane();
  for (int reg = 0; reg < 4; ++reg) {
    const MatrixCell cell = mma_c_cell(own, reg);
    // Each product exact, so contracting it into an FMA would not change a bit.
    float sum = d[reg];
    for (int k = 0; k < 16; ++k) sum += matrix_a[cell.row][k] * matrix_b[k][cell.column];
    d[reg] = sum;
  }
}

void ldmatrix_x4(std::uint32_t (&r)[4], const std::uint16_t* row, bool trans, const char* file, int line) {
  const auto* base = static_cast<const char*>(dynamic_shared());
  const auto* address = reinterpret_cast<const char*>(row);
  const std::size_t bytes = dynamic_shared_bytes();
  if (base == nullptr || address < base || address + 16 > base + bytes ||
      reinterpret_cast<std::uintptr_t>(address) % 16 != 0) {
    std::ostringstream what;
    what << "gives ldmatrix at " << file << ":" << line << " the row address " << static_cast<const void*>(row)
         << ", which is not a 16-byte aligned row of 16 bytes inside the block's dynamic shared memory ("
         << static_cast<const void*>(base) << ", " << bytes << " bytes)";
    thread_fault(what.str());
  }
  const std::uint16_t* rows[32];
  warp_exchange(kFullWarp, &row, rows, sizeof(row), file, line);
  const int lane = thread_lane();
  for (int matrix = 0; matrix < 4; ++matrix) {
    std::uint32_t value = 0;
    for (int half = 0; half < 2; ++half) {
      const MatrixCell cell = ldmatrix_cell(lane, half, trans);
      const std::uint16_t element = rows[ldmatrix_address_lane(matrix, cell.row)][cell.column];
      value |= static_cast<std::uint32_t>(element) << (16 * half);
    }
    r[matrix] = value;
  }
}

}  // namespace tandem::cuda_sim
