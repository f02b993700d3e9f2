#include "dist/expert_layout.h"

#include "core/check.h"

namespace moecore::dist {

void take_local(const ParamLayout& full, const ParamBuffers& full_buf, const ParamLayout& local,
                ParamBuffers& local_buf) {
  for (const ParamSpec& spec : local.specs()) {
    const ParamSpec* source = full.find(spec.name);
    MOE_CHECK(source != nullptr, "[parallel] tensor '{}' missing from the whole model", spec.name);
    copy_bytes(local_buf.at(spec), full_buf.at(*source), spec.numel * sizeof(float));
  }
}

}  // namespace moecore::dist
