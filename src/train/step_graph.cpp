#include "train/step_graph.h"

#include "core/check.h"
#include "dist/traffic_counters.h"
#include "model/document_mask.h"

namespace moecore {

namespace {

DeviceGraphs& graphs_of(Device device) {
  DeviceGraphs* graphs = device_graphs(device);
  MOE_CHECK(graphs != nullptr, "[train] train.cuda_graph=true: {} memory has no graphs to capture",
            device_name(device));
  return *graphs;
}

}  // namespace

StepGraph::StepGraph(Device device, int64_t microbatches, int64_t rows, int64_t seq,
                     int32_t document_eos, int32_t document_bos)
    : graphs_(graphs_of(device)),
      rows_(rows),
      seq_(seq),
      document_eos_(document_eos),
      document_bos_(document_bos),
      divisors_(device, static_cast<size_t>(microbatches)),
      host_counted_(static_cast<size_t>(microbatches), 0) {
  const auto tokens = static_cast<size_t>(rows * seq);
  for (int64_t m = 0; m < microbatches; ++m) {
    token_ids_.emplace_back(device, tokens);
    targets_.emplace_back(device, tokens);
    if (document_eos >= 0) document_starts_.emplace_back(device, tokens);
  }
  if (document_eos >= 0) host_starts_.resize(tokens);
}

void StepGraph::stage(int64_t micro, const int32_t* tokens, const int32_t* targets, int64_t counted,
                      double divisor) {
  const auto m = static_cast<size_t>(micro);
  const auto bytes = static_cast<size_t>(rows_ * seq_) * sizeof(int32_t);
  copy_bytes(token_ids_[m].data(), tokens, bytes);
  copy_bytes(targets_[m].data(), targets, bytes);
  if (document_eos_ >= 0) {
    moecore::document_starts(tokens, rows_, seq_, document_eos_, document_bos_,
                             host_starts_.data());
    copy_bytes(document_starts_[m].data(), host_starts_.data(), bytes);
  }
  copy_bytes(divisors_.data() + micro, &divisor, sizeof(divisor));
  host_counted_[m] = counted;
}

const int32_t* StepGraph::tokens(int64_t micro) const {
  return token_ids_[static_cast<size_t>(micro)].data();
}

const int32_t* StepGraph::targets(int64_t micro) const {
  return targets_[static_cast<size_t>(micro)].data();
}

const int32_t* StepGraph::document_starts(int64_t micro) const {
  return document_eos_ >= 0 ? document_starts_[static_cast<size_t>(micro)].data() : nullptr;
}

ConstTensorView StepGraph::divisor(int64_t micro) const {
  return view(divisors_.data() + micro, {1});
}

StepGraph::Marks StepGraph::marks(const std::vector<Transformer*>& chunks) {
  Marks m{.frees = device_frees()};
  for (const Transformer* chunk : chunks) m.passes += chunk->forward_passes();
  return m;
}

void StepGraph::run(const std::function<void()>& issue, const std::vector<Transformer*>& chunks) {
  const bool undisturbed = ready_ && *ready_ == marks(chunks);
  if (graph_ && undisturbed) {
    graph_->replay();
    dist::add_traffic(graph_traffic_);  // the collectives replayed, counted as if issued
    ++replays_;
    // The host's record of the passes that the replay ran again, for their losses.
    for (Transformer* chunk : chunks) chunk->note_replayed_passes(host_counted_);
    return;
  }
  graph_.reset();
  if (!undisturbed) {
    // Places every buffer for the shapes of training, and warms what a capture cannot allocate.
    issue();
    ++eager_steps_;
    ready_ = marks(chunks);
    return;
  }
  const std::map<std::string, dist::TrafficCount> before = dist::traffic_counters();
  graphs_.begin_capture();
  try {
    issue();
  } catch (...) {
    graphs_.abandon_capture();
    ready_.reset();
    throw;
  }
  graph_ = graphs_.end_capture();
  graph_traffic_ = dist::traffic_since(before);
  ++captures_;
  ready_ = marks(chunks);
  graph_->replay();
}

}  // namespace moecore
