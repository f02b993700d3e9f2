// Moving between a rank's parameter layout under expert parallelism (dense tensors + its experts)
// and the whole model's layout, by parameter name. Checkpoints are always written in the whole
// model's layout, so they do not depend on the layout of the run that wrote them.
#pragma once

#include "dist/communicator.h"
#include "model/config.h"
#include "model/params.h"

namespace moecore::dist {

// full <- every rank's part (an all-gather over the ep group; every rank of it must call).
void gather_full(const ModelConfig& config, const ParamBuffers& local_buf, const ParamLayout& full,
                 ParamBuffers& full_buf, const Communicator& ep);

// This rank's part of a whole-model buffer.
void take_local(const ParamLayout& full, const ParamBuffers& full_buf, const ParamLayout& local,
                ParamBuffers& local_buf);

}  // namespace moecore::dist
