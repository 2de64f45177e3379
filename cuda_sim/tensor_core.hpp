// cuda-sim's emulation of the two tensor-core instructions the project's kernels use (inline PTX in
// production/kernels/attention_tensor_core.cu), as warp collectives (engine.hpp's warp_exchange):
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   D = A B + C, A [16, 16] bf16 row-major,
//                                                          B [16, 8] bf16 column-major, C = D fp32
//   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16       four 8x8 b16 matrices from shared memory
// Every lane's registers map to matrix elements by the PTX ISA's fragment tables ("Matrix
// Fragments for mma.m16n8k16 with floating point type", "Warp-level matrix load instruction:
// ldmatrix"), written once below as functions; tests/cuda_sim/cuda_sim_tensor_core_test.cpp
// checks them against the tables as the ISA writes them, both ways.
//
// Arithmetic: bf16 x bf16 products are exact in fp32 (8-bit significands, a 16-bit product). The
// emulation adds each output's 16 products to its accumulator one at a time, k increasing, each
// addition rounded to nearest fp32. The hardware's order and internal precision inside an mma are
// not documented; the kernels' bounds (tests/production_cuda_ops_test.cpp) are derived for any
// order of fp32 additions, so they cover this one and the device's (docs/CUDA-SIM.md).
#pragma once

#include <cstdint>

namespace tandem::cuda_sim {

struct MatrixCell {
  int row = 0;
  int column = 0;
};

// mma.m16n8k16 fragments: register `reg` of lane `lane`; `half` 0 is the register's low 16 bits.
// A [16, 16]: 4 registers of 2 bf16.
constexpr MatrixCell mma_a_cell(int lane, int reg, int half) {
  return MatrixCell{lane / 4 + 8 * (reg & 1), 2 * (lane % 4) + half + 8 * (reg >> 1)};
}
// B [16, 8] (row = k, column = n): 2 registers of 2 bf16.
constexpr MatrixCell mma_b_cell(int lane, int reg, int half) {
  return MatrixCell{2 * (lane % 4) + half + 8 * reg, lane / 4};
}
// C and D [16, 8]: 4 fp32 registers.
constexpr MatrixCell mma_c_cell(int lane, int reg) { return MatrixCell{lane / 4 + 8 * (reg >> 1), 2 * (lane % 4) + (reg & 1)}; }

// ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8. Lane `lane` receives in
// register `reg` (= the matrix), at `half`, this row and column of that matrix; .trans: the
// transposed element.
constexpr MatrixCell ldmatrix_cell(int lane, int half, bool trans) {
  const MatrixCell plain{lane / 4, 2 * (lane % 4) + half};
  return trans ? MatrixCell{plain.column, plain.row} : plain;
}
constexpr int ldmatrix_address_lane(int matrix, int row) { return 8 * matrix + row; }

// The instructions, called by every lane of a warp (mask all 32: .sync.aligned).
void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                       const char* file, int line);
// `row`: this lane's row address, which must lie in the block's dynamic shared memory (the kernels'
// tiles) and be 16-byte aligned, as ldmatrix requires: a fault otherwise.
void ldmatrix_x4(std::uint32_t (&r)[4], const std::uint16_t* row, bool trans, const char* file, int line);

}  // namespace tandem::cuda_sim
