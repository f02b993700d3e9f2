#include "plan/plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/gemm.h"
#include "plan/units.h"

namespace moecore::plan {

namespace {

std::string schedule_name(PipelineSchedule s) {
  return s == PipelineSchedule::kOneFOneB      ? "1f1b"
         : s == PipelineSchedule::kInterleaved ? "interleaved-1f1b"
                                               : "gpipe";
}

std::string human_count(double n) {
  if (n >= 1e12) return fmt::format("{:.3f}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.3f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3f}M", n / 1e6);
  return fmt::format("{:.0f}", n);
}

std::string human_bytes(double b) {
  if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
  return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
}

// What the figures above leave out, said where it applies.
std::vector<std::string> plan_notes(const Plan& p) {
  std::vector<std::string> notes;
  // train --init-from: rank 0 reads the whole model for its self-check, which holds a second
  // copy; the other ranks read only their share. Released before the first step, so not in the
  // peak.
  const double whole = 4.0 * static_cast<double>(p.params.total);
  notes.push_back(fmt::format(
      "with --init-from, start-up adds the whole model in fp32 on rank 0 ({}; {} during its "
      "self-check; the other ranks read only their share), released before the first step",
      human_bytes(whole), human_bytes(2.0 * whole)));
  // The planned bf16 rate is a native bf16 GEMM's; a CPU without bf16 instructions runs fp32
  // GEMMs on operands it rounds in each call, neither priced nor counted here.
  // A batch-size schedule or a sequence-length warm-up: updates of other shapes.
  if (!p.stages.empty() && !p.stages.front().update_shapes.empty())
    notes.push_back(fmt::format(
        "the step time is an update of the run's own shape ({} sequences x {} tokens in {} "
        "micro-batches{}); the warm-up's and other batch sizes' updates take other times",
        p.config.train.batch_size, p.config.train.seq_len, p.config.train.microbatches,
        p.config.train.seq_len_warmup_steps > 0 ? ", after the warm-up" : ""));
  if (!p.hardware.device && p.config.train.precision != TrainPrecision::kFp32 &&
      kernels::bf16_gemm_path() != kernels::Bf16GemmPath::kNative)
    notes.push_back(
        "this CPU has no native bf16: its bf16 GEMMs are emulated (fp32 GEMMs on operands "
        "rounded in each call, slower than fp32 here), so the step time is under-predicted and "
        "memory too (the emulation's fp32 operand copies are not counted)");
  return notes;
}

}  // namespace

double Plan::peak_bytes() const {
  double peak = 0.0;
  for (const RankMemory& m : stages) peak = std::max(peak, m.peak);
  return peak;
}

Plan make_plan(const RunConfig& config, int64_t world, const Hardware& hardware) {
  Plan p;
  p.config = config;
  p.layout = validate_layout(config, world);
  p.params = count_params(config.model);
  p.flops = flops_per_token(config.model, config.train.seq_len);
  p.hardware = hardware;
  for (int64_t s = 0; s < p.layout.pp; ++s) {
    p.stages.push_back(
        run_rank_memory(config, p.layout, s, hardware.runtime_bytes, hardware.device));
    p.comms.push_back(rank_collectives(config, p.layout, s));
  }
  p.has_step_time = hardware.rates.known();
  if (p.has_step_time) p.step = step_time(config, p.layout, hardware.rates);
  return p;
}

nlohmann::json flops_json(const FlopsPerToken& f) {
  return {{"attention_projections", f.attention_projections},
          {"attention_scores", f.attention_scores},
          {"router", f.router},
          {"experts", f.experts},
          {"shared_expert", f.shared_expert},
          {"dense_mlp", f.dense_mlp},
          {"lm_head", f.lm_head},
          {"total", f.total()}};
}

namespace {

nlohmann::json step_time_json(const StepTime& t) {
  nlohmann::json breakdown = nlohmann::json::object();
  for (int i = 0; i < kTimeCategories; ++i)
    breakdown[time_category_name(static_cast<TimeCategory>(i))] =
        t.breakdown[static_cast<size_t>(i)];
  return {{"seconds", t.seconds},
          {"critical_stage", t.critical_stage},
          {"stage_seconds", t.stage_seconds},
          {"tokens_per_s_per_rank", t.tokens_per_s_per_rank},
          {"model_flops_per_s_per_rank", t.model_flops_per_s_per_rank},
          {"mfu", t.mfu},
          {"bubble", t.bubble},
          {"breakdown_seconds", breakdown}};
}

std::string step_time_text(const StepTime& t) {
  std::string out = fmt::format(
      "step time: {:.4g} s (stage {} is the slowest), {:.4g} tokens/s per rank, MFU {:.1f}%\n",
      t.seconds, t.critical_stage, t.tokens_per_s_per_rank, 100.0 * t.mfu);
  out += "  where the time goes:";
  for (int i = 0; i < kTimeCategories; ++i) {
    const double sec = t.breakdown[static_cast<size_t>(i)];
    if (sec <= 0.0) continue;
    out += fmt::format(" {} {:.1f}%", time_category_name(static_cast<TimeCategory>(i)),
                       100.0 * sec / t.seconds);
  }
  return out + "\n";
}

// The run's update shapes and the rank's peak at each alone (none listed for a run of one).
nlohmann::json update_shapes_json(const RankMemory& m) {
  nlohmann::json shapes = nlohmann::json::array();
  for (size_t i = 0; i < m.update_shapes.size(); ++i) {
    const StepShape& shape = m.update_shapes[i];
    shapes.push_back({{"updates", shape.updates},
                      {"seq_len", shape.seq_len},
                      {"microbatches", shape.microbatches},
                      {"rows_per_rank", shape.local_rows},
                      {"warmup_cut", shape.cut},
                      {"peak_alone", m.shape_peaks[i]}});
  }
  return shapes;
}

}  // namespace

nlohmann::json plan_json(const Plan& p) {
  const ResolvedLayout& l = p.layout;
  const ParallelConfig& pc = p.config.parallel;
  const TrainConfig& tc = p.config.train;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const RankMemory& m = p.stages[s];
    const ActivationBytes& a = m.activations_per_microbatch;
    nlohmann::json comms = nlohmann::json::array();
    for (const CollectiveBytes& c : p.comms[s])
      comms.push_back({{"group", c.group}, {"op", c.op}, {"what", c.what}, {"bytes", c.bytes}});
    stages.push_back({{"stage", m.stage},
                      {"chunks", m.chunks},
                      {"params", {{"dense", m.dense_params}, {"expert", m.expert_params}}},
                      {"memory_bytes",
                       {{"weights", m.weights},
                        {"gradients", m.gradients},
                        {"optimizer_state", m.optimizer_state},
                        {"optimizer_scratch", m.optimizer_scratch},
                        {"mpi_scratch", m.mpi_scratch},
                        {"reduction_peak", m.reduction_peak},
                        {"bf16_weight_copies", m.bf16_weight_copies},
                        {"merge_sums", m.merge_sums},
                        {"downstream_logits", m.downstream_logits},
                        {"mx_weight_caches", m.mx_weight_caches},
                        {"lent_expert_inputs", m.lent_expert_inputs},
                        {"operand_copies", m.operand_copies},
                        {"activations", m.activations},
                        {"recompute_buffers", m.recompute_buffers},
                        {"pass_scratch", m.pass_scratch},
                        {"workspace", m.workspace},
                        {"dispatch_buffers", m.dispatch_buffers},
                        {"pipeline_buffers", m.pipeline_buffers},
                        {"batch_tokens", m.batch_tokens},
                        {"runtime", m.runtime},
                        {"peak", m.peak},
                        {"host", m.host}}},
                      {"activations_per_microbatch_bytes",
                       {{"residual", a.residual},
                        {"norms", a.norms},
                        {"attention", a.attention},
                        {"dense_mlp", a.dense_mlp},
                        {"moe", a.moe},
                        {"head", a.head},
                        {"total", a.total()}}},
                      {"update_shapes", update_shapes_json(m)},
                      {"live_microbatches_per_chunk", m.live_microbatches},
                      {"peak_live_microbatches", m.peak_live_microbatches},
                      {"dispatch_capacity_rows", m.dispatch_capacity_rows},
                      {"collective_bytes_per_step", comms}});
  }
  const ParamCounts& pr = p.params;
  const FlopsPerToken& f = p.flops;
  return {{"layout",
           {{"world", l.world},
            {"pp", l.pp},
            {"dp", l.dp},
            {"ep", l.ep},
            {"ep_dp", l.ep_dp},
            {"zero", pc.zero},
            {"dispatch", pc.dispatch == Dispatch::kSync ? "sync" : "rowwise"},
            {"capacity_factor", pc.capacity_factor},
            {"rowwise_transport", rowwise_transport_name(pc.rowwise_transport)},
            {"schedule", schedule_name(pc.schedule)},
            {"virtual_stages", l.virtual_stages},
            {"chunk_layers", l.chunk_layers},
            {"microbatches", tc.microbatches},
            {"micro_batch_rows", l.micro_rows},
            {"rows_per_rank", l.local_rows},
            {"seq_len", tc.seq_len},
            {"tokens_per_step", tc.batch_size * tc.seq_len},
            {"recompute", recompute_name(tc.recompute)},
            {"lm_head_chunk_tokens", tc.lm_head_chunk_tokens}}},
          {"parameters",
           {{"total", pr.total},
            {"active", pr.active},
            {"embedding", pr.embedding},
            {"lm_head", pr.lm_head},
            {"attention", pr.attention},
            {"norms", pr.norms},
            {"dense_mlp", pr.dense_mlp},
            {"routers", pr.routers},
            {"shared_experts", pr.shared_experts},
            {"routed_experts", pr.routed_experts}}},
          {"flops_per_token", flops_json(f)},
          {"hardware",
           {{"name", p.hardware.name},
            {"memory_bytes", p.hardware.memory_bytes},
            {"runtime_bytes", p.hardware.runtime_bytes},
            {"device", p.hardware.device},
            {"source", p.hardware.source}}},
          {"peak_bytes_per_rank", p.peak_bytes()},
          {"fits", p.fits()},
          {"step_time", p.has_step_time ? step_time_json(p.step) : nlohmann::json(nullptr)},
          {"notes", plan_notes(p)},
          {"stages", stages}};
}

std::string plan_text(const Plan& p) {
  const ResolvedLayout& l = p.layout;
  const ParallelConfig& pc = p.config.parallel;
  const ParamCounts& pr = p.params;
  std::string out;
  out += fmt::format(
      "layout: {} ranks = pp {} x dp {} (ep {} x ep_dp {}), zero={}, dispatch={}, schedule={}, "
      "virtual_stages={}, microbatches={} of {} sequences ({} per rank) x {} tokens, "
      "recompute={}{}\n",
      l.world, l.pp, l.dp, l.ep, l.ep_dp, pc.zero,
      pc.dispatch == Dispatch::kSync                         ? "sync"
      : pc.rowwise_transport == RowwiseTransport::kPadded    ? "rowwise (padded)"
      : pc.rowwise_transport == RowwiseTransport::kSymmetric ? "rowwise (symmetric)"
                                                             : "rowwise",
      schedule_name(pc.schedule), l.virtual_stages, p.config.train.microbatches, l.micro_rows,
      l.local_rows, p.config.train.seq_len, recompute_name(p.config.train.recompute),
      p.config.train.lm_head_chunk_tokens > 0
          ? fmt::format(", LM head in chunks of {} tokens", p.config.train.lm_head_chunk_tokens)
          : std::string());
  out += fmt::format(
      "parameters: {} total, {} active (embedding {}, LM head {}, attention {}, dense MLP {}, "
      "routers {}, shared experts {}, routed experts {})\n",
      human_count(static_cast<double>(pr.total)), human_count(static_cast<double>(pr.active)),
      human_count(static_cast<double>(pr.embedding)), human_count(static_cast<double>(pr.lm_head)),
      human_count(static_cast<double>(pr.attention)),
      human_count(static_cast<double>(pr.dense_mlp)), human_count(static_cast<double>(pr.routers)),
      human_count(static_cast<double>(pr.shared_experts)),
      human_count(static_cast<double>(pr.routed_experts)));
  out += fmt::format("model FLOPs per token: {:.4g} (forward + backward, seq_len {})\n",
                     p.flops.total(), p.config.train.seq_len);
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const RankMemory& m = p.stages[s];
    const ActivationBytes& a = m.activations_per_microbatch;
    out += fmt::format("stage {} (chunks", m.stage);
    for (int64_t c : m.chunks) out += fmt::format(" {}", c);
    out += fmt::format("): peak {} per rank", human_bytes(m.peak));
    if (m.host > 0.0) out += fmt::format(" (+ {} of host memory)", human_bytes(m.host));
    out += "\n";
    if (!m.update_shapes.empty()) {
      out += "  update shapes, the peak of each alone:";
      for (size_t i = 0; i < m.update_shapes.size(); ++i)
        out += fmt::format("{} {} {}", i == 0 ? "" : ";", m.update_shapes[i].updates,
                           human_bytes(m.shape_peaks[i]));
      out += "; the peak is theirs together (each buffer keeps the largest size it is given)\n";
    }
    out += fmt::format(
        "  weights {}, gradients {}, optimizer state {}, optimizer scratch {}, MPI scratch {}, "
        "bf16 copies {}{}{}{}{}{}\n",
        human_bytes(m.weights), human_bytes(m.gradients), human_bytes(m.optimizer_state),
        human_bytes(m.optimizer_scratch), human_bytes(m.mpi_scratch),
        human_bytes(m.bf16_weight_copies),
        m.mx_weight_caches > 0.0
            ? fmt::format(", MX weight caches {}", human_bytes(m.mx_weight_caches))
            : "",
        m.lent_expert_inputs > 0.0
            ? fmt::format(", lent expert inputs {}", human_bytes(m.lent_expert_inputs))
            : "",
        m.operand_copies > 0.0
            ? fmt::format(", GEMM operand copies {}", human_bytes(m.operand_copies))
            : "",
        m.merge_sums > 0.0 ? fmt::format(", model merge sums {}", human_bytes(m.merge_sums)) : "",
        m.downstream_logits > 0.0
            ? fmt::format(", downstream logits {}{}", human_bytes(m.downstream_logits),
                          m.host > 0.0 ? " (host memory)" : "")
            : "");
    out += fmt::format(
        "  activations per micro-batch {} (residual {}, norms {}, attention {}, dense MLP {}, MoE "
        "{}, head {}) x live micro-batches per chunk [",
        human_bytes(a.total()), human_bytes(a.residual), human_bytes(a.norms),
        human_bytes(a.attention), human_bytes(a.dense_mlp), human_bytes(a.moe),
        human_bytes(a.head));
    for (size_t c = 0; c < m.live_microbatches.size(); ++c)
      out += fmt::format("{}{}", c == 0 ? "" : ", ", m.live_microbatches[c]);
    out += fmt::format("] = {}{}{}\n", human_bytes(m.activations),
                       m.update_shapes.empty()
                           ? ""
                           : " (per micro-batch: the first shape's; each slot as large as the "
                             "largest micro-batch it holds over the shapes)",
                       m.recompute_buffers > 0.0
                           ? fmt::format(", recompute buffers {}", human_bytes(m.recompute_buffers))
                           : "");
    out += fmt::format(
        "  pass scratch {} (workspace {}), dispatch buffers {} ({} rows), pipeline buffers {}, "
        "batch ids {}, "
        "runtime {}\n",
        human_bytes(m.pass_scratch), human_bytes(m.workspace), human_bytes(m.dispatch_buffers),
        m.dispatch_capacity_rows, human_bytes(m.pipeline_buffers), human_bytes(m.batch_tokens),
        human_bytes(m.runtime));
    for (const CollectiveBytes& c : p.comms[s])
      out +=
          fmt::format("  {} {} ({}): {} per step\n", c.group, c.op, c.what, human_bytes(c.bytes));
  }
  out += fmt::format("{}: {} per rank of {} ({})\n", p.fits() ? "fits" : "DOES NOT FIT",
                     human_bytes(p.peak_bytes()), human_bytes(p.hardware.memory_bytes),
                     p.hardware.name);
  out += p.has_step_time ? step_time_text(p.step)
                         : fmt::format(
                               "step time: not predicted ({} has no measured rates; "
                               "`make bench-plan` writes bench/results/cpu_profile.json "
                               "for --hardware)\n",
                               p.hardware.name);
  for (const std::string& note : plan_notes(p)) out += "note: " + note + "\n";
  return out;
}

}  // namespace moecore::plan
