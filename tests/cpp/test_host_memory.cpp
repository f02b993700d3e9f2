// The host memory limit that generate's KV cache and the benchmarks' buffers are held against:
// the machine's, or the lowest limit of the cgroups the process is in, read where
// /proc/self/mountinfo says each hierarchy is. The hierarchies here are directories a test lays
// out as the kernel shows them (the files' names and formats are the kernel's).
// And the process's peak resident memory, from /proc/self/status.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/host_memory.h"
#include "scratch_dir.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// cgroup v1's "no limit".
constexpr const char* kV1Unlimited = "9223372036854771712";

class CgroupMemoryLimit : public ::testing::Test {
 protected:
  // Writes `value` into `file` under the test's root, making its directories.
  void write(const std::string& file, const std::string& value) const {
    const fs::path path = root_ / file;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << value << "\n";
  }
  // A mountinfo line for a cgroup2 or cgroup (v1, `options` its controllers) mount at `dir`
  // under the test's root, showing cgroup `shown`.
  std::string mount(const std::string& dir, const std::string& shown, const std::string& type,
                    const std::string& options = "rw") const {
    return "41 31 0:38 " + shown + " " + (root_ / dir).string() + " rw,relatime shared:9 - " +
           type + " " + type + " " + options + "\n";
  }
  ScratchDir scratch_{"moecore_cgroup"};
  const fs::path root_ = scratch_.path();
};

TEST_F(CgroupMemoryLimit, AJobsLimitBindsTheStepAndTaskCgroupsBelowItV2) {
  // Slurm's cgroup v2 layout: the limit on the job, the process in a task's cgroup below it.
  const std::string job = "v2/system.slice/slurmstepd.scope/job_5";
  write("v2/system.slice/memory.max", "max");
  write(job + "/memory.max", "2147483648");
  write(job + "/step_0/memory.max", "max");
  write(job + "/step_0/user/task_0/memory.max", "max");
  const std::string mountinfo = mount("v2", "/", "cgroup2");
  EXPECT_EQ(cgroup_memory_limit_bytes(
                "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n", mountinfo),
            2 * kGiB);
  // A lower limit further up binds instead.
  write("v2/system.slice/memory.max", "1073741824");
  EXPECT_EQ(cgroup_memory_limit_bytes(
                "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n", mountinfo),
            kGiB);
}

TEST_F(CgroupMemoryLimit, AJobsLimitBindsTheStepAndTaskCgroupsBelowItV1) {
  const std::string job = "memory/slurm/uid_0/job_7";
  write("memory/memory.limit_in_bytes", kV1Unlimited);
  write(job + "/memory.limit_in_bytes", "3221225472");
  write(job + "/step_0/task_0/memory.limit_in_bytes", kV1Unlimited);
  const std::string cgroup =
      "5:devices:/slurm/uid_0/job_7/step_0\n4:memory:/slurm/uid_0/job_7/step_0/task_0\n";
  EXPECT_EQ(cgroup_memory_limit_bytes(cgroup, mount("cpu", "/", "cgroup", "rw,cpu") +
                                                  mount("memory", "/", "cgroup", "rw,memory")),
            3 * kGiB);
  // The memory controller mounted together with others ("cpu,memory") is read the same way.
  EXPECT_EQ(cgroup_memory_limit_bytes("4:cpu,memory:/slurm/uid_0/job_7/step_0/task_0\n",
                                      mount("memory", "/", "cgroup", "rw,cpu,memory")),
            3 * kGiB);
  // The v1 memory line is read only at a v1 memory mount: a cpu mount's directory is not it.
  EXPECT_EQ(cgroup_memory_limit_bytes(cgroup, mount("memory", "/", "cgroup", "rw,cpu")), 0.0);
}

TEST_F(CgroupMemoryLimit, AContainersMountShowsItsOwnCgroup) {
  // Without a cgroup namespace /proc/self/cgroup names the host's path, while the mount's root
  // field says the mount shows that cgroup itself: its files are the mount's own.
  write("c/memory.max", "1073741824");
  write("c/sub/memory.max", "max");
  const std::string mountinfo = mount("c", "/docker/abc", "cgroup2");
  EXPECT_EQ(cgroup_memory_limit_bytes("0::/docker/abc\n", mountinfo), kGiB);
  EXPECT_EQ(cgroup_memory_limit_bytes("0::/docker/abc/sub\n", mountinfo), kGiB);
  // A cgroup outside what the mount shows: only the mount's own limit is visible; a cgroup
  // namespace names one as a path that climbs out, which is never followed.
  EXPECT_EQ(cgroup_memory_limit_bytes("0::/other\n", mountinfo), kGiB);
  write("outside/memory.max", "1024");
  EXPECT_EQ(cgroup_memory_limit_bytes("0::/../outside\n", mount("c", "/", "cgroup2")), kGiB);
}

TEST_F(CgroupMemoryLimit, AnInvisibleCgroupDirectoryLeavesItsVisibleAncestors) {
  write("memory/memory.limit_in_bytes", "536870912");
  EXPECT_EQ(cgroup_memory_limit_bytes("4:memory:/process_api/2e4a\n",
                                      mount("memory", "/", "cgroup", "rw,memory")),
            0.5 * kGiB);
}

TEST_F(CgroupMemoryLimit, AHybridMachineReadsBothHierarchies) {
  write("memory/memory.limit_in_bytes", kV1Unlimited);
  write("memory/job/memory.limit_in_bytes", "4294967296");
  write("unified/job/memory.max", "6442450944");
  const std::string cgroup = "4:memory:/job\n1:name=systemd:/job\n0::/job\n";
  const std::string mountinfo = mount("memory", "/", "cgroup", "rw,memory") +
                                mount("systemd", "/", "cgroup", "rw,name=systemd") +
                                mount("unified", "/", "cgroup2");
  EXPECT_EQ(cgroup_memory_limit_bytes(cgroup, mountinfo), 4 * kGiB);
  write("unified/job/memory.max", "2147483648");
  EXPECT_EQ(cgroup_memory_limit_bytes(cgroup, mountinfo), 2 * kGiB);
}

TEST_F(CgroupMemoryLimit, NoLimitAnywhereIsZero) {
  write("v2/a/memory.max", "max");
  write("memory/memory.limit_in_bytes", kV1Unlimited);
  write("memory/a/memory.limit_in_bytes", kV1Unlimited);
  const std::string mountinfo =
      mount("v2", "/", "cgroup2") + mount("memory", "/", "cgroup", "rw,memory");
  EXPECT_EQ(cgroup_memory_limit_bytes("4:memory:/a\n0::/a\n", mountinfo), 0.0);
  // Nothing mounted, or nothing to read.
  EXPECT_EQ(cgroup_memory_limit_bytes("4:memory:/a\n0::/a\n", ""), 0.0);
  EXPECT_EQ(cgroup_memory_limit_bytes("", mountinfo), 0.0);
  EXPECT_EQ(cgroup_memory_limit_bytes("garbage\n0:\n", "garbage - \n"), 0.0);
}

TEST_F(CgroupMemoryLimit, AMountPointWithASpaceIsUnescaped) {
  write("with space/memory.max", "1073741824");
  const std::string escaped = (root_ / "with\\040space").string();
  const std::string mountinfo =
      "41 31 0:38 / " + escaped + " rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup_memory_limit_bytes("0::/\n", mountinfo), kGiB);
}

TEST(HostMemory, TheLimitIsPositiveAndNoMoreThanTheMachinesMemory) {
  const double physical = host_physical_memory_bytes();
  ASSERT_GT(physical, 0.0);
  const double limit = host_memory_limit_bytes();
  EXPECT_GT(limit, 0.0);
  EXPECT_LE(limit, physical);
}

// /proc/self/status as the kernel writes it (a tab, the value right-aligned, "kB").
TEST(HostMemory, PeakResidentIsVmHwm) {
  const std::string status =
      "Name:\tmoecore\nVmPeak:\t 2903144 kB\nVmSize:\t 2903140 kB\nVmHWM:\t  433416 kB\n"
      "VmRSS:\t  433412 kB\n";
  EXPECT_EQ(peak_resident_kib(status), 433416);
  EXPECT_EQ(peak_resident_kib("VmHWM:\t       0 kB"), 0);  // the last line, no newline
  EXPECT_EQ(peak_resident_kib("Name:\tmoecore\nVmRSS:\t 12 kB\n"), -1);
  EXPECT_EQ(peak_resident_kib("VmHWM:\tnone\n"), -1);
  EXPECT_EQ(peak_resident_kib(""), -1);
}

TEST(HostMemory, ThisProcessHasAPeakResident) {
  const int64_t kib = peak_resident_kib();
  EXPECT_GT(kib, 0);
  EXPECT_LE(static_cast<double>(kib) * 1024.0, host_physical_memory_bytes());
}

}  // namespace
}  // namespace moecore
