#include "io/model_weights.h"

#include <span>
#include <vector>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/finite.h"
#include "io/safetensors.h"
#include "io/tensor_parts.h"

namespace moecore::io {

void save_weights(const ParamLayout& layout, const ParamBuffers& params, const std::string& path,
                  const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
  for (const ParamSpec& spec : layout.specs())
    writer.add_f32(spec.name, spec.shape, params.at(spec));
  writer.write(path);
}

namespace {

// Strict: every parameter present with its shape, and nothing else in the file(s).
template <typename Tensors>
void load_strict(const ParamLayout& layout, const Tensors& tensors, const std::string& origin,
                 ParamBuffers& params) {
  for (const std::string& name : tensors.names())
    MOE_CHECK(layout.find(name) != nullptr,
              "[weights] {}: unexpected tensor '{}' (not a parameter of this model config)", origin,
              name);
  for (const ParamSpec& spec : layout.specs())
    tensors.read_f32(spec.name, spec.shape, params.at(spec));
}

}  // namespace

void load_weights(const ParamLayout& layout, const std::string& path, ParamBuffers& params) {
  load_strict(layout, SafetensorsReader::open(path), path, params);
}

void require_finite_weights(const ParamLayout& layout, const ParamBuffers& params,
                            const std::function<std::string(const std::string&)>& origin_of,
                            const char* tag) {
  // A device's weights are read through one host copy of each group.
  std::vector<float> dense_copy, expert_copy;
  const std::span<const float> dense = host_readable(params.dense, dense_copy);
  const std::span<const float> expert = host_readable(params.expert, expert_copy);
  for (const ParamSpec& spec : layout.specs()) {
    const float* values = (spec.group == ParamGroup::kDense ? dense : expert).data() + spec.offset;
    const float* bad = first_non_finite(values, values + spec.numel);
    MOE_CHECK(bad == values + spec.numel, "{} {}: tensor '{}' holds {} at element {}", tag,
              origin_of(spec.name), spec.name, *bad, bad - values);
  }
}

void load_weights_from_dir(const ParamLayout& layout, const std::string& dir,
                           ParamBuffers& params) {
  const TensorParts parts = TensorParts::open(dir, "model", "[checkpoint]");
  load_strict(layout, parts, parts.origin(), params);
}

}  // namespace moecore::io
