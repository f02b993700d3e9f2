#include "train/layout_validation.h"

#include "core/check.h"
#include "dist/mesh.h"
#include "dist/pipeline_schedule.h"
#include "train/communicator_choice.h"
#include "train/seq_len_warmup.h"

namespace moecore {

int64_t resolve_virtual_stages(const ParallelConfig& pc) {
  const int64_t v = pc.virtual_stages > 0
                        ? pc.virtual_stages
                        : (pc.schedule == PipelineSchedule::kInterleaved && pc.pp > 1 ? 2 : 1);
  MOE_CHECK(pc.pp > 1 || v == 1, "[parallel] parallel.virtual_stages={} needs parallel.pp > 1", v);
  return v;
}

ResolvedLayout validate_layout(const RunConfig& config, int64_t world) {
  const ParallelConfig& pc = config.parallel;
  const ModelConfig& mc = config.model;
  const TrainConfig& tc = config.train;
  MOE_CHECK(world >= 1, "[parallel] {} ranks: the world needs at least one", world);
  dist::check_mesh_shape(world, pc.ep, pc.pp);
  check_communicator_layout(config);
  ResolvedLayout r;
  r.world = world;
  r.pp = pc.pp;
  r.dp = world / pc.pp;
  r.ep = pc.ep;
  r.ep_dp = r.dp / pc.ep;
  r.virtual_stages = resolve_virtual_stages(pc);
  r.chunk_layers =
      dist::split_layers(mc.num_hidden_layers, r.pp * r.virtual_stages, pc.stage_layers);
  for (int64_t stage = 0; stage < r.pp; ++stage) {
    // Each stage's placement (as its parameter table would be built): ep divides num_experts;
    // tied embeddings on one stage.
    ParamLayout::check_placement(mc, pc.ep, 0, dist::stage_chunks(r.chunk_layers, r.pp, stage));
    (void)dist::pipeline_schedule(pc.schedule, r.pp, stage, r.virtual_stages, tc.microbatches);
    // And of every batch size of train.batch_sizes (the micro-batch kept, their count moves):
    // whole micro-batches, as the config's check asks of train.microbatches (a layout search
    // tries other counts).
    for (size_t i = 0; i < tc.batch_sizes.size(); ++i) {
      const int64_t rows = tc.batch_size / tc.microbatches;
      MOE_CHECK(tc.batch_sizes[i] % rows == 0,
                "[config] train.batch_sizes[{}]={} is not a whole number of micro-batches of {} "
                "sequences (train.batch_size / train.microbatches, which the schedule keeps)",
                i, tc.batch_sizes[i], rows);
      (void)dist::pipeline_schedule(pc.schedule, r.pp, stage, r.virtual_stages,
                                    tc.batch_sizes[i] / rows);
    }
  }
  MOE_CHECK(r.pp == 1 || mc.lb_loss_style != LbLossStyle::kHf,
            "[parallel] model.lb_loss_style=\"hf\" is one loss over all layers' routers; pipeline "
            "parallelism needs the per-layer \"olmo-core\" style");
  r.micro_rows = tc.batch_size / tc.microbatches;
  MOE_CHECK(
      r.micro_rows % r.dp == 0,
      "[parallel] train.batch_size / train.microbatches = {} sequences per micro-batch do not "
      "split over dp={} ranks",
      r.micro_rows, r.dp);
  r.local_rows = r.micro_rows / r.dp;
  // The sequence-length warm-up's micro-batches, in the pipeline's schedule too.
  for (const int64_t micro : check_warmup_shapes(tc, r.dp)) {
    MOE_CHECK(pc.schedule != PipelineSchedule::kInterleaved || micro % r.pp == 0,
              "[parallel] interleaved-1f1b needs each update's micro-batches to be a multiple of "
              "parallel.pp ({}), and the sequence-length warm-up's updates take {} (OLMo-core's "
              "split of the cut batch)",
              r.pp, micro);
    for (int64_t stage = 0; stage < r.pp; ++stage)
      (void)dist::pipeline_schedule(pc.schedule, r.pp, stage, r.virtual_stages, micro);
  }
  MOE_CHECK(!pc.overlap_grad_reduce || pc.zero == 0,
            "[parallel] parallel.overlap_grad_reduce needs parallel.zero=0 (ZeRO-1 reduce-scatters "
            "the whole gradient after the backward)");
  return r;
}

}  // namespace moecore
