#include "train/step_graph.h"

#include "core/check.h"

namespace moecore {

namespace {

DeviceGraphs& graphs_of(Device device) {
  DeviceGraphs* graphs = device_graphs(device);
  MOE_CHECK(graphs != nullptr, "[train] train.cuda_graph=true: {} memory has no graphs to capture",
            device_name(device));
  return *graphs;
}

}  // namespace

StepGraph::StepGraph(Device device, int64_t microbatches, int64_t tokens)
    : graphs_(graphs_of(device)),
      tokens_(tokens),
      counted_(device, static_cast<size_t>(microbatches)),
      host_counted_(static_cast<size_t>(microbatches), 0) {
  for (int64_t m = 0; m < microbatches; ++m) {
    token_ids_.emplace_back(device, static_cast<size_t>(tokens));
    targets_.emplace_back(device, static_cast<size_t>(tokens));
  }
}

void StepGraph::stage(int64_t micro, const int32_t* tokens, const int32_t* targets,
                      int64_t counted) {
  const auto m = static_cast<size_t>(micro);
  const auto bytes = static_cast<size_t>(tokens_) * sizeof(int32_t);
  copy_bytes(token_ids_[m].data(), tokens, bytes);
  copy_bytes(targets_[m].data(), targets, bytes);
  const auto value = static_cast<double>(counted);
  copy_bytes(counted_.data() + micro, &value, sizeof(value));
  host_counted_[m] = counted;
}

const int32_t* StepGraph::tokens(int64_t micro) const {
  return token_ids_[static_cast<size_t>(micro)].data();
}

const int32_t* StepGraph::targets(int64_t micro) const {
  return targets_[static_cast<size_t>(micro)].data();
}

ConstTensorView StepGraph::counted(int64_t micro) const {
  return view(counted_.data() + micro, {1});
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
  graphs_.begin_capture();
  try {
    issue();
  } catch (...) {
    graphs_.abandon_capture();
    ready_.reset();
    throw;
  }
  graph_ = graphs_.end_capture();
  ++captures_;
  ready_ = marks(chunks);
  graph_->replay();
}

}  // namespace moecore
