// The production twin against the semantic build of the production sources (Real = double,
// production/arithmetic.hpp): production_twin.cpp compiled a second time, with the semantic
// build's headers. It exports semantic_production_twin_maker (production_twin.hpp).
#define TANDEM_PRODUCTION_SEMANTIC 1
#include "equivalence/production_twin.cpp"  // NOLINT(bugprone-suspicious-include): the same source, the other build
