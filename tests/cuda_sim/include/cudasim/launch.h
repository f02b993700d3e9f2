// cudasim: a kernel launch. rewrite_launches.cpp turns
//     name<args><<<grid, block, shared, stream>>>(arguments...)
// into
//     ::cudasim::Launch("name<args>", grid, block, shared, stream)(name<args>)(arguments...)
// which converts the arguments to the kernel's parameter types (as the CUDA compiler does), copies
// them (a launch's arguments are taken by value when it is issued) and issues the launch on the
// stream: run at once, or recorded while the stream is captured.
#pragma once

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace cudasim {

struct LaunchShape {
  const char* kernel_name;
  const void* kernel;  // the function, for its attributes (cudaFuncSetAttribute)
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
};

// Checks the shape against the device's limits and every pointer argument against the device's
// memory, then issues `body` (one CUDA thread's run of the kernel) for every thread of every block
// (sim_executor.cpp). A launch that fails a check sets the runtime's last error, as a real one
// does, and runs nothing.
void issue_launch(const LaunchShape& shape, std::vector<const void*> pointer_arguments,
                  std::function<void()> body);

// An argument as the kernel's parameter receives it: implicit conversions only, as nvcc allows
// (no void* to T*, no integer to an enum class).
template <typename Parameter, typename Argument>
Parameter passed(Argument&& argument) {
  return std::forward<Argument>(argument);
}

template <typename T>
void collect_pointer(std::vector<const void*>& pointers, const T& argument) {
  if constexpr (std::is_pointer_v<T>)
    pointers.push_back(const_cast<const void*>(static_cast<const volatile void*>(argument)));
}

template <typename... Parameters>
class BoundLaunch {
 public:
  BoundLaunch(LaunchShape shape, void (*kernel)(Parameters...)) : shape_(shape), kernel_(kernel) {
    shape_.kernel = reinterpret_cast<const void*>(kernel);
  }
  template <typename... Arguments>
  void operator()(Arguments&&... arguments) const {
    static_assert(sizeof...(Arguments) == sizeof...(Parameters),
                  "a kernel launch with the wrong number of arguments");
    std::tuple<std::decay_t<Parameters>...> values(
        passed<Parameters>(std::forward<Arguments>(arguments))...);
    std::vector<const void*> pointers;
    std::apply([&](const auto&... v) { (collect_pointer(pointers, v), ...); }, values);
    issue_launch(shape_, std::move(pointers),
                 [kernel = kernel_, values]() { std::apply(kernel, values); });
  }

 private:
  LaunchShape shape_;
  void (*kernel_)(Parameters...);
};

class Launch {
 public:
  Launch(const char* kernel_name, dim3 grid, dim3 block, size_t shared_bytes = 0,
         cudaStream_t stream = nullptr)
      : shape_{kernel_name, nullptr, grid, block, shared_bytes, stream} {}
  template <typename... Parameters>
  BoundLaunch<Parameters...> operator()(void (*kernel)(Parameters...)) const {
    return BoundLaunch<Parameters...>(shape_, kernel);
  }

 private:
  LaunchShape shape_;
};

}  // namespace cudasim
