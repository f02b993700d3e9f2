// A device for the CPU tests on which the host's touches of device memory crash: it stands in for
// Device::kCuda in a test binary without a GPU. Its memory is host pages mapped without access
// (mmap PROT_NONE, each allocation its own pages); its kernel table runs the CPU backend's
// operations after opening the pages of the views each is handed, and closes them after; its
// copies and zeroing open what they touch the same way. Code that reaches a device's memory only
// through kernels/ops.h and core/device_memory.h runs on it with the CPU backend's results, bit for
// bit; any other access by the host (a std::fill, a loop, reading a count back without a copy) is
// a SIGSEGV at that line. That is what a GPU would need of the code (there, the access would read
// garbage or fault), shown without one.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/phase_timer.h"

namespace moecore::guarded_device {

// The sizes of the copies from host memory into the guarded device's, in order, since the last
// call (what a pass would have to place in device memory before a CUDA graph's capture, which
// cannot hold such a copy).
std::vector<size_t> take_host_to_device_copies();

// The work a capture recorded (Capture::end), in order.
class Graph {
 public:
  // Runs the recorded work again, with the arguments it was recorded with: the scalars and
  // options the host handed each operation by value, and the same device pointers. What a step
  // computes anew on the host and passes by value is what a replay gets wrong.
  void replay() const;
  size_t operations() const { return operations_.size(); }

 private:
  friend class Capture;
  std::vector<std::function<void()>> operations_;
};

// A CUDA graph's stream capture, emulated (cudaStreamBeginCapture in global mode): while it is
// open, the kernel table's operations and the device's zeroing and copies within its memory are
// recorded instead of run (a stream being captured runs nothing), and a copy between host and
// device memory or an allocation of device memory is an error (moecore::Error), as on the CUDA
// backend, which refuses such a copy in a capture and whose allocator would break it. A free of
// device memory inside the capture makes end() fail. One at a time, inside a Scope.
class Capture {
 public:
  Capture();
  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  // Ends the capture and returns what it recorded.
  Graph end();

 private:
  Graph graph_;
  bool open_ = true;
};

// For a stand-in of a transport whose operations are issued on the device's stream (NCCL's):
// whether a capture is open, and `operation` recorded into it, to run at each replay in order with
// the kernels (an error without an open capture).
bool capture_open();
void record_in_capture(std::function<void()> operation);

// What each phase scope takes on the guarded device's clock of train.profile's phases
// (core/phase_timer.h's DevicePhaseClock, which Scope registers as a GPU's activate() does): a
// profile timed by it holds whole multiples of this, exactly (a power of two).
inline constexpr double kPhaseMarkSeconds = 1.0 / 1024.0;

// Registers the guarded memory, kernel table and phase clock for Device::kCuda, and makes it the
// default device (core/device_memory.h), for the scope's lifetime (device allocations must be
// freed before it ends). One at a time.
class Scope {
 public:
  Scope();
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Device previous_default_;
  DevicePhaseClock* previous_clock_ = nullptr;
};

}  // namespace moecore::guarded_device
