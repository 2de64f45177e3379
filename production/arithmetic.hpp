// The production sources' arithmetic: `Real`, the type of the main state and of every value the
// ops compute in (SPEC 7: fp32), and the inline namespace that keeps one build's symbols apart
// from another's.
//
// The production sources are built twice. `tandem_production` is the trainer users run (Real =
// float; the cuda and cpu backends). `tandem_production_semantic` is the same host sources
// compiled with TANDEM_PRODUCTION_SEMANTIC (Real = double; the cpu backend only, no bf16, no
// cuda): the equivalence harness's semantic twin (docs/EQUIVALENCE.md "The semantic twin"). With
// rounding at 2^-53 instead of 2^-24 its comparison to the double reference is sharp, so an
// orchestration bug of one part in a million (a dropped epsilon, a wrong scale, a sum taken twice)
// stands far outside its bound. Both builds link into one program (the harness): their symbols
// live in different inline namespaces, so `production::Trainer` names the one this translation
// unit was compiled for.
//
// Included by .cu files (kernels/types.hpp): nothing here but the alias and the macro.
#pragma once

#if defined(TANDEM_PRODUCTION_SEMANTIC)
#define TANDEM_PRODUCTION_ARITHMETIC arithmetic_fp64
#elif defined(TANDEM_PRODUCTION_CUDA_SIM)
// The kernels built for cuda-sim (cuda_sim/CMakeLists.txt): fp32 as users run, the .cu files
// compiled by the host compiler; their own namespace, so they link beside tandem_production.
#define TANDEM_PRODUCTION_ARITHMETIC arithmetic_fp32_cuda_sim
#else
#define TANDEM_PRODUCTION_ARITHMETIC arithmetic_fp32
#endif

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {

#if defined(TANDEM_PRODUCTION_SEMANTIC)
using Real = double;
#else
using Real = float;
#endif

// Whether this build is the semantic one (Real = double): it refuses --bf16 and --device cuda.
inline constexpr bool kSemanticBuild = sizeof(Real) == sizeof(double);

}  // namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC
