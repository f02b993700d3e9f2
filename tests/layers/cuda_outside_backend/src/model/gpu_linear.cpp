#include <cuda_runtime.h>
// A model file that talks to the CUDA runtime directly: the layer check must reject it.
