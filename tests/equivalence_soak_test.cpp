// The equivalence harness's soak: every property against every twin under test with 10,000
// cases each (RC_PARAMS="max_success=N" overrides). Named Equivalence.Soak<Property>__<twin>, which
// tests/CMakeLists.txt labels `soak` (pattern "*.Soak*"), so the default suite leaves it out; run
// it with `ctest -L soak`.
#include "equivalence/gtest_registration.hpp"

namespace tandem::equivalence {
namespace {

const bool registered = [] {
  register_equivalence_properties("Equivalence", /*soak=*/true);
  return true;
}();

}  // namespace
}  // namespace tandem::equivalence
