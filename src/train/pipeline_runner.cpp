#include "train/pipeline_runner.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/check.h"

namespace moecore {

namespace {

// How many actions ahead the receives are posted.
constexpr size_t kLookahead = 2;

void add_scaled(LossParts& sum, const LossParts& part, double scale) {
  sum.ce += part.ce * scale;
  sum.lb += part.lb * scale;
  sum.z += part.z * scale;
  sum.lm_z += part.lm_z * scale;
  sum.total += part.total * scale;
  sum.counted_tokens += part.counted_tokens;
}

}  // namespace

struct PipelineRunner::Pending {
  DeviceArray<float> buffer;  // on the model's device, as the chunks' inputs and outputs
  dist::Request request;
};

PipelineRunner::PipelineRunner(const dist::Mesh& mesh, std::vector<Transformer*> chunks,
                               PipelineSchedule schedule, int64_t microbatches)
    : mesh_(mesh),
      chunks_(std::move(chunks)),
      schedule_(schedule),
      pp_(mesh.stages()),
      stage_(mesh.stage()),
      v_(static_cast<int64_t>(chunks_.size())),
      microbatches_(microbatches) {
  set_microbatches(microbatches);
}

void PipelineRunner::set_microbatches(int64_t microbatches) {
  microbatches_ = microbatches;
  actions_ = dist::pipeline_schedule(schedule_, pp_, stage_, v_, microbatches_);
  const int64_t m = microbatches_;
  if (schedule_ == PipelineSchedule::kGPipe)
    live_bound_ = m;
  else if (schedule_ == PipelineSchedule::kOneFOneB)
    live_bound_ = std::min(pp_ - stage_, m);
  else
    live_bound_ = std::min((pp_ - stage_ - 1) * 2 + (v_ - 1) * pp_ + 1, m * v_);
  MOE_CHECK(tag(pp_ * v_ - 1, m - 1, true) <= mesh_.pp.max_tag(),
            "[parallel] {} micro-batches x {} model chunks exceed the MPI tag space ({})", m,
            pp_ * v_, mesh_.pp.max_tag());
}

int PipelineRunner::tag(int64_t global, int64_t micro, bool gradient) const {
  return static_cast<int>((micro * pp_ * v_ + global) * 2 + (gradient ? 1 : 0));
}

void PipelineRunner::train_step(const ParamBuffers& params, ParamBuffers& grads,
                                const std::vector<MicroBatch>& micro, int64_t rows, int64_t seq,
                                float loss_scale, const PassHook& hook) {
  MOE_CHECK(static_cast<int64_t>(micro.size()) == microbatches_,
            "[parallel] {} micro-batches given to a pipeline schedule of {}", micro.size(),
            microbatches_);
  const int64_t width = rows * seq * chunks_.front()->config().hidden_size;
  // What action i receives: the hidden state of the previous chunk (forward) or the gradient of
  // this chunk's output (backward), as (tag, source).
  auto incoming = [&](const dist::PipelineAction& a) -> std::pair<int, int> {
    const int64_t g = global_chunk(a.chunk);
    if (a.forward)
      return first_chunk(a.chunk) ? std::pair{-1, -1}
                                  : std::pair{tag(g, a.micro, false), stage_of(g - 1)};
    return last_chunk(a.chunk) ? std::pair{-1, -1}
                               : std::pair{tag(g, a.micro, true), stage_of(g + 1)};
  };
  std::map<int, Pending> receives;
  std::vector<std::unique_ptr<Pending>> sends;
  // Message buffers come from, and go back to, the buffers of earlier messages and steps: every
  // one is written in full (by the receive or by the chunk pass) before it is read.
  auto take_buffer = [&](DeviceArray<float>& buffer) {
    if (!spare_buffers_.empty()) {
      buffer = std::move(spare_buffers_.back());
      spare_buffers_.pop_back();
    }
    buffer.resize_for_overwrite(static_cast<size_t>(width));
  };
  auto give_back = [&](DeviceArray<float>& buffer) {
    if (buffer.capacity() > 0) spare_buffers_.push_back(std::move(buffer));
  };
  size_t posted = 0;
  auto post_until = [&](size_t end) {
    for (; posted < std::min(end, actions_.size()); ++posted) {
      const auto [t, source] = incoming(actions_[posted]);
      if (t < 0) continue;
      Pending& r = receives[t];
      take_buffer(r.buffer);
      r.request = mesh_.pp.irecv(r.buffer.data(), width, source, t);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  idle_seconds_ = 0.0;
  auto wait = [&](dist::Request& request) {
    const auto before = std::chrono::steady_clock::now();
    dist::wait(request);
    idle_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  };
  auto reap_sends = [&] {
    std::erase_if(sends, [&](std::unique_ptr<Pending>& s) {
      if (!dist::test(s->request)) return false;
      give_back(s->buffer);
      return true;
    });
  };

  // Activation slots per chunk: taken at the forward, given back at the backward.
  std::vector<std::vector<int64_t>> free_slots(static_cast<size_t>(v_));
  std::vector<std::vector<int64_t>> slot_of(static_cast<size_t>(v_),
                                            std::vector<int64_t>(micro.size(), -1));
  std::vector<int64_t> made(static_cast<size_t>(v_), 0);
  int64_t live = 0;
  peak_live_ = 0;
  forwards_.clear();
  loss_scale_ = loss_scale;
  for (size_t i = 0; i < actions_.size(); ++i) {
    post_until(i + 1 + kLookahead);
    const dist::PipelineAction& a = actions_[i];
    const size_t c = static_cast<size_t>(a.chunk), m = static_cast<size_t>(a.micro);
    Transformer& chunk = *chunks_[c];
    const int64_t g = global_chunk(a.chunk);
    if (hook) hook(chunk, a.forward, a.micro, false);
    const int in_tag = incoming(a).first;
    const float* in = nullptr;
    if (in_tag >= 0) {
      Pending& r = receives.at(in_tag);
      wait(r.request);
      in = r.buffer.data();
    }
    auto out = std::make_unique<Pending>();
    const bool sends_out = a.forward ? !last_chunk(a.chunk) : !first_chunk(a.chunk);
    if (sends_out) take_buffer(out->buffer);
    if (a.forward) {
      int64_t slot;
      if (free_slots[c].empty()) {
        slot = made[c]++;  // a new activation slot of this chunk
      } else {
        slot = free_slots[c].back();
        free_slots[c].pop_back();
      }
      slot_of[c][m] = slot;
      peak_live_ = std::max(peak_live_, ++live);
      // Every chunk counts the targets (loss_normalizer "labels"), the last one's loss reads them.
      chunk.forward_chunk(slot, params, micro[m].tokens, in, micro[m].targets, rows, seq,
                          sends_out ? out->buffer.data() : nullptr);
      forwards_.push_back(c);
      if (sends_out)
        out->request =
            mesh_.pp.isend(out->buffer.data(), width, stage_of(g + 1), tag(g + 1, a.micro, false));
    } else {
      const int64_t slot = slot_of[c][m];
      MOE_CHECK(slot >= 0,
                "[parallel] pipeline schedule runs the backward of micro-batch {} before "
                "its forward",
                a.micro);
      chunk.backward_chunk(slot, params, grads, loss_scale, in,
                           sends_out ? out->buffer.data() : nullptr);
      if (sends_out)
        out->request =
            mesh_.pp.isend(out->buffer.data(), width, stage_of(g - 1), tag(g - 1, a.micro, true));
      free_slots[c].push_back(slot);
      slot_of[c][m] = -1;
      --live;
    }
    if (hook) hook(chunk, a.forward, a.micro, true);
    if (in_tag >= 0) {
      give_back(receives.at(in_tag).buffer);
      receives.erase(in_tag);
    }
    if (sends_out) sends.push_back(std::move(out));
    reap_sends();
  }
  for (auto& s : sends) {
    wait(s->request);
    give_back(s->buffer);
  }
  step_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MOE_CHECK(live == 0 && receives.empty(),
            "[parallel] pipeline step ended with {} activations and "
            "{} receives outstanding",
            live, receives.size());
  MOE_CHECK(peak_live_ <= live_bound_,
            "[parallel] pipeline stage {} kept {} micro-batch activations alive; its schedule "
            "allows {}",
            stage_, peak_live_, live_bound_);
}

LossParts PipelineRunner::read_losses() {
  std::vector<std::vector<LossParts>> parts(chunks_.size());
  for (size_t c = 0; c < chunks_.size(); ++c) parts[c] = chunks_[c]->read_losses();
  std::vector<size_t> next(chunks_.size(), 0);
  LossParts sum;
  for (const size_t c : forwards_) {
    MOE_CHECK(next[c] < parts[c].size(),
              "[parallel] model chunk {} recorded {} losses for more forward passes", c,
              parts[c].size());
    add_scaled(sum, parts[c][next[c]++], loss_scale_);
  }
  return sum;
}

LossParts PipelineRunner::forward_only(const ParamBuffers& params, const int32_t* tokens,
                                       const int32_t* targets, int64_t rows, int64_t seq) {
  const int64_t width = rows * seq * chunks_.front()->config().hidden_size;
  DeviceArray<float> in, out;  // written in full (by the receive, by the chunk) before read
  in.resize_for_overwrite(static_cast<size_t>(width));
  out.resize_for_overwrite(static_cast<size_t>(width));
  LossParts sum;
  for (int64_t c = 0; c < v_; ++c) {
    const int64_t g = global_chunk(c);
    Transformer& chunk = *chunks_[static_cast<size_t>(c)];
    if (!first_chunk(c)) {
      dist::Request r = mesh_.pp.irecv(in.data(), width, stage_of(g - 1), tag(g, 0, false));
      dist::wait(r);
    }
    // A pass for the logits alone (targets == nullptr: the downstream evaluation): the chunk with
    // the head computes no loss; one before it still counts targets (loss_normalizer "labels"
    // divides its router losses by them) and records losses nobody reads: the token ids, as many,
    // stand in for them there.
    const int32_t* counted = targets != nullptr || chunk.has_head() ? targets : tokens;
    chunk.forward_chunk(0, params, tokens, in.data(), counted, rows, seq, out.data());
    if (targets != nullptr || !chunk.has_head()) add_scaled(sum, chunk.read_losses().back(), 1.0);
    if (!last_chunk(c)) {
      dist::Request s = mesh_.pp.isend(out.data(), width, stage_of(g + 1), tag(g + 1, 0, false));
      dist::wait(s);
    }
  }
  return sum;
}

}  // namespace moecore
