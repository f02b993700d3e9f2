#include "train/callbacks/model_merger.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/ops.h"
#include "train/callbacks/checkpointer.h"
#include "train/callbacks/evaluator.h"
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

void ModelMergeCallback::on_start(TrainContext& ctx) {
  const TrainConfig& tc = ctx.config.train;
  // The tensors this rank writes (whole tensors, as its checkpoint parts), in runs adjacent in
  // both the parameter buffer and the sum.
  written_ = ctx.optimizer.checkpoint_weights();
  // Only the ranks that take part in an evaluation need the whole average.
  evaluate_ = ctx.evaluate_merged && takes_part_in_evaluation(ctx);
  const auto add_run = [this](const ParamSpec& spec, size_t sum_offset) {
    if (!runs_.empty() && runs_.back().group == spec.group &&
        runs_.back().param_offset + runs_.back().count == spec.offset &&
        runs_.back().sum_offset + runs_.back().count == sum_offset)
      runs_.back().count += spec.numel;
    else
      runs_.push_back({spec.group, spec.offset, sum_offset, spec.numel});
  };
  if (evaluate_) {
    // The whole local model, each group's buffer at its own offsets (dense, then expert); the
    // buffers (not averaged) are not summed.
    const size_t dense = ctx.layout.numel(ParamGroup::kDense);
    const auto base = [dense](ParamGroup g) { return g == ParamGroup::kDense ? 0 : dense; };
    for (const ParamSpec& spec : ctx.layout.specs())
      if (!spec.is_buffer) add_run(spec, base(spec.group) + spec.offset);
    for (const ParamSpec* spec : written_) sum_offsets_.push_back(base(spec->group) + spec->offset);
    sum_size_ = dense + ctx.layout.numel(ParamGroup::kExpert);
  } else {
    for (const ParamSpec* spec : written_) {
      sum_offsets_.push_back(sum_size_);
      add_run(*spec, sum_size_);
      sum_size_ += spec->numel;
    }
  }
  std::vector<int64_t> skipped, unreached;
  for (const int64_t last : merge_steps(tc, tc.max_steps)) {
    const int64_t first = last - tc.merge_last_n_steps + 1;
    if (last <= ctx.step) continue;  // merged (or skipped) before the checkpoint
    if (last > ctx.last_step) {      // after the run's length or its hard stop
      unreached.push_back(last);
      continue;
    }
    if (first < ctx.step) {  // updates first .. step - 1 were summed by the stopped process
      skipped.push_back(last);
      continue;
    }
    windows_.push_back({first, last, {}, 0});
    // Resumed at the window's first update: the weights in hand are that update's.
    if (first == ctx.step) add(ctx, windows_.back());
  }
  if (ctx.world.rank() != 0) return;
  const std::string merged_dir = tc.out_dir + "/merged/checkpoints";
  std::string planned;
  for (const Window& w : windows_)
    planned +=
        fmt::format("{}{} (updates {}-{})", planned.empty() ? "" : ", ", w.last, w.first, w.last);
  if (!windows_.empty())
    ctx.progress.message(fmt::format(
        "model merging: the weights averaged over the last {} updates before step {}, written "
        "to {} (OLMo-core's ModelMergeCallback); an open window's sum holds {:.1f} MiB a rank",
        tc.merge_last_n_steps, planned, merged_dir,
        static_cast<double>(sum_size_ * sizeof(float)) / (1 << 20)));
  else if (skipped.empty() && unreached.empty())
    ctx.progress.message(
        fmt::format("model merging: no merge step in updates {}-{} (train.merge_interval={}, "
                    "train.merge_steps holds {})",
                    ctx.step + 1, ctx.last_step, tc.merge_interval, tc.merge_steps.size()));
  for (const int64_t last : skipped)
    ctx.progress.message(fmt::format(
        "warning: the merge at step {} is skipped: the run resumed at step {}, inside its "
        "window of updates {}-{}, whose earlier updates' weights were not kept",
        last, ctx.step, last - tc.merge_last_n_steps + 1, last));
  for (const int64_t last : unreached)
    ctx.progress.message(
        fmt::format("warning: the merge at step {} is not made: the run's last update is {}", last,
                    ctx.last_step));
  // A checkpoint inside a window (after its first update) is a resume point that loses the merge
  // (OLMo-core warns alike).
  if (tc.save_every > 0)
    for (const Window& w : windows_) {
      const int64_t checkpoint = (w.first / tc.save_every + 1) * tc.save_every;
      if (checkpoint < w.last)
        ctx.progress.message(fmt::format(
            "warning: the checkpoint at step {} falls inside the merge window of updates {}-{}: "
            "a run resumed from it skips that merge",
            checkpoint, w.first, w.last));
    }
}

void ModelMergeCallback::add(TrainContext& ctx, Window& window) {
  if (window.sum.empty()) window.sum = DeviceArray<float>(ctx.params.device(), sum_size_);  // 0
  for (const Run& run : runs_) {
    const auto n = static_cast<int64_t>(run.count);
    float* sum = window.sum.data() + run.sum_offset;
    kernels::add(view(sum, {n}), view(ctx.params.data(run.group) + run.param_offset, {n}),
                 view(sum, {n}));
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
  if (sum_size_ > 0) {
    const auto n = static_cast<int64_t>(sum_size_);
    kernels::scale(view(window.sum.data(), {n}), 1.0f / static_cast<float>(window.count),
                   view(window.sum.data(), {n}));
  }
  std::vector<const float*> data;
  for (size_t i = 0; i < written_.size(); ++i) {
    const ParamSpec& spec = *written_[i];
    float* average = window.sum.data() + sum_offsets_[i];
    // Buffers are not averaged (OLMo-core's are not parameters): the merge step's.
    if (spec.is_buffer) copy_bytes(average, ctx.params.at(spec), spec.numel * sizeof(float));
    data.push_back(average);
  }
  const TrainConfig& tc = ctx.config.train;
  const std::string merged_dir = tc.out_dir + "/merged";
  const nlohmann::json state = {
      {"step", window.last},
      {"merged",
       {{"first_update", window.first}, {"last_update", window.last}, {"updates", window.count}}}};
  const CheckpointContents contents{
      &ctx.given_config, &ctx.full_layout, nullptr,       nullptr, state,
      hf_config_,        tokenizer_json_,  hf_side_files_};
  // Weights only (no optimizer part), never pruned.
  const CheckpointPart part{ctx.world.rank(), ctx.world.size(), &ctx.params, written_, {},
                            std::nullopt,     std::move(data)};
  const std::string dir =
      save_collectively(ctx.world, merged_dir, window.last, owner_pid_, part, contents, 0);
  if (ctx.world.rank() == 0)
    ctx.progress.message(
        fmt::format("merged checkpoint {} (the weights averaged over updates {}-{})", dir,
                    window.first, window.last));
  if (ctx.evaluate_merged && ctx.stop_signal == 0) {  // collective: every rank calls it
    if (evaluate_) {
      swap_with_params(ctx, window);  // the average in place, the trained weights in the sum
      for (Transformer* chunk : ctx.chunks) chunk->weights_changed();
    }
    ctx.evaluate_merged(window.last);
    if (evaluate_) {
      swap_with_params(ctx, window);
      for (Transformer* chunk : ctx.chunks) chunk->weights_changed();
    }
  }
  window.sum = {};
}

void ModelMergeCallback::swap_with_params(TrainContext& ctx, Window& window) const {
  constexpr size_t kPiece = size_t{1} << 20;  // elements through the scratch at a time
  DeviceArray<float> scratch(ctx.params.device());
  for (const Run& run : runs_) {
    float* param = ctx.params.data(run.group) + run.param_offset;
    float* sum = window.sum.data() + run.sum_offset;
    for (size_t done = 0; done < run.count; done += kPiece) {
      const size_t n = std::min(kPiece, run.count - done);
      scratch.resize_for_overwrite(n);
      copy_bytes(scratch.data(), param + done, n * sizeof(float));
      copy_bytes(param + done, sum + done, n * sizeof(float));
      copy_bytes(sum + done, scratch.data(), n * sizeof(float));
    }
  }
}

}  // namespace moecore
