#include "io/model_weights.h"

#include "core/check.h"
#include "io/safetensors.h"

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

void load_weights(const ParamLayout& layout, const std::string& path, ParamBuffers& params) {
  SafetensorsReader reader = SafetensorsReader::open(path);
  for (const std::string& name : reader.names())
    MOE_CHECK(layout.find(name) != nullptr,
              "[weights] {}: unexpected tensor '{}' (not a parameter of this model config)", path,
              name);
  for (const ParamSpec& spec : layout.specs())
    reader.read_f32(spec.name, spec.shape, params.at(spec));
}

}  // namespace moecore::io
