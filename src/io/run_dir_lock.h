// An exclusive lock on a run directory, held for the whole run by the process that writes it
// (rank 0). Two trainers on one train.out_dir would delete each other's staging directories and
// interleave their steps in one history; the second one is refused instead, with one line naming
// the holder. The lock is flock(2) on `<dir>/.moecore.lock`, so the kernel releases it when the
// holder dies, however it dies (SIGKILL included): a stale lock file never blocks a new run. The
// file holds "pid <pid> on host <hostname>" of the current holder, for the refusal message only,
// and is empty when nobody holds it.
#pragma once

#include <string>

namespace moecore::io {

class RunDirLock {
 public:
  // Takes the lock on `dir` (which must exist) without waiting; throws a one-line moecore::Error
  // naming the holder when another process holds it.
  static RunDirLock acquire(const std::string& dir);

  RunDirLock() = default;
  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  // Releases the lock; the lock file stays (removing it would race a new holder), emptied.
  ~RunDirLock();

  bool held() const { return fd_ >= 0; }
  // Throws a one-line moecore::Error when the held lock file is no longer `<dir>/.moecore.lock`:
  // the run directory was deleted (or moved, or replaced) under the run. Its later writes would
  // go to files nobody can read, or mix with another run that took a new lock there.
  void check_in_place() const;
  static std::string lock_file_name() { return ".moecore.lock"; }

 private:
  void release() noexcept;
  int fd_ = -1;
  std::string dir_;
};

}  // namespace moecore::io
