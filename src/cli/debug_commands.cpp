#include "cli/debug_commands.h"

#include <vector>

#include "cli/distinct_paths.h"
#include "core/check.h"
#include "data/npy.h"
#include "io/model_weights.h"
#include "io/safetensors.h"
#include "kernels/matmul_precision.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "train/evaluate.h"
#include "train/run_config.h"

namespace moecore::cli {

namespace {}  // namespace

IdArray read_ids(const std::string& path) {
  const data::NpyFile file = data::NpyFile::open(path);
  MOE_CHECK(file.dtype() == "<i4" || file.dtype() == "<i8",
            "[debug] {}: dtype '{}' is not int32 or int64", path, file.dtype());
  MOE_CHECK(file.shape().size() == 2, "[debug] {}: expected a [batch, seq] array, got {} dims",
            path, file.shape().size());
  std::vector<int64_t> wide;
  file.read_ints(wide);
  IdArray ids{std::vector<int32_t>(wide.size()), file.shape()[0], file.shape()[1]};
  for (size_t i = 0; i < wide.size(); ++i) {
    MOE_CHECK(wide[i] >= INT32_MIN && wide[i] <= INT32_MAX, "[debug] {}: id {} does not fit int32",
              path, wide[i]);
    ids.values[i] = static_cast<int32_t>(wide[i]);
  }
  return ids;
}

namespace {

struct DebugSetup {
  RunConfig config;
  ParamLayout layout;
  ParamBuffers params;
  IdArray tokens, targets;
};

DebugSetup load_setup(const DebugArgs& args) {
  check_outputs_apart({{"--config", args.config},
                       {"--weights", args.weights},
                       {"--tokens", args.tokens},
                       {"--targets", args.targets}},
                      {{"--out", args.out}});
  RunConfig config = load_run_config(args.config);
  ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout);
  io::load_weights(layout, args.weights, params);
  IdArray tokens = read_ids(args.tokens), targets = read_ids(args.targets);
  MOE_CHECK(tokens.batch == targets.batch && tokens.seq == targets.seq,
            "[debug] tokens {} are [{}, {}] but targets {} are [{}, {}]", args.tokens, tokens.batch,
            tokens.seq, args.targets, targets.batch, targets.seq);
  return {std::move(config), std::move(layout), std::move(params), std::move(tokens),
          std::move(targets)};
}

// data.document_masking: these commands read no token files, so the EOS must be in the config.
int32_t document_eos(const RunConfig& config) {
  if (!config.data.document_masking) return -1;
  MOE_CHECK(config.data.eos_id >= 0,
            "[debug] data.document_masking needs data.eos_id in the config (no token files' "
            "meta.json is read here)");
  return static_cast<int32_t>(config.data.eos_id);
}

void add_scalar(io::SafetensorsWriter& writer, const std::string& name, double value) {
  writer.add_f32(name, {}, std::vector<float>{static_cast<float>(value)});
}

}  // namespace

void run_init(const std::string& config_path, uint64_t seed, const std::string& out) {
  check_outputs_apart({{"--config", config_path}}, {{"--out", out}});
  const RunConfig config = load_run_config(config_path);
  const ParamLayout layout = ParamLayout::build(config.model);
  ParamBuffers params(layout);
  init_params(layout, config.model, config.train.init, seed, params);
  io::save_weights(layout, params, out);
}

void run_debug_state(const DebugArgs& args) {
  DebugSetup s = load_setup(args);
  Transformer model(s.config.model, s.layout);
  model.set_precision(PrecisionRecipe::from_train(s.config.train.precision, s.config.train.mxfp8));
  model.set_document_masking(document_eos(s.config), document_masking_bos(s.config.data));
  model.set_z_loss_multiplier(s.config.train.z_loss_multiplier);
  ParamBuffers grads(s.layout);
  const LossParts loss = model.forward(s.params, s.tokens.values.data(), s.targets.values.data(),
                                       s.tokens.batch, s.tokens.seq);
  model.backward(s.params, grads, 1.0f);

  io::SafetensorsWriter writer;
  const std::vector<float> logits = host_copy(model.logits());
  writer.add_f32("logits", {s.tokens.batch, s.tokens.seq, s.config.model.vocab_size},
                 logits.data());
  add_scalar(writer, "loss.ce", loss.ce);
  add_scalar(writer, "loss.lb", loss.lb);
  add_scalar(writer, "loss.z", loss.z);
  add_scalar(writer, "loss.lm_z", loss.lm_z);
  add_scalar(writer, "loss.total", loss.total);
  for (const ParamSpec& spec : s.layout.specs())
    writer.add_f32("grad." + spec.name, spec.shape, grads.at(spec));
  writer.write(args.out);
}

void run_debug_steps(const DebugArgs& args) {
  MOE_CHECK(args.steps > 0, "[debug] --steps={} must be positive", args.steps);
  DebugSetup s = load_setup(args);
  // The schedule runs over --steps updates of this batch, not the config's run.
  validate_lr_schedule(s.config.optim, args.steps, s.tokens.batch * s.tokens.seq);
  Transformer model(s.config.model, s.layout);
  model.set_precision(PrecisionRecipe::from_train(s.config.train.precision, s.config.train.mxfp8));
  model.set_document_masking(document_eos(s.config), document_masking_bos(s.config.data));
  model.set_z_loss_multiplier(s.config.train.z_loss_multiplier);
  ParamBuffers grads(s.layout);
  OptimizerGroups(s.layout, s.config.optim, /*whole_model=*/true);  // the patterns' checks
  AdamW optimizer(s.layout, s.config.optim);
  std::vector<float> total_losses, ce_losses, grad_norms;
  for (int64_t step = 0; step < args.steps; ++step) {
    grads.zero();
    model.clear_selection_counts();
    const LossParts loss = model.forward(s.params, s.tokens.values.data(), s.targets.values.data(),
                                         s.tokens.batch, s.tokens.seq);
    model.backward(s.params, grads, 1.0f);
    grad_norms.push_back(static_cast<float>(clip_grad_norm(grads, s.config.optim.max_grad_norm)));
    // Each optimizer group's rate: the schedule at its initial_lr (optim.group_overrides).
    std::vector<double> group_lrs;
    for (size_t g = 0; g < optimizer.groups().count(); ++g)
      group_lrs.push_back(learning_rate(s.config.optim, step, args.steps,
                                        s.tokens.batch * s.tokens.seq, {}, 0,
                                        optimizer.groups().settings(g).lr));
    optimizer.stage_step(group_lrs);
    optimizer.apply_step(s.params, grads);
    model.update_router_bias(s.params);  // as the trainer does after each step
    total_losses.push_back(static_cast<float>(loss.total));
    ce_losses.push_back(static_cast<float>(loss.ce));
  }
  io::SafetensorsWriter writer;
  for (const ParamSpec& spec : s.layout.specs())
    writer.add_f32(spec.name, spec.shape, s.params.at(spec));
  writer.add_f32("loss.total", {args.steps}, total_losses.data());
  writer.add_f32("loss.ce", {args.steps}, ce_losses.data());
  writer.add_f32("grad_norm", {args.steps}, grad_norms.data());
  writer.write(args.out);
}

}  // namespace moecore::cli
