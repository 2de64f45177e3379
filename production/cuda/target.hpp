// Which build of the CUDA sources this is: the device's (nvcc and the CUDA Toolkit) or cuda-sim's
// (the same sources compiled for the CPU against cuda_sim/include's stand-ins). tandem::cuda's
// names live in an inline namespace of the build's own, as production/arithmetic.hpp does for the
// trainer, so that one binary links both builds (`tandem check --device cuda-sim`) without one
// build's definition standing in for the other's.
// Included by .cu files: nothing here but the macro.
#pragma once

#if defined(TANDEM_PRODUCTION_CUDA_SIM)
#define TANDEM_CUDA_TARGET target_cuda_sim
#else
#define TANDEM_CUDA_TARGET target_device
#endif
