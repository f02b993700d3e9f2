#include "cli/distinct_paths.h"

#include <filesystem>
#include <system_error>

#include "core/check.h"

namespace moecore::cli {

namespace fs = std::filesystem;

namespace {

// The same file: one inode where both exist, else the same normalised absolute path.
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  const fs::path x = fs::weakly_canonical(a, ec);
  const fs::path y = fs::weakly_canonical(b, ec);
  return !ec && x == y;
}

}  // namespace

void check_outputs_apart(const std::vector<NamedPath>& inputs,
                         const std::vector<NamedPath>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    for (const NamedPath& in : inputs) {
      if (in.path.empty()) continue;
      std::vector<fs::path> files = {fs::path(in.path)};
      std::error_code ec;
      if (fs::is_directory(in.path, ec))  // its files, as the readers take them
        for (const auto& entry : fs::directory_iterator(in.path, ec)) files.push_back(entry.path());
      for (const fs::path& file : files)
        MOE_CHECK(!same_file(out.path, file),
                  "[cli] {} {} is the input {} {}: writing it would destroy that input; choose "
                  "another {}",
                  out.option, out.path, in.option, file.string(), out.option);
    }
    for (size_t j = i + 1; j < outputs.size(); ++j)
      MOE_CHECK(outputs[j].path.empty() || !same_file(out.path, outputs[j].path),
                "[cli] {} and {} both name {}: one output would replace the other", out.option,
                outputs[j].option, out.path);
  }
}

}  // namespace moecore::cli
