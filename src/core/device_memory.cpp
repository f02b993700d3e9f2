#include "core/device_memory.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>

#include "core/check.h"
#include "core/device_graph.h"
#include "core/phase_timer.h"

namespace moecore {

namespace {

// Host allocations start on a cache line, as the workspace's do (any SIMD load suits them).
constexpr std::align_val_t kHostAlignment{64};

std::array<std::atomic<DeviceMemory*>, kDeviceCount>& registered_memory() {
  static std::array<std::atomic<DeviceMemory*>, kDeviceCount> memory{};
  return memory;
}

// The live device allocations by first address: [begin, end) and their device.
struct Allocation {
  uintptr_t end;
  Device device;
};
struct AllocationTable {
  std::shared_mutex mutex;
  std::map<uintptr_t, Allocation> by_begin;
  std::atomic<int64_t> live{0};  // by_begin.size(), read without the lock
};
AllocationTable& allocations() {
  static AllocationTable table;
  return table;
}

DeviceMemory& memory_of(Device device) {
  DeviceMemory* memory = registered_memory()[static_cast<size_t>(device)].load();
  MOE_CHECK(memory != nullptr,
            "[device] no {} memory: this build has no {} backend, or the process did not select "
            "that device",
            device_name(device), device_name(device));
  return *memory;
}

std::atomic<Device>& default_device_setting() {
  static std::atomic<Device> device{Device::kCpu};
  return device;
}

}  // namespace

Device default_device() {
  return default_device_setting().load(std::memory_order_relaxed);
}

void set_default_device(Device device) {
  default_device_setting().store(device, std::memory_order_relaxed);
}

void register_device_memory(Device device, DeviceMemory* memory) {
  MOE_CHECK(device != Device::kCpu, "[device] host memory is built in; register a device's");
  MOE_CHECK(memory == nullptr || memory->device() == device,
            "[device] the memory of {} registered for {}", device_name(memory->device()),
            device_name(device));
  registered_memory()[static_cast<size_t>(device)].store(memory);
}

bool has_device_memory(Device device) {
  return device == Device::kCpu ||
         registered_memory()[static_cast<size_t>(device)].load() != nullptr;
}

void* allocate_on(Device device, size_t bytes) {
  if (device == Device::kCpu) return ::operator new(bytes, kHostAlignment);
  void* data = memory_of(device).allocate(bytes);
  AllocationTable& table = allocations();
  const std::unique_lock lock(table.mutex);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  table.by_begin[begin] = {begin + bytes, device};
  table.live.store(static_cast<int64_t>(table.by_begin.size()));
  return data;
}

namespace {
std::atomic<uint64_t> frees_on_devices{0};
}  // namespace

uint64_t device_frees() {
  return frees_on_devices.load();
}

void free_on(Device device, void* data, size_t bytes) noexcept {
  if (data == nullptr) return;
  if (device == Device::kCpu) {
    ::operator delete(data, kHostAlignment);
    return;
  }
  frees_on_devices.fetch_add(1);
  {
    AllocationTable& table = allocations();
    const std::unique_lock lock(table.mutex);
    table.by_begin.erase(reinterpret_cast<uintptr_t>(data));
    table.live.store(static_cast<int64_t>(table.by_begin.size()));
  }
  DeviceMemory* memory = registered_memory()[static_cast<size_t>(device)].load();
  if (memory != nullptr) memory->deallocate(data, bytes);
}

Device device_of(const void* address) {
  AllocationTable& table = allocations();
  if (table.live.load(std::memory_order_relaxed) == 0) return Device::kCpu;
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  const std::shared_lock lock(table.mutex);
  auto next = table.by_begin.upper_bound(a);
  if (next == table.by_begin.begin()) return Device::kCpu;
  const auto& [begin, allocation] = *std::prev(next);
  return a < allocation.end ? allocation.device : Device::kCpu;
}

namespace {

// The live HostReadLog's records; `logging` is what a note without a log loads.
std::atomic<bool> logging{false};
std::mutex log_mutex;
std::vector<HostRead> log_records;
thread_local const char* read_reason = nullptr;  // HostReadReason's

}  // namespace

HostReadReason::HostReadReason(const char* reason) : previous_(read_reason) {
  read_reason = reason;
}

HostReadReason::~HostReadReason() {
  read_reason = previous_;
}

void note_host_read(std::string_view what) {
  if (!logging.load(std::memory_order_acquire)) return;
  const Phase phase = current_phase();
  const std::string_view phase_text = phase == Phase::kCount ? "none" : phase_name(phase);
  const std::lock_guard lock(log_mutex);
  const auto same = std::find_if(log_records.begin(), log_records.end(), [&](const HostRead& r) {
    return r.phase == phase_text && r.what == what;
  });
  if (same != log_records.end())
    ++same->count;
  else
    log_records.push_back({std::string(phase_text), std::string(what), 1});
}

HostReadLog::HostReadLog() {
  const std::lock_guard lock(log_mutex);
  MOE_CHECK(!logging.load(), "[device] one HostReadLog at a time");
  log_records.clear();
  logging.store(true, std::memory_order_release);
}

HostReadLog::~HostReadLog() {
  logging.store(false, std::memory_order_release);
}

std::vector<HostRead> HostReadLog::reads() const {
  const std::lock_guard lock(log_mutex);
  return log_records;
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const Device to = device_of(dst), from = device_of(src);
  if (to == Device::kCpu && from == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  MOE_CHECK(to == Device::kCpu || from == Device::kCpu || to == from,
            "[device] a copy from {} memory to {} memory: copies go through the host",
            device_name(from), device_name(to));
  if (to == Device::kCpu && logging.load(std::memory_order_acquire))
    note_host_read(read_reason == nullptr
                       ? fmt::format("copy of {} bytes", bytes)
                       : fmt::format("copy of {} bytes for {}", bytes, read_reason));
  const CopyKind kind = to == Device::kCpu     ? CopyKind::kDeviceToHost
                        : from == Device::kCpu ? CopyKind::kHostToDevice
                                               : CopyKind::kWithinDevice;
  memory_of(to != Device::kCpu ? to : from).copy(dst, src, bytes, kind);
}

namespace {

// Host buffers from this size on are zeroed by all threads: one core's memset does not reach the
// memory bandwidth (measured on a 2-vCPU AMX Xeon, warm buffers: 4 MiB 144 -> 91 us, 38 MiB 1344
// -> 744 us with two threads; at 1 MiB the threads' start-up costs more than it saves).
constexpr size_t kParallelZeroBytes = size_t{4} << 20;

void zero_host(void* data, size_t bytes) {
  if (bytes < kParallelZeroBytes || omp_in_parallel() != 0) {
    std::memset(data, 0, bytes);
    return;
  }
#pragma omp parallel
  {
    const size_t threads = static_cast<size_t>(omp_get_num_threads());
    const size_t thread = static_cast<size_t>(omp_get_thread_num());
    const size_t share = (bytes + threads - 1) / threads;
    const size_t begin = std::min(bytes, thread * share);
    std::memset(static_cast<std::byte*>(data) + begin, 0, std::min(bytes, begin + share) - begin);
  }
}

}  // namespace

void zero_bytes(void* data, size_t bytes) {
  if (bytes == 0) return;
  const Device device = device_of(data);
  if (device == Device::kCpu) {
    zero_host(data, bytes);
    return;
  }
  memory_of(device).zero(data, bytes);
}

}  // namespace moecore
