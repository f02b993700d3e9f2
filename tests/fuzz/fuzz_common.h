// The libFuzzer side of the targets (tests/fuzz/README.md): scratch files for the readers that
// only open paths, and the verdict on one input (see fuzz_readers.h).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "fuzz_readers.h"

namespace moecore::fuzz {

// The path readers that only open files (safetensors, .npy: they memory-map) are given. One file
// per process, rewritten for each input; /dev/shm keeps a million rewrites off the disk.
inline const std::string& scratch_path(const char* suffix) {
  static const std::string path = [suffix] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/moecore-fuzz-" + std::to_string(getpid()) + suffix;
  }();
  return path;
}

inline const std::string& write_scratch(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = scratch_path(suffix);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();  // the harness, not the reader, is broken: stop rather than report nonsense
  }
  return path;
}

// Runs one input through a reader: a clean rejection is a pass; a broken invariant aborts, which
// libFuzzer records as a crash with the input that caused it.
template <typename Read>
int run_one(Read&& read) {
  try {
    read();
  } catch (const Finding& finding) {
    std::fprintf(stderr, "moecore fuzz finding: %s\n", finding.what.c_str());
    std::abort();
  } catch (const std::exception&) {
    // A clean rejection.
  }
  return 0;
}

}  // namespace moecore::fuzz
