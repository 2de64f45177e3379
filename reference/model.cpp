// The reference decoder (reference/model_impl.hpp), instantiated for double and cpp_bin_float_50.
#include "reference/model_impl.hpp"

#include <boost/multiprecision/cpp_bin_float.hpp>

namespace tandem::reference {

std::int64_t workspace_values(const ModelConfig& config, std::int64_t sequence_length) {
  return counted_workspace_values(Dimensions(config), sequence_length);
}

TANDEM_INSTANTIATE_REFERENCE_MODEL(double)
TANDEM_INSTANTIATE_REFERENCE_MODEL(boost::multiprecision::cpp_bin_float_50)

}  // namespace tandem::reference
