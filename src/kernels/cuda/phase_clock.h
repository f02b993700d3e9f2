// train.profile's phases timed on the GPU (core/phase_timer.h's DevicePhaseClock): a pair of CUDA
// events per phase scope, recorded on the backend's stream where the scope starts and ends, their
// elapsed time added to the phase once the stream has passed the end. activate() registers it.
#pragma once

#include "core/phase_timer.h"

namespace moecore::kernels::cuda {

DevicePhaseClock& cuda_phase_clock();

}  // namespace moecore::kernels::cuda
