// Moving from the whole model's layout to a rank's (its pipeline stage's layers, its experts), by
// parameter name. Checkpoints are always written in the whole
// model's layout, so they do not depend on the layout of the run that wrote them.
#pragma once

#include "dist/communicator.h"
#include "model/config.h"
#include "model/params.h"

namespace moecore::dist {

// This rank's part of a whole-model buffer.
void take_local(const ParamLayout& full, const ParamBuffers& full_buf, const ParamLayout& local,
                ParamBuffers& local_buf);

}  // namespace moecore::dist
