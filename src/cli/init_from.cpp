#include "cli/init_from.h"

#include "core/check.h"
#include "io/hf_import.h"

namespace moecore::cli {

namespace {

// Two spellings of one architecture compare equal: head_dim 0 is hidden_size / heads, and the
// dense MLP width means nothing without a dense layer.
ModelConfig canonical(ModelConfig m) {
  if (m.head_dim == m.hidden_size / m.num_attention_heads) m.head_dim = 0;
  if (m.first_k_dense_replace == 0) m.intermediate_size = 0;
  return m;
}

}  // namespace

RunConfig load_run_config_init_from(const std::string& config_path,
                                    const std::vector<std::string>& overrides,
                                    const std::string& hf_dir) {
  const io::HfModelConfig hf = io::read_hf_model_config(hf_dir);
  RunConfig config = load_run_config(config_path, overrides, hf.model);
  ModelConfig expected = hf.model;
  expected.router_aux_loss_coef = config.model.router_aux_loss_coef;
  expected.router_z_loss_coef = config.model.router_z_loss_coef;
  expected.lb_loss_style = config.model.lb_loss_style;
  expected.loss_normalizer = config.model.loss_normalizer;
  // "model: <key> = <ours> vs <key> = <config.json's>"
  std::string difference = model_config_difference(canonical(config.model), canonical(expected));
  if (difference.empty()) return config;
  const std::string prefix = "model: ";
  if (difference.rfind(prefix, 0) == 0) difference = difference.substr(prefix.size());
  const size_t vs = difference.find(" vs ");
  fail("[init-from] {} sets model.{}, but {}/config.json says {}", config_path,
       difference.substr(0, vs), hf_dir,
       vs == std::string::npos ? std::string("otherwise") : difference.substr(vs + 4));
}

}  // namespace moecore::cli
