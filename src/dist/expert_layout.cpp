#include "dist/expert_layout.h"

#include <algorithm>
#include <vector>

#include "core/check.h"

namespace moecore::dist {

namespace {

// Copies every tensor of `from_layout` that `to_layout` also has.
void copy_by_name(const ParamLayout& from_layout, const float* from_dense, const float* from_expert,
                  const ParamLayout& to_layout, ParamBuffers& to) {
  for (const ParamSpec& spec : from_layout.specs()) {
    const ParamSpec* target = to_layout.find(spec.name);
    MOE_CHECK(target != nullptr && target->numel == spec.numel,
              "[parallel] tensor '{}' has no place in the target layout", spec.name);
    const float* src = (spec.group == ParamGroup::kDense ? from_dense : from_expert) + spec.offset;
    std::copy_n(src, spec.numel, to.at(*target));
  }
}

}  // namespace

void gather_full(const ModelConfig& config, const ParamBuffers& local_buf, const ParamLayout& full,
                 ParamBuffers& full_buf, const Communicator& ep) {
  const int64_t count = static_cast<int64_t>(local_buf.expert.size());
  std::vector<float> all(static_cast<size_t>(count * ep.size()));
  ep.allgather(local_buf.expert.data(), all.data(), count);
  for (int r = 0; r < ep.size(); ++r) {
    const ParamLayout part = ParamLayout::build(config, ep.size(), r);
    copy_by_name(part, local_buf.dense.data(), all.data() + r * count, full, full_buf);
  }
}

void take_local(const ParamLayout& full, const ParamBuffers& full_buf, const ParamLayout& local,
                ParamBuffers& local_buf) {
  for (const ParamSpec& spec : local.specs()) {
    const ParamSpec* source = full.find(spec.name);
    MOE_CHECK(source != nullptr, "[parallel] tensor '{}' missing from the whole model", spec.name);
    std::copy_n(full_buf.at(*source), spec.numel, local_buf.at(spec));
  }
}

}  // namespace moecore::dist
