// Runs one optimizer step's forward and backward passes over the micro-batches through the
// pipeline stages (src/dist/pipeline_schedule.h): this rank's model chunks in its schedule's
// order, hidden states and their gradients sent to the neighbouring stages with the pp group's
// non-blocking point-to-point (dist::Communicator), and the receives of the next actions posted
// before they are needed.
//
// Activations: each chunk keeps one slot per micro-batch in flight, taken at its forward and given
// back at its backward; the runner counts the slots alive and checks, every step, that the
// schedule's bound holds (1F1B: at most pp - stage micro-batches; GPipe: all of them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/device_memory.h"
#include "dist/mesh.h"
#include "dist/pipeline_schedule.h"
#include "model/transformer.h"

namespace moecore {

class PipelineRunner {
 public:
  // chunks: this rank's model chunks in virtual-stage order (chunk c is global chunk
  // c * pp + stage).
  PipelineRunner(const dist::Mesh& mesh, std::vector<Transformer*> chunks,
                 PipelineSchedule schedule, int64_t microbatches);

  // Another count of micro-batches a step (a change of the batch size: train.batch_sizes): the
  // schedule's actions and the bound on live activations are made anew for it.
  void set_microbatches(int64_t microbatches);
  int64_t microbatches() const { return microbatches_; }

  struct MicroBatch {
    const int32_t* tokens;   // this rank's rows, read by the chunk with the embedding
    const int32_t* targets;  // counted by every chunk, read by the one with the head
  };
  // Called before (done = false) and after (done = true) each chunk pass, e.g. to set the routing
  // seed or a gradient-ready hook, or to collect dispatch statistics.
  using PassHook = std::function<void(Transformer& chunk, bool forward, int64_t micro, bool done)>;

  // grads += the gradients of sum over micro-batches of loss_scale * loss. The passes leave their
  // loss parts where the model's tensors are (Transformer::read_losses): no pass waits for them.
  void train_step(const ParamBuffers& params, ParamBuffers& grads,
                  const std::vector<MicroBatch>& micro, int64_t rows, int64_t seq, float loss_scale,
                  const PassHook& hook);
  // The last train_step's sum of loss_scale * (this rank's chunks' loss parts) over the
  // micro-batches, added in the order the passes ran (summed over the stages that is the step's
  // loss): one copy per chunk, a wait for the device.
  LossParts read_losses();

  // One batch through every chunk, no backward (evaluation): the loss parts of this rank's chunks
  // (ce and counted tokens on the last stage only). targets == nullptr: a pass for the logits,
  // which the chunk with the head then holds (its parts are meaningless).
  LossParts forward_only(const ParamBuffers& params, const int32_t* tokens, const int32_t* targets,
                         int64_t rows, int64_t seq);

  int64_t peak_live() const { return peak_live_; }  // (micro-batch, chunk) activations, last step
  // Seconds of the last step spent waiting for a neighbouring stage, and the step's seconds: their
  // ratio is this stage's measured bubble.
  double idle_seconds() const { return idle_seconds_; }
  double step_seconds() const { return step_seconds_; }

 private:
  struct Pending;
  std::vector<size_t> forwards_;  // the last step's chunk of each forward pass, in order
  float loss_scale_ = 1.0f;       // and its loss_scale  // a posted receive or send and its buffer
  // Message buffers of finished receives and sends, reused by the next ones (this step's and the
  // following steps'), so that a step after the first asks the heap for none.
  std::vector<DeviceArray<float>> spare_buffers_;

  int64_t global_chunk(int64_t chunk) const { return chunk * pp_ + stage_; }
  int tag(int64_t global, int64_t micro, bool gradient) const;
  bool first_chunk(int64_t chunk) const { return global_chunk(chunk) == 0; }
  bool last_chunk(int64_t chunk) const { return global_chunk(chunk) == pp_ * v_ - 1; }
  // The pp rank that runs global chunk g.
  int stage_of(int64_t global) const { return static_cast<int>(global % pp_); }

  const dist::Mesh& mesh_;
  std::vector<Transformer*> chunks_;
  PipelineSchedule schedule_;
  int64_t pp_, stage_, v_, microbatches_;
  std::vector<dist::PipelineAction> actions_;
  int64_t live_bound_ = 0, peak_live_ = 0;
  double idle_seconds_ = 0.0, step_seconds_ = 0.0;
};

}  // namespace moecore
