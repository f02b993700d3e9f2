#include "core/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace moecore {
namespace {

namespace fs = std::filesystem;

// A /proc file's text ("" where it cannot be read).
std::string read_proc_file(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The limit in one cgroup's file, 0 where there is none: no file, "max", v1's near-2^63.
double limit_in_file(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])))
    return 0.0;
  const double limit = std::strtod(text.c_str(), nullptr);
  // cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit count.
  return limit >= 0x1p62 ? 0.0 : limit;
}

void keep_lowest(double& lowest, double limit) {
  if (limit > 0.0 && (lowest == 0.0 || limit < lowest)) lowest = limit;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

// mountinfo writes a space, tab, newline or backslash in a path as \ and three octal digits.
std::string mountinfo_unescape(const std::string& field) {
  std::string path;
  for (size_t i = 0; i < field.size(); ++i) {
    const bool escape = field[i] == '\\' && i + 3 < field.size() &&
                        field.find_first_not_of("01234567", i + 1) >= i + 4;
    if (escape) {
      path += static_cast<char>(std::stoi(field.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      path += field[i];
    }
  }
  return path;
}

// One cgroup hierarchy's mount: the directory, and the cgroup it shows (its root field).
struct CgroupMount {
  fs::path directory;
  std::string shown_cgroup;
};

// The lowest limit in `file_name` of `cgroup` (a path like /a/b in the hierarchy) and its
// ancestors, as far as `mount` shows them.
double lowest_limit_upwards(const CgroupMount& mount, const std::string& cgroup,
                            const char* file_name) {
  // The part of the cgroup's path below the mount's root: all of it when the mount shows the
  // hierarchy's root, the rest when it shows one of the path's ancestors (a container's own
  // cgroup), none when the cgroup is outside what it shows ("/../x" in a cgroup namespace
  // among them): then the mount's own limit is the nearest visible one.
  const fs::path path = fs::path(cgroup).relative_path();
  const fs::path shown = fs::path(mount.shown_cgroup).relative_path();
  const auto [shown_end, path_rest] =
      std::mismatch(shown.begin(), shown.end(), path.begin(), path.end());
  fs::path below;
  if (shown_end == shown.end())
    for (auto part = path_rest; part != path.end(); ++part) below /= *part;
  if (std::find(below.begin(), below.end(), "..") != below.end()) below.clear();
  double lowest = 0.0;
  while (true) {
    keep_lowest(lowest, limit_in_file(mount.directory / below / file_name));
    if (below.empty()) return lowest;
    below = below.parent_path();
  }
}

}  // namespace

double host_physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

double cgroup_memory_limit_bytes(std::string_view proc_self_cgroup,
                                 std::string_view proc_self_mountinfo) {
  // mountinfo's lines: ID PARENT MAJOR:MINOR ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE
  // SUPER_OPTIONS. cgroup v2's type is cgroup2; v1's memory hierarchy is type cgroup with
  // "memory" among its super options.
  std::vector<CgroupMount> v2_mounts, v1_memory_mounts;
  for (const std::string& line : split(std::string(proc_self_mountinfo), '\n')) {
    const std::vector<std::string> fields = split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const CgroupMount mount{mountinfo_unescape(fields[4]), mountinfo_unescape(fields[3])};
    const std::string& type = dash[1];
    if (type == "cgroup2") v2_mounts.push_back(mount);
    if (type == "cgroup")
      for (const std::string& option : split(dash[3], ','))
        if (option == "memory") v1_memory_mounts.push_back(mount);
  }
  // /proc/self/cgroup's lines: ID:CONTROLLERS:PATH; v2's is 0::PATH, v1's memory line lists
  // "memory" among its controllers.
  double lowest = 0.0;
  for (const std::string& line : split(std::string(proc_self_cgroup), '\n')) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      for (const CgroupMount& mount : v2_mounts)
        keep_lowest(lowest, lowest_limit_upwards(mount, path, "memory.max"));
      continue;
    }
    for (const std::string& name : split(controllers, ','))
      if (name == "memory")
        for (const CgroupMount& mount : v1_memory_mounts)
          keep_lowest(lowest, lowest_limit_upwards(mount, path, "memory.limit_in_bytes"));
  }
  return lowest;
}

double host_memory_limit_bytes() {
  double limit = host_physical_memory_bytes();
  keep_lowest(limit, cgroup_memory_limit_bytes(read_proc_file("/proc/self/cgroup"),
                                               read_proc_file("/proc/self/mountinfo")));
  return limit;
}

int64_t peak_resident_kib(std::string_view proc_self_status) {
  // A line "VmHWM:\t  123456 kB".
  constexpr std::string_view kKey = "VmHWM:";
  for (size_t begin = 0; begin < proc_self_status.size();) {
    size_t end = proc_self_status.find('\n', begin);
    if (end == std::string_view::npos) end = proc_self_status.size();
    const std::string_view line = proc_self_status.substr(begin, end - begin);
    if (line.substr(0, kKey.size()) == kKey) {
      const std::string value(line.substr(kKey.size()));
      char* rest = nullptr;
      const long long kib = std::strtoll(value.c_str(), &rest, 10);
      if (rest != value.c_str() && kib >= 0) return kib;
      return -1;
    }
    begin = end + 1;
  }
  return -1;
}

int64_t peak_resident_kib() {
  const int64_t kib = peak_resident_kib(read_proc_file("/proc/self/status"));
  if (kib >= 0) return kib;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // KiB on Linux, bytes on macOS: Linux has VmHWM
  return static_cast<int64_t>(usage.ru_maxrss);
}

}  // namespace moecore
