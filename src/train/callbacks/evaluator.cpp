#include "train/callbacks/evaluator.h"

#include <algorithm>
#include <chrono>

#include "core/device_memory.h"
#include "model/router.h"
#include "train/downstream_eval.h"
#include "train/evaluate.h"
#include "train/lm_evaluator.h"
#include "train/train_context.h"

namespace moecore {

namespace {

// This rank's share of the labelled sets' and the downstream tasks' passes: each data-parallel
// rank (with its pipeline stages) its share, as OLMo-core's samplers spread them; with expert
// parallelism in lockstep (the experts' exchange is collective; train/eval_passes.h). As many
// tokens a pass as this rank's training micro-batch holds.
EvalShare eval_share(const TrainContext& ctx) {
  return {std::max<int64_t>(1, ctx.rows / ctx.mesh.dp.size()) * ctx.config.train.seq_len,
          ctx.mesh.dp.rank(), ctx.mesh.dp.size(), ctx.config.parallel.ep > 1};
}

}  // namespace

bool evaluates_validation_loss(const TrainContext& ctx) {
  return ctx.mesh.dp.rank() == 0 || ctx.config.parallel.ep > 1;
}

bool takes_part_in_evaluation(const TrainContext& ctx) {
  return evaluates_validation_loss(ctx) || !ctx.config.data.lm_eval.empty() ||
         !ctx.config.train.downstream_tasks.empty();
}

void EvalCallback::on_start(TrainContext& ctx) {
  // The resumed checkpoint's step was due an evaluation that a stop signal cancelled.
  if (ctx.eval_pending) evaluate_at(ctx, ctx.step, /*final=*/false);
  ctx.eval_pending = false;
}

void EvalCallback::on_step_end(TrainContext& ctx, StepReport& report) {
  const int64_t every = ctx.config.train.eval_every;
  if (every > 0 && report.step % every == 0 && report.step < ctx.config.train.max_steps) {
    if (ctx.stop_signal != 0) {
      // A signal skips on_end's evaluation: the resumed run makes this one up (also at a hard
      // stop, which a resume without it goes on from).
      ctx.eval_pending = true;
    } else if (!ctx.stopping() && report.step < ctx.last_step) {
      evaluate_at(ctx, report.step, /*final=*/false);
    }
    // Else max_seconds, skip_max_consecutive or the hard stop: on_end evaluates this step.
  }
}

void EvalCallback::on_end(TrainContext& ctx) {
  if (ctx.stop_signal != 0) return;  // skipped
  const EvalResult r = evaluate_at(ctx, ctx.step, /*final=*/true);
  if (val_data_ != nullptr) ctx.summary.val_loss = r.loss;
}

EvalResult EvalCallback::evaluate_at(TrainContext& ctx, int64_t step, bool final, bool merged) {
  // The labelled sets and the downstream tasks have eval intervals of their own.
  auto due = [&](int64_t every) { return final || merged || every == 0 || step % every == 0; };
  const bool scores_sets = lm_eval_ != nullptr && due(ctx.config.train.lm_eval_every);
  const bool scores_tasks = !downstream_.empty() && due(ctx.config.train.downstream_eval_every);
  // The ranks that do not evaluate the loss go on to the next step's first collective and wait
  // there (or, with labelled sets or downstream tasks, to their share of the passes).
  const bool evaluates_loss = evaluates_validation_loss(ctx);
  if (!evaluates_loss && !scores_sets && !scores_tasks) return {};
  const auto started = std::chrono::steady_clock::now();
  // Every pass runs each of this process's chunks once: the last one counts them.
  const int64_t passes_before = ctx.chunks.back()->forward_passes();
  for (Transformer* chunk : ctx.chunks) {
    chunk->set_batch_sum(nullptr);
    chunk->set_routing_seed(routing_forward_seed(ctx.config.train.seed, step, -1));  // all tokens
    chunk->set_routing_token_offset(0);
  }
  EvalResult r;
  const int64_t pp = ctx.config.parallel.pp;
  if (val_data_ != nullptr && evaluates_loss) {
    r = evaluate(
        [&ctx](const int32_t* tokens, const int32_t* targets, int64_t batch_rows, int64_t seq) {
          return ctx.pipeline.forward_only(ctx.params, tokens, targets, batch_rows, seq);
        },
        *val_data_, ctx.rows, ctx.config.train.eval_batches * ctx.rows);
    if (pp > 1) {  // the last stage saw the loss
      double result[4] = {r.loss, r.perplexity, static_cast<double>(r.tokens),
                          static_cast<double>(r.instances)};
      ctx.mesh.pp.broadcast(result, sizeof(result), static_cast<int>(pp - 1));
      r.loss = result[0];
      r.perplexity = result[1];
      r.tokens = static_cast<int64_t>(result[2]);
      r.instances = static_cast<int64_t>(result[3]);
    }
  }
  if (scores_sets || scores_tasks) {
    // Plain causal attention, as OLMo-core's padded and downstream batches carry no document
    // lengths: a request's text may hold the EOS that data.document_masking cuts documents at.
    // (Restored afterwards from the chunks' own setting: the trainer's, train/trainer.cpp.)
    const Transformer& last = *ctx.chunks.back();
    const int32_t masking_eos = last.document_masking_eos();
    const int32_t masking_bos = last.document_masking_bos();
    for (Transformer* chunk : ctx.chunks) chunk->set_document_masking(-1);
    if (scores_sets) r.lm = evaluate_lm(ctx, step, merged);
    if (scores_tasks) r.downstream = evaluate_downstream(ctx, step, merged);
    for (Transformer* chunk : ctx.chunks) chunk->set_document_masking(masking_eos, masking_bos);
  }
  r.merged = merged;
  for (Transformer* chunk : ctx.chunks) chunk->set_batch_sum(ctx.dp_batch_sum);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.batches = ctx.chunks.back()->forward_passes() - passes_before;
  if (ctx.world.rank() == 0) ctx.report_eval(step, r);
  return r;
}

io::MetricsSink::Scalars EvalCallback::evaluate_lm(TrainContext& ctx, int64_t step, bool merged) {
  const int64_t pp = ctx.config.parallel.pp;
  const EvalShare share = eval_share(ctx);
  LmEvalSums sums = score_lm_documents(
      *lm_eval_, lm_documents_,
      [&ctx](const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t seq) {
        return ctx.pipeline.forward_only(ctx.params, tokens, targets, rows, seq);
      },
      share, /*pad_id=*/0);
  if (pp > 1)  // the last stage saw the losses
    ctx.mesh.pp.broadcast(sums.loss.data(), sums.loss.size() * sizeof(double),
                          static_cast<int>(pp - 1));
  if (share.shards > 1)  // each pass's loss is one rank's, 0 on the others
    ctx.mesh.dp.allreduce_sum(sums.loss.data(), static_cast<int64_t>(sums.loss.size()));
  if (ctx.world.rank() != 0) return {};
  const io::MetricsSink::Scalars metrics =
      lm_eval_metrics(*lm_eval_, sums, merged ? "eval/merged/lm/" : "eval/lm/");
  for (size_t i = 0; i + 1 < metrics.size(); i += 2)
    ctx.progress.message(fmt::format("eval  step {:>6}  {} {:.4f}  PPL {:.2f}", step,
                                     metrics[i].first, metrics[i].second, metrics[i + 1].second));
  if (metrics.size() < 2 * lm_eval_->labels().size())
    ctx.progress.message(fmt::format(
        "eval  step {:>6}  {} of data.lm_eval's {} labels had no position counted in the {} "
        "documents scored (OLMo-core logs NaN for them)",
        step, lm_eval_->labels().size() - metrics.size() / 2, lm_eval_->labels().size(),
        lm_documents_.size()));
  return metrics;
}

io::MetricsSink::Scalars EvalCallback::evaluate_downstream(TrainContext& ctx, int64_t step,
                                                           bool merged) {
  const int64_t pp = ctx.config.parallel.pp;
  Transformer& last = *ctx.chunks.back();  // holds the LM head on the last pipeline stage
  const LogitsForward forward = [&](const int32_t* tokens, int64_t rows, int64_t seq) -> LogitsAt {
    last.set_next_logits_on_demand();
    ctx.pipeline.forward_only(ctx.params, tokens, nullptr, rows, seq);
    return last.has_head() ? head_logits_at(last, ctx.params) : LogitsAt();
  };
  const EvalShare share = eval_share(ctx);
  // No more logits at a time than a training pass's head holds: a chunk's, or the micro-batch's.
  const int64_t chunk_tokens = ctx.config.train.lm_head_chunk_tokens;
  const int64_t logit_rows = chunk_tokens > 0 ? chunk_tokens : share.batch_tokens;
  static_assert(sizeof(IclScore) == 2 * sizeof(double));
  io::MetricsSink::Scalars metrics;
  for (const data::IclTask& task : downstream_) {
    std::vector<IclScore> scores =
        score_icl_task(task, forward, ctx.config.model.vocab_size, share, logit_rows,
                       /*pad_id=*/0);
    if (pp > 1)  // the last stage saw the logits
      ctx.mesh.pp.broadcast(scores.data(), scores.size() * sizeof(IclScore),
                            static_cast<int>(pp - 1));
    if (share.shards > 1)  // each score is one rank's, 0 on the others
      ctx.mesh.dp.allreduce_sum(reinterpret_cast<double*>(scores.data()),
                                static_cast<int64_t>(2 * scores.size()));
    if (ctx.world.rank() != 0) continue;
    const auto task_metrics = compute_icl_metrics(task, scores);
    // The console shows each task's first metric (its accuracy, CE loss or BPB).
    ctx.progress.message(fmt::format("eval  step {:>6}  {}{} {:.4f}  ({} documents)", step,
                                     merged ? "merged " : "", task_metrics.front().first,
                                     task_metrics.front().second, task.documents));
    for (const auto& [key, value] : task_metrics)
      metrics.emplace_back((merged ? "eval/merged/downstream/" : "eval/downstream/") + key, value);
  }
  return metrics;
}

}  // namespace moecore
