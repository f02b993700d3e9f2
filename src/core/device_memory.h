// Memory on a device, for code that owns tensors without knowing the backend that computes on
// them. A backend registers its DeviceMemory when the process selects its device
// (kernels/cuda/device_selection.h). Every allocation made here is recorded by address, so that
// the device of any pointer is known (unified addressing, as CUDA's pointer attributes report it):
// views made from plain pointers (core/tensor_view.h's view()) carry the device of the memory they
// point into, and the operations of kernels/ops.h run them on that device's backend. Host memory
// that no allocation here covers is the CPU's; a process that never allocates on a device pays one
// atomic load per view for this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device.h"

namespace moecore {

// Which way a copy through a device's memory goes (copy_bytes knows it from the pointers).
enum class CopyKind { kHostToDevice, kDeviceToHost, kWithinDevice };

// One device's memory, as its backend provides it.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  // `bytes` > 0 of this device's memory, aligned for any element type; throws moecore::Error
  // naming the device and the size when there is not enough.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* data, size_t bytes) noexcept = 0;
  // Copies `bytes` from src to dst, each in host memory or in this device's memory as `kind`
  // says, after the device's operations issued before the call and before any issued after it.
  // With host memory on either side it returns once the bytes are there; a copy within the
  // device's memory may return before (only the device's operations can see it, and they come
  // after it).
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind) = 0;
  // Zeroes `bytes` of this device's memory, in order with the device's operations.
  virtual void zero(void* data, size_t bytes) = 0;
};

// Makes `memory` serve its device's allocations (nullptr for `device`: none does; allocations
// still live must be freed before). Device::kCpu's is built in.
void register_device_memory(Device device, DeviceMemory* memory);

// Where new DeviceArrays and workspaces allocate when their owner does not say: Device::kCpu until
// a program puts its model on a device (as torch.set_default_device does). The model's activations
// and scratch follow it; host-side metadata stays in std::vector whatever it is.
Device default_device();
void set_default_device(Device device);

// Makes `device` the default for the scope's lifetime (a training run's), then restores the one
// before.
class DefaultDeviceScope {
 public:
  explicit DefaultDeviceScope(Device device) : previous_(default_device()) {
    set_default_device(device);
  }
  ~DefaultDeviceScope() { set_default_device(previous_); }
  DefaultDeviceScope(const DefaultDeviceScope&) = delete;
  DefaultDeviceScope& operator=(const DefaultDeviceScope&) = delete;

 private:
  Device previous_;
};

// Whether `device` has memory to allocate (always for Device::kCpu; for a device, once its
// backend registered it).
bool has_device_memory(Device device);

// `bytes` on `device` (host memory for Device::kCpu), recorded by address; free with free_on.
// Throws moecore::Error when no memory is registered for the device.
void* allocate_on(Device device, size_t bytes);
void free_on(Device device, void* data, size_t bytes) noexcept;

// The device whose recorded allocation holds `address`; Device::kCpu for any other address.
Device device_of(const void* address);

// Copies or zeroes bytes wherever they are (each pointer's device by device_of), through the
// device's memory when one of them is on a device, so that host code never touches device
// memory itself.
void copy_bytes(void* dst, const void* src, size_t bytes);
void zero_bytes(void* data, size_t bytes);

// Host reads of device memory. Each is a wait: on a GPU the host stops until the work issued
// before it has finished, and a training step captured into a CUDA graph can hold none (issue 15
// item 3). copy_bytes notes every copy from a device to the host; a backend operation that reads
// a device's values back itself (the CUDA grouped GEMMs' offsets) notes that. While a HostReadLog
// lives, each is counted by the phase it fell in (core/phase_timer.h) and what it read, so that a
// test or a profile shows where steps wait; without one, a note costs one atomic load.
struct HostRead {
  std::string phase;  // phase_name(), or "none" outside any phase
  std::string what;   // "copy of N bytes" or the operation
  int64_t count = 0;  // how many such reads
};
void note_host_read(std::string_view what);

// Within its scope, this thread's copies to the host are noted as "copy of N bytes for <reason>":
// a communicator staging a device's buffer for MPI says so, and a profile tells its reads from
// the model's own. reason: a string literal.
class HostReadReason {
 public:
  explicit HostReadReason(const char* reason);
  ~HostReadReason();
  HostReadReason(const HostReadReason&) = delete;
  HostReadReason& operator=(const HostReadReason&) = delete;

 private:
  const char* previous_;
};

// Counts the host reads of its lifetime (one log at a time; notes may come from any thread). A
// long profiled run keeps one entry per distinct (phase, what), not one per read.
class HostReadLog {
 public:
  HostReadLog();
  ~HostReadLog();
  HostReadLog(const HostReadLog&) = delete;
  HostReadLog& operator=(const HostReadLog&) = delete;
  // The distinct reads in the order they first happened, with their counts.
  std::vector<HostRead> reads() const;
};

// An owning array of trivially copyable T on one device, like a std::vector the host cannot index:
// its elements are reached through views (core/tensor_view.h) by kernels, and by the host only
// through copy_bytes. Contents survive resize as std::vector's do (the first min(old, new)
// elements kept, new ones zero); capacity is kept when it shrinks.
template <typename T>
class DeviceArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  DeviceArray() : device_(default_device()) {}
  explicit DeviceArray(Device device) : device_(device) {}
  DeviceArray(Device device, size_t count) : device_(device) { resize(count); }
  // A moved-from array is empty, on its device still.
  DeviceArray(DeviceArray&& other) noexcept : device_(other.device_) { swap(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    DeviceArray(std::move(other)).swap(*this);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_ != nullptr) free_on(device_, data_, capacity_ * sizeof(T));
  }

  Device device() const { return device_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The elements as a span, for interfaces that take pointer and length (only kernels and
  // copy_bytes may touch device elements through it).
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }

  size_t capacity() const { return capacity_; }
  // Room for `count` elements without reallocating (contents kept).
  void reserve(size_t count) {
    if (count > capacity_) reallocate(count);
  }
  void resize(size_t count) {
    reserve(count);
    if (count > size_) zero_bytes(data_ + size_, (count - size_) * sizeof(T));
    size_ = count;
  }
  // As resize, but the new elements are left as they are, for a caller that writes them all
  // before reading (std::make_unique_for_overwrite's rule): no zeroing pass.
  void resize_for_overwrite(size_t count) {
    reserve(count);
    size_ = count;
  }
  // Empties the array and moves it to `device`, unless it is there already: scratch that follows
  // the device of its operands.
  void place_on(Device device) {
    if (device != device_) DeviceArray(device).swap(*this);
  }

  // A copy of the elements on the same device.
  DeviceArray clone() const {
    DeviceArray copy(device_);
    copy.resize_for_overwrite(size_);
    copy_bytes(copy.data_, data_, size_ * sizeof(T));
    return copy;
  }
  // Every element zero.
  void zero() {
    if (size_ > 0) zero_bytes(data_, size_ * sizeof(T));
  }
  void swap(DeviceArray& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
  }

 private:
  void reallocate(size_t count) {
    T* grown = static_cast<T*>(allocate_on(device_, count * sizeof(T)));
    if (size_ > 0) copy_bytes(grown, data_, size_ * sizeof(T));
    if (data_ != nullptr) free_on(device_, data_, capacity_ * sizeof(T));
    data_ = grown;
    capacity_ = count;
  }

  Device device_ = Device::kCpu;
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// The elements of `array` in a host vector, and a host vector's elements into a new array on
// `device`, through copy_bytes.
template <typename T>
std::vector<T> host_copy(const DeviceArray<T>& array) {
  std::vector<T> host(array.size());
  copy_bytes(host.data(), array.data(), host.size() * sizeof(T));
  return host;
}
// The elements of `array` for host code to read: in place when it is in host memory, else copied
// into `copy` (so that host-memory runs copy nothing).
template <typename T>
std::span<const T> host_readable(const DeviceArray<T>& array, std::vector<T>& copy) {
  if (array.device() == Device::kCpu) return array.span();
  copy = host_copy(array);
  return copy;
}
template <typename T>
DeviceArray<T> device_copy(const std::vector<T>& host, Device device = default_device()) {
  DeviceArray<T> array(device);
  array.resize_for_overwrite(host.size());
  copy_bytes(array.data(), host.data(), host.size() * sizeof(T));
  return array;
}

}  // namespace moecore
