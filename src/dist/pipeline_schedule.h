// Pipeline parallelism: which layers each stage runs and in what order each stage runs the
// forward and backward passes of its micro-batches (DESIGN.md, "Pipeline").
//
// The layers are cut into pp * v contiguous model chunks; stage s runs chunks s, s + pp, ...,
// s + (v - 1) * pp (v = 1 except for the interleaved schedule, OLMo-core's and Megatron's virtual
// stages). The embedding is on chunk 0, the final norm, LM head and loss on the last.
//
// Schedules, for m micro-batches:
//   gpipe            all forwards, then all backwards: m micro-batches of activations alive.
//   1f1b             pp - s - 1 warm-up forwards, then one forward / one backward alternately,
//                    then the remaining backwards: at most pp - s micro-batches alive on stage s.
//   interleaved-1f1b 1F1B over (micro-batch, chunk) pairs, chunks taken in groups of pp
//                    micro-batches; warm-up (pp - s - 1) * 2 + (v - 1) * pp; needs m % pp == 0.
// The theoretical bubble of 1F1B and GPipe is (pp - 1) / (m + pp - 1); interleaving divides it by
// about v.
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"

namespace moecore {

// [parallel] schedule: 1f1b, interleaved-1f1b, gpipe.
enum class PipelineSchedule { kOneFOneB, kInterleaved, kGPipe };

}  // namespace moecore

namespace moecore::dist {

// Layers per model chunk: `stage_layers` when given (validated: `chunks` positive entries that
// sum to `layers`), else balanced with the remainder on the first chunks (so the last, which also
// carries the LM head, gets the fewest).
std::vector<int64_t> split_layers(int64_t layers, int64_t chunks,
                                  const std::vector<int64_t>& stage_layers);

// The layer ranges of the chunks stage `stage` runs, in virtual-stage order.
std::vector<LayerRange> stage_chunks(const std::vector<int64_t>& layers_per_chunk, int64_t pp,
                                     int64_t stage);

struct PipelineAction {
  bool forward = true;
  int64_t chunk = 0;  // virtual stage on this rank, in [0, v)
  int64_t micro = 0;  // micro-batch
};

// Stage `stage`'s actions for one optimizer step. Checks the schedule's requirements.
std::vector<PipelineAction> pipeline_schedule(PipelineSchedule kind, int64_t pp, int64_t stage,
                                              int64_t virtual_stages, int64_t microbatches);

// The most (micro-batch, chunk) activations that are alive at once when running `actions`.
int64_t peak_live_activations(const std::vector<PipelineAction>& actions);

}  // namespace moecore::dist
