#include "dist/distributed_optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "core/check.h"
#include "core/phase_timer.h"
#include "kernels/ops.h"

namespace moecore::dist {

std::pair<size_t, size_t> DistributedOptimizer::slice(ParamGroup group) const {
  const Communicator& comm = group == ParamGroup::kDense ? mesh_.dp : mesh_.ep_dp;
  const size_t numel = layout_.numel(group), ranks = static_cast<size_t>(comm.size());
  const size_t shard_size = (numel + ranks - 1) / ranks;
  const size_t begin = std::min(numel, static_cast<size_t>(comm.rank()) * shard_size);
  return {begin, std::min(numel, begin + shard_size)};
}

DistributedOptimizer::DistributedOptimizer(const ParamLayout& layout, const OptimConfig& config,
                                           const Mesh& mesh, bool zero)
    : layout_(layout), groups_(layout, config), mesh_(mesh), zero_(zero) {
  if (!zero_) {
    replica_.emplace(layout, config);
    return;
  }
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert}) {
    Shard s;
    s.group = group;
    s.comm = group == ParamGroup::kDense ? &mesh.dp : &mesh.ep_dp;
    s.numel = layout.numel(group);
    const size_t ranks = static_cast<size_t>(s.comm->size());
    s.shard_size = (s.numel + ranks - 1) / ranks;
    std::tie(s.begin, s.end) = slice(group);
    s.exp_avg.resize(s.end - s.begin);  // zeroed
    s.exp_avg_sq.resize(s.end - s.begin);
    s.grad.resize(s.shard_size);
    shards_.push_back(std::move(s));
  }
}

void DistributedOptimizer::start_layer_reduce(ParamBuffers& grads, int64_t layer) {
  MOE_CHECK(!zero_, "[parallel] overlap_grad_reduce works with zero=0 only");
  const ScopedPhase timer(Phase::kCommunication);
  for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert}) {
    const auto [begin, end] = layout_.layer_range(group, layer);
    if (begin == end) continue;
    const Communicator& comm = group == ParamGroup::kDense ? mesh_.dp : mesh_.ep_dp;
    requests_.push_back(
        comm.iallreduce_sum(grads.data(group) + begin, static_cast<int64_t>(end - begin)));
    started_[group == ParamGroup::kDense ? 0 : 1].emplace_back(begin, end);
  }
  // MPI makes progress on non-blocking collectives only inside MPI calls: poke it.
  test_all(requests_);
}

ConstTensorView DistributedOptimizer::reduce_gradients(ParamBuffers& grads, Workspace& scratch) {
  ScopedPhase timer(Phase::kCommunication);
  std::span<const float> first, second;  // the gradients this rank takes the squares of
  if (!zero_) {
    // Everything not started during the backward (embeddings, final norm, LM head, or all of it
    // without overlap) is reduced now, in the gaps between the started ranges.
    for (ParamGroup group : {ParamGroup::kDense, ParamGroup::kExpert}) {
      const int g = group == ParamGroup::kDense ? 0 : 1;
      const Communicator& comm = group == ParamGroup::kDense ? mesh_.dp : mesh_.ep_dp;
      std::vector<std::pair<size_t, size_t>>& started = started_[g];
      std::sort(started.begin(), started.end());
      size_t cursor = 0;
      started.emplace_back(layout_.numel(group), layout_.numel(group));
      for (const auto& [begin, end] : started) {
        if (begin > cursor)
          requests_.push_back(comm.iallreduce_sum(grads.data(group) + cursor,
                                                  static_cast<int64_t>(begin - cursor)));
        cursor = std::max(cursor, end);
      }
      started.clear();
    }
    wait_all(requests_);
    first = {grads.dense.data(), grads.dense.size()};
    second = {grads.expert.data(), grads.expert.size()};
  } else {
    for (Shard& s : shards_) {
      // Reduce-scatter wants equal slices: pad the group's gradient to ranks * shard_size.
      Workspace::Scope scope(scratch);
      const std::span<float> padded =
          scope.zeroed<float>(static_cast<int64_t>(s.shard_size) * s.comm->size());
      copy_bytes(padded.data(), grads.data(s.group), s.numel * sizeof(float));
      s.comm->reduce_scatter_sum(padded.data(), s.grad.data(), static_cast<int64_t>(s.shard_size));
    }
    // The constructor makes the dense shard, then the expert one.
    first = {shards_[0].grad.data(), shards_[0].end - shards_[0].begin};
    second = {shards_[1].grad.data(), shards_[1].end - shards_[1].begin};
  }
  timer.switch_to(Phase::kOptimizer);  // the norm of the reduced gradients
  squares_.place_on(grads.dense.device());
  squares_.resize_for_overwrite(2);
  kernels::sum_of_squares(view(first.data(), {static_cast<int64_t>(first.size())}),
                          view(squares_.data(), {1}));
  kernels::sum_of_squares(view(second.data(), {static_cast<int64_t>(second.size())}),
                          view(squares_.data() + 1, {1}));
  // ZeRO-1's slices add up over the group that shares those parameters, the experts of the ep
  // ranks and the layers of the pipeline stages over theirs. With one stage, each of the two sums
  // over its ranks where it is (a step graph captures the collectives on a device communicator;
  // MPI stages them), and the decision adds the two. With several, the stages sum the total: on
  // the host, in the same order, then back where the decision reads it as {total, 0} (the same
  // bits: x + 0 is x).
  const bool zero_slices = zero_ && (shards_[0].comm->size() > 1 || shards_[1].comm->size() > 1);
  if (!zero_slices && mesh_.ep.size() == 1 && mesh_.pp.size() == 1)
    return view(squares_.data(), {2});
  if (mesh_.pp.size() == 1) {
    timer.switch_to(Phase::kCommunication);
    if (zero_) {
      shards_[0].comm->allreduce_sum(squares_.data(), 1);
      shards_[1].comm->allreduce_sum(squares_.data() + 1, 1);
    }
    mesh_.ep.allreduce_sum(squares_.data() + 1, 1);
  } else {
    std::array<double, 2> squares{};
    copy_bytes(squares.data(), squares_.data(), sizeof(squares));
    timer.switch_to(Phase::kCommunication);
    if (zero_) {
      shards_[0].comm->allreduce_sum(&squares[0], 1);
      shards_[1].comm->allreduce_sum(&squares[1], 1);
    }
    mesh_.ep.allreduce_sum(&squares[1], 1);
    double total_sq = squares[0] + squares[1];
    mesh_.pp.allreduce_sum(&total_sq, 1);
    const std::array<double, 2> reduced{total_sq, 0.0};
    copy_bytes(squares_.data(), reduced.data(), sizeof(reduced));
  }
  return view(squares_.data(), {2});
}

void DistributedOptimizer::stage_step(std::span<const double> group_lrs) {
  ++steps_;
  if (replica_)
    replica_->stage_step(group_lrs);
  else
    step_coefficients_.stage(groups_, steps_, group_lrs);
}

void DistributedOptimizer::step(ParamBuffers& params, ParamBuffers& grads,
                                ConstTensorView step_factors, Workspace& scratch) {
  ScopedPhase timer(Phase::kOptimizer);
  // The clipping coefficient is applied inside the update (one pass over the gradients).
  if (!zero_) {
    replica_->apply_step(params, grads, 1.0f, step_factors);
    return;
  }
  for (Shard& s : shards_) {
    timer.switch_to(Phase::kOptimizer);
    adamw_update_range(layout_, groups_, s.group, s.begin, s.end, params.data(s.group),
                       s.grad.data(), s.exp_avg.data(), s.exp_avg_sq.data(), step_coefficients_,
                       1.0f, step_factors);
    // The updated shards travel to every rank: communication in the profile, as the planner
    // counts the all-gather with the reductions.
    timer.switch_to(Phase::kCommunication);
    Workspace::Scope scope(scratch);
    const std::span<float> send = scope.zeroed<float>(static_cast<int64_t>(s.shard_size));
    const std::span<float> gathered =
        scope.uninitialized<float>(static_cast<int64_t>(s.shard_size) * s.comm->size());
    copy_bytes(send.data(), params.data(s.group) + s.begin, (s.end - s.begin) * sizeof(float));
    s.comm->allgather(send.data(), gathered.data(), static_cast<int64_t>(s.shard_size));
    copy_bytes(params.data(s.group), gathered.data(), s.numel * sizeof(float));
  }
}

void DistributedOptimizer::skipped_step() {
  --steps_;
  if (replica_) replica_->set_steps_taken(steps_);
}

void DistributedOptimizer::restore_state(const StateReader& read, int64_t steps_taken) {
  steps_ = steps_taken;
  if (!zero_) {
    for (const ParamSpec& spec : layout_.specs())
      read(spec, 0, spec.numel, replica_->exp_avg().at(spec), replica_->exp_avg_sq().at(spec));
    replica_->set_steps_taken(steps_taken);
    return;
  }
  for (Shard& s : shards_) {
    for (const ParamSpec& spec : layout_.specs()) {
      if (spec.group != s.group) continue;
      const size_t begin = std::max(s.begin, spec.offset);
      const size_t end = std::min(s.end, spec.offset + spec.numel);
      if (begin < end)
        read(spec, begin - spec.offset, end - begin, s.exp_avg.data() + (begin - s.begin),
             s.exp_avg_sq.data() + (begin - s.begin));
    }
  }
}

int64_t DistributedOptimizer::state_floats() const {
  if (!zero_)
    return 2 * static_cast<int64_t>(replica_->exp_avg().dense.size() +
                                    replica_->exp_avg().expert.size());
  int64_t floats = 0;
  for (const Shard& s : shards_) floats += static_cast<int64_t>(2 * (s.end - s.begin));
  return floats;
}

std::vector<const ParamSpec*> DistributedOptimizer::checkpoint_weights() const {
  std::vector<const ParamSpec*> mine;
  for (const ParamSpec& spec : layout_.specs()) {
    const auto [begin, end] = slice(spec.group);
    if (spec.offset >= begin && spec.offset < end) mine.push_back(&spec);
  }
  return mine;
}

std::vector<StatePiece> DistributedOptimizer::checkpoint_state() const {
  std::vector<StatePiece> pieces;
  if (!zero_) {
    for (const ParamSpec* spec : checkpoint_weights())
      pieces.push_back(
          {spec, 0, spec->numel, replica_->exp_avg().at(*spec), replica_->exp_avg_sq().at(*spec)});
    return pieces;
  }
  for (const Shard& s : shards_) {
    for (const ParamSpec& spec : layout_.specs()) {
      if (spec.group != s.group) continue;
      const size_t begin = std::max(s.begin, spec.offset);
      const size_t end = std::min(s.end, spec.offset + spec.numel);
      if (begin >= end) continue;
      pieces.push_back({&spec, begin - spec.offset, end - begin,
                        s.exp_avg.data() + (begin - s.begin),
                        s.exp_avg_sq.data() + (begin - s.begin)});
    }
  }
  return pieces;
}

}  // namespace moecore::dist
