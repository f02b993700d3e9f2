// `moecore train CONFIG --init-from HF_DIR`: the run's [model] table comes from HF_DIR's
// config.json. Keys CONFIG does not set are taken from config.json; keys it sets must agree with
// it (a contradiction is one line naming the key), except the training-only ones
// (router_aux_loss_coef, router_z_loss_coef, lb_loss_style, lb_loss_scope, lb_loss_granularity,
// loss_normalizer), which CONFIG may
// change as a fine-tuning choice. The trainer then loads HF_DIR's weights (train/trainer.h).
#pragma once

#include <string>
#include <vector>

#include "train/run_config.h"

namespace moecore::cli {

RunConfig load_run_config_init_from(const std::string& config_path,
                                    const std::vector<std::string>& overrides,
                                    const std::string& hf_dir,
                                    ScheduleLength length = ScheduleLength::kFresh);

}  // namespace moecore::cli
