#include "dist/rank_reports.h"

#include <cstdint>
#include <vector>

namespace moecore::dist {

std::string broadcast_text(const Communicator& group, std::string text, int root) {
  if (group.size() == 1) return text;
  int64_t length = static_cast<int64_t>(text.size());
  group.broadcast(&length, sizeof(length), root);
  text.resize(static_cast<size_t>(length));
  if (length > 0) group.broadcast(text.data(), length, root);
  return text;
}

FirstReport first_report(const Communicator& group, const std::string& report) {
  const int64_t reported = report.empty() ? 0 : 1;
  std::vector<int64_t> all(static_cast<size_t>(group.size()));
  group.allgather(&reported, all.data(), 1, CommType::kInt64);
  FirstReport first;
  for (int r = 0; r < group.size(); ++r) {
    if (all[static_cast<size_t>(r)] == 0) continue;
    if (first.rank < 0) first.rank = r;
    ++first.reporting;
  }
  if (first.rank >= 0) first.text = broadcast_text(group, report, first.rank);
  return first;
}

}  // namespace moecore::dist
