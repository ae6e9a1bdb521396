// The caching allocator of device memory: blocks freed by tensors are kept and handed
// out again instead of going back to cudaFree, so a training step that allocates the
// same shapes every iteration stops calling cudaMalloc after the first. Plain device
// memory (cudaMalloc), never managed memory. Safe because every use of a block is
// ordered on tessera's one stream (cuda/runtime.hpp): a block freed on the host may be
// reused by later work on that stream before the earlier work has run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/runtime.hpp>

namespace tessera::cuda {

/// What the allocator holds, in bytes.
struct memory_stats {
  std::size_t in_use = 0;        ///< handed out to arrays now
  std::size_t cached = 0;        ///< freed by arrays, kept for reuse
  std::size_t peak_in_use = 0;   ///< the most in_use has been (since reset_peak)
  std::size_t device_allocs = 0; ///< cudaMalloc calls made
};

/// One device's caching allocator. Requests are rounded up to a size class (512 B steps
/// below 1 MiB, 1 MiB steps above, so a block serves requests within one class) and
/// served from the free blocks of that class before cudaMalloc is called.
class caching_allocator {
 public:
  static constexpr std::size_t small_step = 512;
  static constexpr std::size_t large_step = std::size_t(1) << 20;

  caching_allocator() = default;
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;

  /// The size class of a request of `bytes`.
  static constexpr std::size_t round_up(std::size_t bytes) {
    const std::size_t step = bytes < large_step ? small_step : large_step;
    return bytes == 0 ? small_step : (bytes + step - 1) / step * step;
  }

  /// A block of at least `bytes` bytes. When the device is out of memory, frees the
  /// cache and tries once more, then throws naming the numbers:
  /// "cuda allocator: out of device memory: 4294967296 bytes requested, 1048576 in use,
  /// 0 cached, 512 free of 85029158912".
  void* allocate(std::size_t bytes) {
    const std::size_t size = round_up(bytes);
    std::lock_guard lock(mutex_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.cached -= size;
      note_in_use(size);
      return p;
    }
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, size);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_locked();
      rc = cudaMalloc(&p, size);
    }
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      throw error("cuda allocator: out of device memory: " + std::to_string(size) + " bytes requested, " +
                  std::to_string(stats_.in_use) + " in use, " + std::to_string(stats_.cached) + " cached, " +
                  std::to_string(free_b) + " free of " + std::to_string(total_b));
    }
    check(rc, "cudaMalloc");
    ++stats_.device_allocs;
    note_in_use(size);
    return p;
  }

  /// Returns a block of `bytes` (the size it was allocated with) to the cache.
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    const std::size_t size = round_up(bytes);
    std::lock_guard lock(mutex_);
    free_[size].push_back(p);
    stats_.in_use -= size;
    stats_.cached += size;
  }

  /// Gives every cached block back to the device (cudaFree). Blocks in use stay.
  void release_cached() {
    std::lock_guard lock(mutex_);
    release_locked();
  }

  memory_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
  }

 private:
  void note_in_use(std::size_t size) {
    stats_.in_use += size;
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
  }
  void release_locked() {
    // Work queued on the stream may still use a cached block: wait for it first.
    (void)cudaStreamSynchronize(stream());
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) {
        (void)cudaFree(p);
        stats_.cached -= size;
      }
    free_.clear();
  }

  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
  memory_stats stats_;
};

/// The caching allocator of the current device (one per device, for the process).
inline caching_allocator& allocator() {
  constexpr int max_devices = 64;
  static caching_allocator* per_device[max_devices] = {};
  const int d = current_device();
  if (d >= max_devices) throw error("cuda::allocator: device index " + std::to_string(d) + " exceeds 64");
  if (!per_device[d]) per_device[d] = new caching_allocator();  // outlives every array
  return *per_device[d];
}

}  // namespace tessera::cuda
