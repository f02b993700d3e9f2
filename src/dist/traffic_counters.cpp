#include "dist/traffic_counters.h"

namespace moecore::dist {

namespace {

std::map<std::string, TrafficCount>& counters() {
  static std::map<std::string, TrafficCount> table;
  return table;
}

}  // namespace

const std::map<std::string, TrafficCount>& traffic_counters() {
  return counters();
}

void reset_traffic_counters() {
  counters().clear();
}

void count_traffic(const std::string& group, const std::string& op, int64_t bytes) {
  TrafficCount& c = counters()[group + "." + op];
  c.bytes += bytes;
  ++c.calls;
}

}  // namespace moecore::dist
