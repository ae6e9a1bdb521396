// The CUDA runtime as tessera uses it: errors as tessera::error naming the call, the
// devices and their properties, and the one stream on which every kernel, copy and
// collective of tessera runs (stream order is what makes the caching allocator's reuse
// and the collectives' buffers safe). Plain C++ over the CUDA runtime API: a host
// compiler can build it; kernels live in kernels/cuda/ (.cuh, nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <string>
#include <tessera/core/error.hpp>

namespace tessera::cuda {

/// "cudaMalloc(&p, bytes) failed: out of memory (cudaErrorMemoryAllocation, 2)"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail(cudaError_t rc, const char* call) {
  throw error(std::string(call) + " failed: " + cudaGetErrorString(rc) + " (" + cudaGetErrorName(rc) + ", " +
              std::to_string(int(rc)) + ")");
}

/// Turns a CUDA error code into a tessera::error naming the call.
inline void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) [[unlikely]]
    fail(rc, call);
}

/// Checks a CUDA runtime call, naming it in the error: TESSERA_CUDA_CHECK(cudaFree(p)).
#define TESSERA_CUDA_CHECK(call) ::tessera::cuda::check((call), #call)

/// Number of CUDA devices this process sees; 0 when there is no driver or no device
/// (never an error: programs and tests use it to decide whether to run on a GPU).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

/// Whether a CUDA device is present.
inline bool available() noexcept { return device_count() > 0; }

/// The current device of this thread.
inline int current_device() {
  int d = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

/// Selects device `d` for this thread; call it before any tensor is made. Throws when
/// `d` is out of range: "cuda::set_device: device 3 is out of range: 1 device(s)".
inline void set_device(int d) {
  const int n = device_count();
  if (d < 0 || d >= n)
    throw error("cuda::set_device: device " + std::to_string(d) + " is out of range: " + std::to_string(n) +
                " device(s)");
  TESSERA_CUDA_CHECK(cudaSetDevice(d));
}

/// Selects the GPU of a process that is `local_rank` on its node: local_rank modulo the
/// device count (ranks share GPUs when there are fewer GPUs than ranks). Throws when
/// there is no device: "cuda::select_device: no CUDA device".
inline int select_device(int local_rank) {
  const int n = device_count();
  if (n == 0) throw error("cuda::select_device: no CUDA device");
  const int d = (local_rank % n + n) % n;
  set_device(d);
  return d;
}

/// What benchmarks and reports need to know of a device.
struct device_info {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;         ///< compute capability
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
  double memory_bandwidth_gbs = 0;  ///< nominal peak: 2 x memory clock x bus width
};

inline device_info info(int d) {
  cudaDeviceProp p{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  int clock_khz = 0, bus_bits = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, d));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, d));
  device_info i;
  i.index = d;
  i.name = p.name;
  i.major = p.major;
  i.minor = p.minor;
  i.multiprocessors = p.multiProcessorCount;
  i.memory_bytes = p.totalGlobalMem;
  i.memory_bandwidth_gbs = 2.0 * double(clock_khz) * 1e3 * double(bus_bits / 8) / 1e9;
  return i;
}
inline device_info info() { return info(current_device()); }

/// A CUDA stream, owned: move-only RAII.
class stream_handle {
 public:
  /// A new non-blocking stream on the current device (it does not synchronise with the
  /// legacy default stream).
  stream_handle() { TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  stream_handle(const stream_handle&) = delete;
  stream_handle& operator=(const stream_handle&) = delete;
  stream_handle(stream_handle&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  stream_handle& operator=(stream_handle&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = o.s_;
      o.s_ = nullptr;
    }
    return *this;
  }
  ~stream_handle() { reset(); }

  cudaStream_t get() const noexcept { return s_; }
  void synchronize() const { TESSERA_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  void reset() noexcept {
    if (s_) cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// tessera's stream on the current device: every kernel, copy and collective of the
/// library is ordered on it. Created on first use (one per device), kept for the life
/// of the process.
inline cudaStream_t stream() {
  constexpr int max_devices = 64;
  static stream_handle* streams[max_devices] = {};
  const int d = current_device();
  if (d >= max_devices) throw error("cuda::stream: device index " + std::to_string(d) + " exceeds 64");
  if (!streams[d]) streams[d] = new stream_handle();  // never destroyed: outlives every tensor
  return streams[d]->get();
}

/// Waits until everything tessera queued on the current device has finished.
inline void synchronize() { TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream())); }

/// Raises any error of a kernel launched just before (bad configuration), naming the
/// kernel: "add: kernel launch failed: invalid configuration argument (...)".
inline void check_launch(const char* kernel) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) [[unlikely]]
    fail(rc, (std::string(kernel) + ": kernel launch").c_str());
}

}  // namespace tessera::cuda
