#include "train/callbacks/model_merger.h"

#include <fmt/format.h>

#include "kernels/ops.h"
#include "train/checkpoint.h"
#include "train/train_context.h"

namespace moecore {

ModelMergeCallback::ModelMergeCallback(int64_t owner_pid, nlohmann::json hf_config,
                                       std::string tokenizer_json,
                                       std::map<std::string, std::string> hf_side_files)
    : owner_pid_(owner_pid),
      hf_config_(std::move(hf_config)),
      tokenizer_json_(std::move(tokenizer_json)),
      hf_side_files_(std::move(hf_side_files)) {}

std::vector<int64_t> ModelMergeCallback::merge_steps(const TrainConfig& train, int64_t max_steps) {
  if (train.merge_interval == 0) return train.merge_steps;
  std::vector<int64_t> steps;
  for (int64_t step = train.merge_interval; step <= max_steps; step += train.merge_interval)
    steps.push_back(step);
  return steps;
}

void ModelMergeCallback::on_start(TrainContext& ctx) {
  const TrainConfig& tc = ctx.config.train;
  const std::string merged_dir = tc.out_dir + "/merged";
  if (ctx.world.rank() == 0) remove_interrupted_saves(merged_dir);
  std::vector<int64_t> skipped;
  for (const int64_t last : merge_steps(tc, tc.max_steps)) {
    const int64_t first = last - tc.merge_last_n_steps + 1;
    if (last <= ctx.step) continue;  // merged (or skipped) before the checkpoint
    if (first < ctx.step) {          // updates first .. step - 1 were summed by the stopped process
      skipped.push_back(last);
      continue;
    }
    windows_.push_back({first, last, std::nullopt, 0});
    // Resumed at the window's first update: the weights in hand are that update's.
    if (first == ctx.step) add(ctx, windows_.back());
  }
  if (ctx.world.rank() != 0) return;
  std::string planned;
  for (const Window& w : windows_)
    planned +=
        fmt::format("{}{} (updates {}-{})", planned.empty() ? "" : ", ", w.last, w.first, w.last);
  if (!windows_.empty())
    ctx.progress.message(fmt::format(
        "model merging: the weights averaged over the last {} updates before step {}, written "
        "to {}/checkpoints (OLMo-core's ModelMergeCallback)",
        tc.merge_last_n_steps, planned, merged_dir));
  for (const int64_t last : skipped)
    ctx.progress.message(fmt::format(
        "warning: the merge at step {} is skipped: the run resumed at step {}, inside its "
        "window of updates {}-{}, whose earlier updates' weights were not kept",
        last, ctx.step, last - tc.merge_last_n_steps + 1, last));
  for (const int64_t last : merge_steps(tc, tc.max_steps))
    if (last > tc.max_steps)
      ctx.progress.message(fmt::format(
          "warning: train.merge_steps holds {}, after the run's last update ({}): never merged",
          last, tc.max_steps));
}

void ModelMergeCallback::add(TrainContext& ctx, Window& window) {
  if (!window.sum) {
    window.sum.emplace(ctx.layout, ctx.params.device());  // zeroed
  }
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert}) {
    const int64_t n = static_cast<int64_t>(ctx.layout.numel(group));
    if (n == 0) continue;
    kernels::add(view(window.sum->data(group), {n}), view(ctx.params.data(group), {n}),
                 view(window.sum->data(group), {n}));
  }
  ++window.count;
}

void ModelMergeCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (report.step < it->first || report.step > it->last) {
      ++it;
      continue;
    }
    add(ctx, *it);
    if (report.step == it->last) {
      write(ctx, *it);
      it = windows_.erase(it);
    } else {
      ++it;
    }
  }
}

void ModelMergeCallback::write(TrainContext& ctx, Window& window) {
  ParamBuffers& average = *window.sum;
  const float factor = 1.0f / static_cast<float>(window.count);
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert}) {
    const int64_t n = static_cast<int64_t>(ctx.layout.numel(group));
    if (n == 0) continue;
    kernels::scale(view(average.data(group), {n}), factor, view(average.data(group), {n}));
  }
  // Buffers are not averaged (OLMo-core's are not parameters): the merge step's.
  for (const ParamSpec& spec : ctx.layout.specs())
    if (spec.is_buffer)
      copy_bytes(average.at(spec), ctx.params.at(spec), spec.numel * sizeof(float));
  const TrainConfig& tc = ctx.config.train;
  const std::string merged_dir = tc.out_dir + "/merged";
  const nlohmann::json state = {
      {"step", window.last},
      {"merged",
       {{"first_update", window.first}, {"last_update", window.last}, {"updates", window.count}}}};
  const CheckpointContents contents{
      &ctx.given_config, &ctx.full_layout, nullptr,       nullptr, state,
      hf_config_,        tokenizer_json_,  hf_side_files_};
  const bool rank0 = ctx.world.rank() == 0;
  const std::string staging = checkpoint_staging_dir(merged_dir, window.last, owner_pid_);
  if (rank0) begin_checkpoint(merged_dir, window.last, owner_pid_);
  ctx.world.barrier();
  write_checkpoint_part(staging, {ctx.world.rank(),
                                  ctx.world.size(),
                                  &average,
                                  ctx.optimizer.checkpoint_weights(),
                                  {},
                                  std::nullopt});
  ctx.world.barrier();
  if (rank0) {
    const std::string dir =
        commit_checkpoint(merged_dir, window.last, staging, contents, ctx.world.size(), 0);
    ctx.progress.message(
        fmt::format("merged checkpoint {} (the weights averaged over updates {}-{})", dir,
                    window.first, window.last));
  }
  window.sum.reset();
}

}  // namespace moecore
