// Memory per rank of a training step, counted the way the trainer allocates it (train/trainer.cpp,
// dist/distributed_optimizer.cpp, train/pipeline_runner.cpp, dist/rowwise_exchange.cpp): every
// figure is bytes on one rank of pipeline stage `stage` (the ranks of a stage hold the same sizes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/params.h"
#include "plan/activation_model.h"
#include "plan/step_shapes.h"
#include "train/layout_validation.h"
#include "train/run_config.h"

namespace moecore::plan {

struct RankMemory {
  int64_t stage = 0;
  std::vector<int64_t> chunks;  // global model chunks this rank runs
  int64_t dense_params = 0;     // floats of this rank's dense and expert tables
  int64_t expert_params = 0;
  double weights = 0.0;    // fp32 parameters
  double gradients = 0.0;  // fp32, same tables
  double optimizer_state =
      0.0;  // Adam moments (ZeRO-1: this rank's shard, plus its gradient shard)
  double optimizer_scratch =
      0.0;  // ZeRO-1: padded reduce-scatter / all-gather buffers, freed after
  // Open MPI's own temporaries during the gradient reduction (measured, see memory_model.cpp).
  double mpi_scratch = 0.0;
  double reduction_peak = 0.0;      // the most of optimizer and MPI scratch alive at once
  double bf16_weight_copies = 0.0;  // model/bf16_weight_copies.h: train.precision = "bf16"
  // model/mx_weight_caches.h (mxfp8): both orientations of each MX weight.
  double mx_weight_caches = 0.0;
  // bf16 and mxfp8: the fp32 expert inputs each chunk's MoE block lends to its layers' forwards.
  double lent_expert_inputs = 0.0;
  // bf16 and mxfp8: the GEMM operand copies kept for the run (plan/activation_model.h's
  // operand_copy_bytes).
  double operand_copies = 0.0;
  ActivationBytes activations_per_microbatch;  // every chunk of this rank, one micro-batch each
  std::vector<double> chunk_activations;       // each chunk's one micro-batch, in bytes
  // The most micro-batches whose activations are alive at once, per chunk, replayed from this
  // stage's action list (dist::pipeline_schedule); the runner keeps one slot per live micro-batch.
  std::vector<int64_t> live_microbatches;
  int64_t peak_live_microbatches = 0;  // over all chunks (dist::peak_live_activations)
  double activations = 0.0;            // sum over chunks of live slots x that chunk's bytes
  // train.recompute: the chunks' rebuilt-layer buffers, kept all run outside the workspace
  double recompute_buffers = 0.0;
  // train.merge_steps / merge_interval: the fp32 sums of the open merge windows
  // (train/callbacks/model_merger.h), each of the tensors this rank writes.
  double merge_sums = 0.0;
  // train.downstream_tasks: the scorer's host copy of a group of continuations' logits
  // (train/downstream_eval.h), at most the rows a training pass's head holds (a chunk's, or the
  // micro-batch's) x vocab, on the stage with the head: on top of the step's peak on the CPU,
  // `host` on an accelerator. The device computes them in the workspace, within what the head's
  // backward takes there (its logit gradient and dhidden), so it adds nothing on the device.
  double downstream_logits = 0.0;
  double pass_scratch = 0.0;  // forward/backward temporaries: the chunks' workspaces, summed
  std::vector<double> chunk_scratch;  // each chunk's
  // core/workspace.h, one per chunk, kept all run: ZeRO-1's buffers borrow the first chunk's, so
  // the larger of them and that chunk's scratch, plus the other chunks' scratch.
  double workspace = 0.0;
  // rowwise: input and output windows of capacity rows; symmetric: its receive window of
  // ep x block rows
  double dispatch_buffers = 0.0;
  int64_t dispatch_capacity_rows = 0;
  double pipeline_buffers = 0.0;  // posted receives and unfinished sends of hidden states
  double batch_tokens = 0.0;      // the step's token and target ids (global micro-batches)
  double runtime = 0.0;           // process baseline from the hardware profile
  // The sum, with the workspace and the MPI scratch alive together; on an accelerator without the
  // host-side buffers (the token ids, the downstream logits' copy), which are then `host`.
  double peak = 0.0;
  double host = 0.0;
  // The run's update shapes (plan/step_shapes.h) and this rank's peak at each alone, when it
  // takes more than one; the figures above are then theirs together (run_rank_memory).
  std::vector<StepShape> update_shapes;
  std::vector<double> shape_peaks;
};

// One update shape's (config's train.seq_len, microbatches and the layout's rows). `local` is the
// stage's parameter layout: ParamLayout::build(config.model, layout.ep, 0,
// dist::stage_chunks(layout.chunk_layers, layout.pp, stage)), which a search over layouts that
// share it builds once (it names every tensor: most of a large model's planning time).
RankMemory rank_memory(const RunConfig& config, const ResolvedLayout& layout, int64_t stage,
                       double runtime_bytes, bool device, const ParamLayout& local);

// A rank's memory over the run's update shapes (plan/step_shapes.h: a batch-size schedule's
// sizes, a sequence-length warm-up's lengths): the trainer's buffers keep the largest size they
// were given, so each part is its largest over the shapes, the activations slot by slot (a
// chunk's k-th live micro-batch slot is as large as the largest micro-batch it held), and the ids
// of a warm-up's cut batch come beside those of the batch as read. One shape: rank_memory's.
RankMemory run_rank_memory(const RunConfig& config, const ResolvedLayout& layout, int64_t stage,
                           double runtime_bytes, bool device, const ParamLayout& local);
// The same, the stage's parameter layout built here.
RankMemory run_rank_memory(const RunConfig& config, const ResolvedLayout& layout, int64_t stage,
                           double runtime_bytes, bool device = false);

}  // namespace moecore::plan
