// retain_freed_memory(): the allocator setting of a training process, which allocates
// and frees the same blocks every step.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace tessera::train {

/// Keeps the memory a training step frees for the next step: a process-wide allocator
/// setting, so the library never makes it on its own; programs call it once at start.
/// Every step allocates and frees the same activations and gradients; glibc would
/// return the freed top of the heap to the system after each step (its trim threshold
/// starts at 128 KiB) and serve blocks of 128 KiB or more from fresh mappings (32 MiB and
/// more always: its threshold's ceiling), so the next step maps and zeroes the same
/// memory again, page by page, which costs more than the arithmetic on a small network,
/// and on a large one (ResNet-50's activations at 224 x 224 are 100 MiB and more) tens
/// of milliseconds per tensor. This serves every block from the heap (no mappings) and
/// keeps up to 1 GiB of its freed top, once per process (ResNet-50's step at 32 x 32:
/// the same peak resident memory within 0.2%, and 1.4x faster convolutions whose
/// outputs are 32 MiB).
/// Other C libraries are left alone.
inline void retain_freed_memory() {
#if defined(__GLIBC__)
  static const bool done = [] {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace tessera::train
