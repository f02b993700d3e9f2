// The run-directory lock (issue 13): one writer per train.out_dir, refused with the holder named,
// released when the holder goes away.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/check.h"
#include "io/run_dir_lock.h"
#include "scratch_dir.h"

namespace moecore::io {
namespace {

namespace fs = std::filesystem;

class RunDirLockTest : public ::testing::Test {
 protected:
  ScratchDir scratch_{"moecore_lock"};
  const std::string dir_ = scratch_.path().string();
};

TEST_F(RunDirLockTest, SecondHolderIsRefusedWithTheHolderNamed) {
  const RunDirLock first = RunDirLock::acquire(dir_);
  EXPECT_TRUE(first.held());
  // flock(2) locks belong to open file descriptions: a second open in this process contends
  // exactly as another process would.
  try {
    RunDirLock::acquire(dir_);
    FAIL() << "the second lock was granted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("is in use by another run"), std::string::npos) << message;
    EXPECT_NE(message.find("pid " + std::to_string(::getpid())), std::string::npos) << message;
    EXPECT_NE(message.find(" on host "), std::string::npos) << message;
    EXPECT_NE(message.find(dir_), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST_F(RunDirLockTest, ReleasedWhenTheHolderGoesAway) {
  { const RunDirLock first = RunDirLock::acquire(dir_); }
  RunDirLock again = RunDirLock::acquire(dir_);  // the stale lock file does not block
  EXPECT_TRUE(again.held());
  const RunDirLock moved = std::move(again);  // the lock moves with the object
  EXPECT_TRUE(moved.held());
  EXPECT_THROW(RunDirLock::acquire(dir_), Error);
}

TEST_F(RunDirLockTest, ReleasedWhenTheHolderProcessDies) {
  // A child takes the lock and is killed by the kernel at exit without any clean-up of ours.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      static RunDirLock held = RunDirLock::acquire(dir_);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);  // no destructors: the kernel alone releases the flock
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(RunDirLock::acquire(dir_).held());
}

// The run directory deleted or replaced under a run: the holder notices before its next write.
TEST_F(RunDirLockTest, CheckInPlaceFailsOnceTheLockFileIsGoneOrReplaced) {
  const RunDirLock lock = RunDirLock::acquire(dir_);
  lock.check_in_place();  // in place: no error
  const std::string path = dir_ + "/" + RunDirLock::lock_file_name();
  fs::remove(path);
  try {
    lock.check_in_place();
    FAIL() << "a deleted lock file passed";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("was deleted or replaced"), std::string::npos) << message;
    EXPECT_NE(message.find("is gone"), std::string::npos) << message;
  }
  // Another run's lock at the same name (after an `rm -rf` and a new start there).
  const RunDirLock other = RunDirLock::acquire(dir_);
  other.check_in_place();
  try {
    lock.check_in_place();
    FAIL() << "a replaced lock file passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another file now"), std::string::npos) << e.what();
  }
}

TEST_F(RunDirLockTest, MissingDirectoryIsAOneLineError) {
  EXPECT_THROW(RunDirLock::acquire(dir_ + "/absent"), Error);
}

}  // namespace
}  // namespace moecore::io
