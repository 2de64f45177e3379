// Host twins of the elementwise ops (elementwise.hpp).
#include "production/kernels/elementwise.hpp"

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

void convert_host(const ConvertParams& p) {
  for (std::int64_t i = 0; i < p.count; ++i) {
    store_from_f32(p.output, p.output_dtype, i, load_as_f32(p.input, p.input_dtype, i));
  }
}

void add_host(const AddParams& p) {
  for (std::int64_t i = 0; i < p.count; ++i) {
    store_from_f32(p.output, p.dtype, i, load_as_f32(p.a, p.dtype, i) + load_as_f32(p.b, p.dtype, i));
  }
}

void bias_add_host(const BiasAddParams& p) {
  for (std::int64_t row = 0; row < p.rows; ++row) {
    for (std::int64_t j = 0; j < p.width; ++j) {
      const std::int64_t i = row * p.width + j;
      store_from_f32(p.values, p.dtype, i, load_as_f32(p.values, p.dtype, i) + load_as_f32(p.bias, p.dtype, j));
    }
  }
}

void bias_grad_host(const BiasGradParams& p) {
  for (std::int64_t row = 0; row < p.rows; ++row) {
    for (std::int64_t j = 0; j < p.width; ++j) {
      p.bias_grad[j] += load_as_f32(p.output_grad, p.dtype, row * p.width + j);
    }
  }
}

}  // namespace tandem::production
