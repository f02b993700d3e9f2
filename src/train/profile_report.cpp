#include "train/profile_report.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "core/phase_timer.h"

namespace moecore {

namespace {

double other_seconds(const phase_timer::Totals& totals, double seconds) {
  double timed = 0.0;
  for (double s : totals) timed += s;
  return seconds - timed;
}

nlohmann::ordered_json host_reads_json(const std::vector<HostRead>& reads) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const HostRead& read : reads)
    out.push_back({{"phase", read.phase}, {"what", read.what}, {"count", read.count}});
  return out;
}

}  // namespace

std::string profile_report_json(int64_t steps, double seconds, const std::vector<HostRead>& reads) {
  const phase_timer::Totals totals = phase_timer::totals();
  nlohmann::ordered_json phases;
  for (size_t i = 0; i < kPhaseCount; ++i)
    phases[std::string(phase_name(static_cast<Phase>(i)))] = totals[i];
  phases["other"] = other_seconds(totals, seconds);
  const nlohmann::ordered_json out = {{"steps", steps},
                                      {"seconds", seconds},
                                      {"phase_clock", phase_timer::clock_name()},
                                      {"phases", phases},
                                      {"host_reads", host_reads_json(reads)}};
  return out.dump(1) + "\n";
}

std::string profile_report_line(int64_t steps, double seconds, const std::vector<HostRead>& reads) {
  const phase_timer::Totals totals = phase_timer::totals();
  // Forward and backward together, by the name before "_forward" / "_backward".
  std::vector<std::pair<std::string, double>> merged;
  for (size_t i = 0; i < kPhaseCount; ++i) {
    std::string_view name = phase_name(static_cast<Phase>(i));
    for (std::string_view suffix : {"_forward", "_backward"})
      if (name.ends_with(suffix)) name.remove_suffix(suffix.size());
    if (merged.empty() || merged.back().first != name) merged.emplace_back(name, 0.0);
    merged.back().second += totals[i];
  }
  merged.emplace_back("other", other_seconds(totals, seconds));
  std::string line = fmt::format("profile: {} steps, {:.0f} ms/step:", steps,
                                 steps > 0 ? 1e3 * seconds / static_cast<double>(steps) : 0.0);
  for (size_t i = 0; i < merged.size(); ++i)
    line += fmt::format("{} {} {:.1f}%", i == 0 ? "" : ",", merged[i].first,
                        seconds > 0.0 ? 100.0 * merged[i].second / seconds : 0.0);
  int64_t read_count = 0;
  for (const HostRead& read : reads) read_count += read.count;
  if (read_count > 0 && steps > 0)
    line += fmt::format("; {:.1f} host reads/step",
                        static_cast<double>(read_count) / static_cast<double>(steps));
  return line;
}

}  // namespace moecore
