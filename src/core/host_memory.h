// The host memory this process may use: a size beyond it is refused with one line before it is
// allocated, instead of the kernel's OOM killer ending the process without a message.
#pragma once

#include <cstdint>
#include <string_view>

namespace moecore {

// The machine's physical memory; 0 when unknown.
double host_physical_memory_bytes();

// The lowest memory limit of the cgroups this process is in: the one /proc/self/cgroup names and
// each of its ancestors up to the hierarchy's mount, whose limits bind too (a batch job's limit
// sits on the job's cgroup, the process in a step's or task's below it). `proc_self_cgroup` and
// `proc_self_mountinfo` hold those two files' text; the mounts say where each hierarchy is
// (cgroup v2's memory.max, v1's memory.limit_in_bytes; both on a hybrid machine) and which cgroup
// a mount shows (a container's own). A cgroup whose directory is not visible is passed over for
// its visible ancestors; "max" and v1's near-2^63 mean no limit. 0 when no cgroup sets one.
double cgroup_memory_limit_bytes(std::string_view proc_self_cgroup,
                                 std::string_view proc_self_mountinfo);

// The machine's physical memory, or its cgroups' limit where that is lower (a container, a batch
// job's allocation); 0 when neither is known.
double host_memory_limit_bytes();

// This process's peak resident memory in KiB: /proc/self/status's VmHWM, the high-water mark of
// this program's own address space. Not getrusage's ru_maxrss: Linux carries the high-water mark
// of the process that forked it across execve (a trainer started from a Python process holding
// 2.6 GiB reported 2.6 GiB, whatever it used itself). `proc_self_status` holds that file's text;
// -1 when it has no VmHWM line.
int64_t peak_resident_kib(std::string_view proc_self_status);
// This process's, from /proc/self/status; getrusage's ru_maxrss where that has no VmHWM (not
// Linux).
int64_t peak_resident_kib();

}  // namespace moecore
