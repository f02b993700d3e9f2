// The parallel layout checks of a training run, as pure functions of the config and the world size
// (no MPI): the trainer runs them before building anything, and `moecore plan` runs the same ones,
// so the planner never accepts a layout the trainer would refuse, nor the reverse.
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"
#include "train/run_config.h"

namespace moecore {

// The layout a run of `world` ranks uses, once checked.
struct ResolvedLayout {
  int64_t world = 1;
  int64_t pp = 1;
  int64_t dp = 1;                     // world / pp: ranks of one pipeline stage
  int64_t ep = 1;                     // experts split over ep consecutive ranks of a stage
  int64_t ep_dp = 1;                  // dp / ep: ranks holding the same experts
  int64_t virtual_stages = 1;         // model chunks per rank
  std::vector<int64_t> chunk_layers;  // layers of each of the pp * virtual_stages chunks
  int64_t micro_rows = 1;             // sequences per micro-batch, all dp ranks together
  int64_t local_rows = 1;             // this rank's share: micro_rows / dp
};

// parallel.virtual_stages with its default (2 for interleaved-1f1b at pp > 1, else 1), checked.
int64_t resolve_virtual_stages(const ParallelConfig& parallel);

// Every layout constraint of the trainer, each failing with a one-line error that names it:
// pp divides the world, ep divides a stage's ranks and num_experts, the layers fill the model
// chunks (pp x virtual_stages <= layers, stage_layers), each stage's schedule is valid
// (interleaved: microbatches a multiple of pp), a micro-batch splits over dp, tied embeddings and
// the hf load-balancing style only without a pipeline, overlap_grad_reduce only without ZeRO-1,
// the NCCL communicator only on a device and without a pipeline (check_communicator_layout).
ResolvedLayout validate_layout(const RunConfig& config, int64_t world);

}  // namespace moecore
