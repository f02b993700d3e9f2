// OLMo-core's ModelMergeCallback: the weights averaged over the last train.merge_last_n_steps
// updates before each merge step (train.merge_steps, or every train.merge_interval updates up to
// the run's length), written as a weights-only checkpoint (loadable by transformers, `moecore
// eval` and `generate`; not resumable) at out_dir/merged/checkpoints/step_<merge step>, each
// rank writing its part as for a checkpoint. Each rank sums only the tensors it writes (a
// data-parallel replica's share, not the whole model), in fp32 beside the parameters (on the
// GPU for a device run; OLMo-core sums on the host), one sum per open window, the weights after
// each update of the window added in turn; the average is the sum times 1 / count (within an ulp
// of OLMo-core's division). The router's selection bias (a buffer, not a parameter) is the merge
// step's, as OLMo-core saves its buffers.
//
// When the run evaluates (validation data, labelled sets or downstream tasks:
// ctx.evaluate_merged), each rank that takes part in an evaluation (callbacks/evaluator.h) sums
// its whole local model instead (every parameter the chunks read; buffers excluded), and after
// writing the merged checkpoint swaps the average into the parameters, evaluates it (logged as
// val/merged/..., eval/merged/lm/... and eval/merged/downstream/..., OLMo-core's "eval/merged"
// prefix) and swaps the trained weights back, as OLMo-core's callback does; not when a stop
// signal is pending.
//
// A resume inside a window: the updates of the window before the checkpoint were summed by the
// process that stopped, and are lost, so that merge is skipped with a warning (as OLMo-core does);
// a resume at the window's first update sums the weights it resumed with (they are that update's),
// where OLMo-core averages one update fewer. A window that ends after the run's last update (its
// length, or a hard stop) is not summed.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "model/params.h"
#include "train/callback.h"

namespace moecore {

class ModelMergeCallback final : public Callback {
 public:
  // owner_pid, hf_config, tokenizer_json, hf_side_files: as the checkpointer's (the merged
  // checkpoint's staging directory and its files beside the weights).
  ModelMergeCallback(int64_t owner_pid, nlohmann::json hf_config, std::string tokenizer_json,
                     std::map<std::string, std::string> hf_side_files);
  void on_start(TrainContext& ctx) override;
  void on_step_end(TrainContext& ctx, StepReport& report) override;

 private:
  struct Window {
    int64_t first = 0, last = 0;  // the updates whose weights are averaged, first to last
    DeviceArray<float> sum;       // the written tensors' sums (empty until its first update)
    int64_t count = 0;
  };
  // A run of adjacent written tensors: `count` elements at `param_offset` of a parameter buffer,
  // at `sum_offset` of a window's sum.
  struct Run {
    ParamGroup group;
    size_t param_offset, sum_offset, count;
  };
  void add(TrainContext& ctx, Window& window);
  void write(TrainContext& ctx, Window& window);  // collective
  // Exchanges the summed runs' elements between the parameters and the window's sum.
  void swap_with_params(TrainContext& ctx, Window& window) const;

  int64_t owner_pid_;
  nlohmann::json hf_config_;
  std::string tokenizer_json_;
  std::map<std::string, std::string> hf_side_files_;
  std::vector<const ParamSpec*> written_;  // the tensors this rank writes
  std::vector<size_t> sum_offsets_;        // each one's place in a sum
  std::vector<Run> runs_;
  size_t sum_size_ = 0;
  std::vector<Window> windows_;  // those still to merge
  bool evaluate_ = false;        // this rank evaluates the averages (its whole local model summed)
};

}  // namespace moecore
