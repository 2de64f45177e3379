// The reference decoder (reference/model_impl.hpp), instantiated for double and cpp_bin_float_50.
#include "reference/model_impl.hpp"

#include <boost/multiprecision/cpp_bin_float.hpp>

namespace tandem::reference {

TANDEM_INSTANTIATE_REFERENCE_MODEL(double)
TANDEM_INSTANTIATE_REFERENCE_MODEL(boost::multiprecision::cpp_bin_float_50)

}  // namespace tandem::reference
