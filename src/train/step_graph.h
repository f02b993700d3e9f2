// train.cuda_graph: every training step issued as one device graph (core/device_graph.h; a CUDA
// graph on the GPU): the step's work is captured once and replayed, one launch for the thousands
// of kernels of its passes, its decision and its updates, with no host in between. A replay
// keeps the arguments its capture gave each kernel, so what changes from step to step reaches the
// kernels through device memory written before it: the micro-batches' token ids, targets,
// counts of targets and, with document masking, where each token's document starts (the static
// buffers here), and AdamW's coefficients (DistributedOptimizer::stage_step).
//
// A graph holds the addresses of the buffers it was captured with and the host state of the
// passes it captured (their shapes, what the MoE statistics and the losses are read by): it is
// replayed only while no device memory was freed and no other forward pass (an evaluation) ran on
// the model since it was captured. Otherwise the step runs eagerly, which places every buffer
// for the shapes of training again, and the next step is captured anew.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/device_graph.h"
#include "core/device_memory.h"
#include "core/tensor_view.h"
#include "dist/traffic_counters.h"
#include "model/transformer.h"

namespace moecore {

class StepGraph {
 public:
  // `microbatches` micro-batches of `rows` x `seq` ids each, staged in `device`'s memory, whose
  // graphs capture the steps (an error without). `document_eos` >= 0: document masking, the
  // documents ending at that id (model/document_mask.h).
  StepGraph(Device device, int64_t microbatches, int64_t rows, int64_t seq, int32_t document_eos,
            int32_t document_bos);

  // Micro-batch m's inputs into the static buffers: its ids and targets (host memory), its
  // count of targets and the cross-entropy's divisor (Transformer::BatchCounts), and with
  // document masking its documents' starts, found in its ids here.
  void stage(int64_t micro, const int32_t* tokens, const int32_t* targets, int64_t counted,
             double divisor);
  const int32_t* tokens(int64_t micro) const;
  const int32_t* targets(int64_t micro) const;
  ConstTensorView divisor(int64_t micro) const;  // f64 [1]: the cross-entropy's divisor
  // [rows, seq] (Transformer::set_next_document_starts), or null without document masking.
  const int32_t* document_starts(int64_t micro) const;

  // Runs the step's work `issue` (it issues, on `chunks`, the passes of the staged micro-batches,
  // the decision and the updates, and reads nothing back): by replaying the graph where it is
  // valid, else eagerly where something ran since (or nothing was captured yet), else by
  // capturing it and replaying the capture.
  void run(const std::function<void()>& issue, const std::vector<Transformer*>& chunks);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }  // steps run by replaying an earlier capture
  int64_t eager_steps() const { return eager_steps_; }

 private:
  // What must not change between a graph's capture (or the eager step before it) and a replay.
  struct Marks {
    uint64_t frees = 0;
    int64_t passes = 0;
    bool operator==(const Marks&) const = default;
  };
  static Marks marks(const std::vector<Transformer*>& chunks);

  DeviceGraphs& graphs_;
  int64_t rows_, seq_;
  int32_t document_eos_, document_bos_;
  std::vector<DeviceArray<int32_t>> token_ids_, targets_, document_starts_;
  std::vector<int32_t> host_starts_;
  DeviceArray<double> divisors_;
  std::vector<int64_t> host_counted_;
  std::unique_ptr<DeviceGraph> graph_;
  // The traffic its capture counted (dist/traffic_counters.h), counted again at each replay.
  std::map<std::string, dist::TrafficCount> graph_traffic_;
  std::optional<Marks> ready_;  // after an eager step or a capture: nothing ran since
  int64_t captures_ = 0, replays_ = 0, eager_steps_ = 0;
};

}  // namespace moecore
