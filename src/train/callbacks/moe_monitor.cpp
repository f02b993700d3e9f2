#include "train/callbacks/moe_monitor.h"

#include <fmt/format.h>

#include "train/moe_metrics.h"
#include "train/train_context.h"

namespace moecore {

namespace {

// Per MoE layer of this rank's chunks (in layer order), the fraction of the last micro-batch's
// routes that the rowwise dispatch dropped, over the whole global batch: each rank counts its own
// routes and drops, and the stage's data-parallel group (ep x ep_dp) sums them. Collective.
std::vector<double> drop_rates(const TrainContext& ctx) {
  std::vector<int64_t> counts;  // [dropped, routes] per MoE layer
  for (const Transformer* chunk : ctx.chunks) {
    for (int64_t layer = chunk->layers().begin; layer < chunk->layers().end; ++layer) {
      const RouterState* router = chunk->router_state(layer);
      if (router == nullptr) continue;
      counts.push_back(chunk->dropped_routes(layer));
      counts.push_back(static_cast<int64_t>(router->topk_index.size()));
    }
  }
  ctx.mesh.dp.allreduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  std::vector<double> rates;
  for (size_t i = 0; i + 1 < counts.size(); i += 2)
    rates.push_back(counts[i + 1] > 0
                        ? static_cast<double>(counts[i]) / static_cast<double>(counts[i + 1])
                        : 0.0);
  return rates;
}

}  // namespace

void MoeMonitorCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  const std::vector<const Transformer*> chunks(ctx.chunks.begin(), ctx.chunks.end());
  MoeMetrics moe = compute_moe_metrics(
      chunks, ctx.rowwise_dispatch ? drop_rates(ctx) : std::vector<double>(),
      [&ctx](double* values, int64_t count) { ctx.mesh.dp.allreduce_sum(values, count); });
  if (ctx.config.parallel.pp > 1)  // every stage's layers reach rank 0's logs
    moe = combine_stage_metrics(moe, ctx.config.model, [&ctx](double* values, int64_t count) {
      ctx.mesh.pp.allreduce_sum(values, count);
    });
  const GerrymanderingDetector::Verdict verdict =
      ctx.gerrymandering.observe(report.loss.lb, moe.mean_load_imbalance);
  if (verdict.newly_flagged)
    ctx.progress.message(fmt::format(
        "warning: token gerrymandering at step {}: load-balancing loss trend {:+.1f}% while load "
        "imbalance trend {:+.1f}% over the last {} steps",
        report.step, 100.0 * verdict.lb_trend, 100.0 * verdict.imbalance_trend,
        ctx.config.train.gerrymander_window));
  report.scalars.emplace_back("moe/gerrymandering", verdict.flagged ? 1.0 : 0.0);
  report.scalars.emplace_back("moe/lb_trend", verdict.lb_trend);
  report.scalars.emplace_back("moe/imbalance_trend", verdict.imbalance_trend);
  for (auto& scalar : moe.scalars(report.log_step)) report.scalars.push_back(std::move(scalar));
  report.load_imbalance = moe.mean_load_imbalance;
}

}  // namespace moecore
