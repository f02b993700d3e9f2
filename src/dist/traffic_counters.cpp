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

std::map<std::string, TrafficCount> traffic_since(
    const std::map<std::string, TrafficCount>& before) {
  std::map<std::string, TrafficCount> gained;
  for (const auto& [key, now] : counters()) {
    const auto earlier = before.find(key);
    const TrafficCount was = earlier == before.end() ? TrafficCount{} : earlier->second;
    if (now.calls != was.calls) gained[key] = {now.bytes - was.bytes, now.calls - was.calls};
  }
  return gained;
}

void add_traffic(const std::map<std::string, TrafficCount>& counts) {
  for (const auto& [key, count] : counts) {
    TrafficCount& c = counters()[key];
    c.bytes += count.bytes;
    c.calls += count.calls;
  }
}

}  // namespace moecore::dist
