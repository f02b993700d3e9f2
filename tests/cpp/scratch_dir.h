// A test's own directory: made fresh under GoogleTest's temporary directory, removed with
// everything in it when the test's fixture goes. Tests that write files hold one, so that
// parallel ctest runs and reruns never see each other's files.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace moecore {

class ScratchDir {
 public:
  // `prefix` names the directory (prefix_XXXXXX), so that a leftover tells whose it was.
  explicit ScratchDir(const std::string& prefix) {
    std::string templ =
        (std::filesystem::path(::testing::TempDir()) / (prefix + "_XXXXXX")).string();
    // Thrown from a fixture's constructor, GoogleTest reports it as the test's failure.
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ignored;  // a destructor must not throw; a leftover is only disk space
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace moecore
