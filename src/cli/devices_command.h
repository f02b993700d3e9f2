// `moecore devices`: the compute devices this program can run on, one line each, so that a user
// sees before a run what a backend would use, and why a GPU would not be:
//   cpu: Intel(R) Xeon(R) Platinum 8480C, 2 threads, bf16 GEMMs native (AVX512-BF16)
//   cuda: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)
// or "cuda: unavailable (<the runtime's reason>)", or "cuda: not in this program" with how to
// build one that has it. Exit status 0 whatever is found: it reports, it does not require.
#pragma once

#include <string>

#include "train/run_config.h"

namespace moecore::cli {

void run_devices();

// Selects train.device for this process's model: for cuda, the GPU through the CUDA backend, its
// experts' GEMMs as train.cuda_grouped_gemm says, and NCCL's communicator over its memory where
// the program has it (dist/device_communicators.h); returns its description for the start-up line
// ("" for the CPU). Throws moecore::Error naming why when the device cannot be used (no GPU, or a
// program built without the backend).
std::string select_device(const TrainConfig& train);

}  // namespace moecore::cli
