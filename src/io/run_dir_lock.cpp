#include "io/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "core/check.h"
#include "core/escape.h"

namespace moecore::io {

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// The holder's "pid N host H" line. The holder writes it just after taking the lock, so a
// contender that lost the race by microseconds may find the file still empty: it retries briefly.
std::string read_holder(int fd) {
  std::string text;
  for (int attempt = 0; attempt < 50; ++attempt) {
    char buffer[256] = {};
    const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
    text.assign(buffer, n > 0 ? static_cast<size_t>(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (!text.empty()) return escape_for_message(text);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "holder unknown";
}

}  // namespace

RunDirLock RunDirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/" + lock_file_name();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MOE_CHECK(fd >= 0, "[train] cannot open the run lock '{}': {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? read_holder(fd) : std::string();
    ::close(fd);
    MOE_CHECK(err != EWOULDBLOCK,
              "[train] {} is in use by another run ({}, lock file {}): two runs in one "
              "train.out_dir would overwrite each other's checkpoints; wait for it to end or "
              "choose another train.out_dir",
              dir, holder, path);
    fail("[train] cannot lock '{}': {}", path, std::strerror(err));
  }
  RunDirLock lock;
  lock.fd_ = fd;
  lock.dir_ = dir;
  const std::string holder = "pid " + std::to_string(::getpid()) + " on host " + host_name() + "\n";
  // Best effort: the text only feeds a contender's message; the lock itself is the flock.
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd, holder.data(), holder.size(), 0);
  }
  return lock;
}

void RunDirLock::check_in_place() const {
  if (fd_ < 0) return;
  const std::string path = dir_ + "/" + lock_file_name();
  struct stat held {
  }, named{};
  const bool held_known = ::fstat(fd_, &held) == 0;
  const bool named_exists = ::stat(path.c_str(), &named) == 0;
  // A deleted lock file has no links left; a replaced one is another inode at the same name.
  const bool in_place = held_known && held.st_nlink > 0 && named_exists &&
                        held.st_dev == named.st_dev && held.st_ino == named.st_ino;
  MOE_CHECK(in_place,
            "[train] train.out_dir '{}' was deleted or replaced while this run was writing it "
            "(its lock file {} is {}): stopping, since what the run writes next would be lost or "
            "mixed with another run's files",
            dir_, path, named_exists ? "another file now" : "gone");
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept : fd_(other.fd_), dir_(std::move(other.dir_)) {
  other.fd_ = -1;
}

// Empties the holder line, then closes: the lock file of a finished run is the same empty file
// whichever process held it last, so a run directory stays byte-identical across runs that fail.
void RunDirLock::release() noexcept {
  if (fd_ < 0) return;
  [[maybe_unused]] const int rc = ::ftruncate(fd_, 0);
  ::close(fd_);  // closing the last descriptor releases the flock
  fd_ = -1;
}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    dir_ = std::move(other.dir_);
    other.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  release();
}

}  // namespace moecore::io
