#include "core/host_memory.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>

namespace moecore {

double host_physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

double host_memory_limit_bytes() {
  double limit = host_physical_memory_bytes();
  // cgroup v2, then v1 ("max", or v1's near-2^63 for none, leave the machine's).
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])))
      continue;
    const double cgroup = std::strtod(text.c_str(), nullptr);
    if (cgroup > 0.0 && (limit <= 0.0 || cgroup < limit)) limit = cgroup;
  }
  return limit;
}

}  // namespace moecore
