// A dist-layer header that reaches up into the train layer (as dist/pipeline_schedule.h once did
// for train/run_config.h): the layer check must reject it.
#include "train/run_config.h"
