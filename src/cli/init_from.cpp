#include "cli/init_from.h"

#include "core/check.h"
#include "io/hf_config_reader.h"

namespace moecore::cli {

RunConfig load_run_config_init_from(const std::string& config_path,
                                    const std::vector<std::string>& overrides,
                                    const std::string& hf_dir, ScheduleLength length) {
  const io::HfModelConfig hf = io::read_hf_model_config(hf_dir);
  RunConfig config = load_run_config(config_path, overrides, hf.model, length);
  ModelConfig expected = hf.model;
  expected.router_aux_loss_coef = config.model.router_aux_loss_coef;
  expected.router_z_loss_coef = config.model.router_z_loss_coef;
  expected.lb_loss_style = config.model.lb_loss_style;
  expected.loss_normalizer = config.model.loss_normalizer;
  // "model: <key> = <ours> vs <key> = <config.json's>"
  std::string difference = model_config_difference(io::canonical_architecture(config.model),
                                                   io::canonical_architecture(expected));
  if (difference.empty()) return config;
  const std::string prefix = "model: ";
  if (difference.rfind(prefix, 0) == 0) difference = difference.substr(prefix.size());
  const size_t vs = difference.find(" vs ");
  fail("[init-from] {} sets model.{}, but {}/config.json says {}", config_path,
       difference.substr(0, vs), hf_dir,
       vs == std::string::npos ? std::string("otherwise") : difference.substr(vs + 4));
}

}  // namespace moecore::cli
