// Gradient reduction and the optimizer step of a data-parallel run, with or without ZeRO-1.
//   zero = 0: gradients are all-reduced (dense over dp, experts over ep_dp); every rank keeps the
//             full AdamW state and applies the same update.
//   zero = 1: gradients are reduce-scattered in fp32 over the same groups; each rank keeps the
//             Adam moments of its 1/dp (dense) or 1/ep_dp (expert) slice, updates that slice, and
//             the updated weights are all-gathered. Optimizer memory per rank falls accordingly.
// Either way the clipping norm is the global one: it spans every shard and every expert.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/workspace.h"
#include "dist/mesh.h"
#include "model/params.h"
#include "optim/adamw.h"
#include "optim/optim_config.h"
#include "optim/optimizer_groups.h"
#include "optim/state_piece.h"

namespace moecore::dist {

class DistributedOptimizer {
 public:
  DistributedOptimizer(const ParamLayout& layout, const OptimConfig& config, const Mesh& mesh,
                       bool zero);

  // Overlap (zero = 0): starts the non-blocking all-reduce of layer `layer`'s gradients, which
  // backward() has just finished. reduce_gradients() reduces whatever was not started here.
  void start_layer_reduce(ParamBuffers& grads, int64_t layer);

  // Sums the ranks' gradients (scaled so that the sum is the global-batch gradient) and returns
  // two sums of squares whose sum is the square of the global gradient norm before clipping
  // (f64 [2] where the gradients are, identical on every rank; kernels::step_decision reads
  // them). Where the squares of parts held by other ranks add up (ZeRO-1's slices, experts over
  // ep, pipeline stages), they are summed on the host: such a step reads them back (one copy);
  // one process, or data parallelism without ZeRO-1, reads nothing.
  // `scratch` lends ZeRO-1's padded reduce-scatter and all-gather buffers: the model's workspace,
  // idle between a step's passes, so that these buffers reuse its memory instead of adding to the
  // peak (and the step allocates nothing once sized).
  ConstTensorView reduce_gradients(ParamBuffers& grads, Workspace& scratch);
  // Counts the next step and writes its AdamW coefficients at each optimizer group's learning rate
  // (group_lrs[g], groups().count() of them) where the parameters are (one small copy from the
  // host, before the step's work: a CUDA graph replaying that work reads them there).
  void stage_step(std::span<const double> group_lrs);
  // The optimizer groups of this rank's tensors (optim.group_overrides).
  const OptimizerGroups& groups() const { return groups_; }
  // Applies AdamW with the staged coefficients as step_factors (kernels::step_decision's, where
  // the gradients are) say: clipped by their coefficient, or not at all for a skipped step, which
  // the caller then reports with skipped_step() once it knows. Weights are then identical on
  // every rank that holds them.
  void step(ParamBuffers& params, ParamBuffers& grads, ConstTensorView step_factors,
            Workspace& scratch);
  // The last step() was skipped: the step count goes back (Adam's bias correction counts
  // applied steps only).
  void skipped_step();

  // A resume: fills the optimizer state this rank holds, asking `read` for elements
  // [first, first + count) of the moments of each tensor it keeps a piece of (its ZeRO-1 shard,
  // or every tensor of the layout without ZeRO), so that no rank reads or allocates the rest.
  using StateReader = std::function<void(const ParamSpec& spec, size_t first, size_t count,
                                         float* exp_avg, float* exp_avg_sq)>;
  void restore_state(const StateReader& read, int64_t steps_taken);
  // Floats of optimizer state (Adam moments) this rank holds.
  int64_t state_floats() const;

  // This rank's share of a checkpoint, so that every rank writes its own part and nothing is
  // gathered. Each group's flat buffer is cut into equal slices over the ranks that share it (dp
  // for dense, ep_dp for experts: ZeRO-1's shards, or the same cut over replicas when zero = 0).
  // Weights: the tensors whose first element lies in this rank's slice (whole tensors, so the
  // model parts stay loadable by transformers). Moments: under ZeRO-1 this rank's slice cut at
  // tensor boundaries; without it, the same whole tensors as the weights.
  std::vector<const ParamSpec*> checkpoint_weights() const;
  std::vector<StatePiece> checkpoint_state() const;
  int64_t steps_taken() const { return steps_; }

 private:
  struct Shard {
    ParamGroup group;
    const Communicator* comm;
    size_t numel = 0;       // elements of the group
    size_t shard_size = 0;  // ceil(numel / ranks): every rank's slice, padded
    size_t begin = 0, end = 0;
    DeviceArray<float> exp_avg, exp_avg_sq, grad;  // on the default device, as the parameters
  };

  // [begin, end) of this rank's equal slice of `group` (ZeRO-1's shard).
  std::pair<size_t, size_t> slice(ParamGroup group) const;

  const ParamLayout& layout_;
  OptimizerGroups groups_;
  const Mesh& mesh_;
  bool zero_;
  std::optional<AdamW> replica_;  // zero = 0
  std::vector<Shard> shards_;     // zero = 1: dense and expert
  int64_t steps_ = 0;
  AdamWStepCoefficients step_coefficients_;  // zero = 1 (the replica stages its own)
  DeviceArray<double> squares_;              // reduce_gradients' two sums of squares
  // Overlapped reductions in flight: the ranges already started, per group, and their requests.
  std::vector<std::pair<size_t, size_t>> started_[2];
  std::vector<Request> requests_;
};

}  // namespace moecore::dist
