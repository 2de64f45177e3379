// The reference model's operations (reference/model_ops_impl.hpp), instantiated for double and
// cpp_bin_float_50.
#include "reference/model_ops_impl.hpp"

#include <boost/multiprecision/cpp_bin_float.hpp>

namespace tandem::reference {

TANDEM_INSTANTIATE_MODEL_OPS(double)
TANDEM_INSTANTIATE_MODEL_OPS(boost::multiprecision::cpp_bin_float_50)

}  // namespace tandem::reference
