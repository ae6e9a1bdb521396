// The host kernels' loops on OpenMP threads: parallel_ranges(n, grain, f) runs f(begin,
// end) over [0, n) in contiguous pieces, one per thread, in a program built with OpenMP
// (tessera::dnnl brings it: oneDNN runs on OpenMP, and the element-wise, batch-norm and
// optimizer loops between its primitives share its threads and OMP_NUM_THREADS); in one
// built without, or for fewer than 2 * grain iterations, or inside a parallel region, it
// is f(0, n) on the calling thread. Each piece is one contiguous range, so the loops
// inside f keep their vectorisation.
#pragma once

#include <algorithm>
#include <cstddef>
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace tessera::kernels::cpu::detail {

/// Element counts below which a loop stays on one thread (the cost of waking the others
/// is a few microseconds).
inline constexpr std::size_t parallel_grain = std::size_t(1) << 15;

template <class F>
void parallel_ranges(std::size_t n, std::size_t grain, F&& f) {
#if defined(_OPENMP)
  const std::size_t threads = omp_in_parallel() ? 1 : std::size_t(omp_get_max_threads());
  const std::size_t pieces = std::min(threads, n / std::max<std::size_t>(grain, 1));
  if (pieces > 1) {
#pragma omp parallel for schedule(static) num_threads(int(pieces))
    for (std::ptrdiff_t k = 0; k < std::ptrdiff_t(pieces); ++k)
      f(n * std::size_t(k) / pieces, n * (std::size_t(k) + 1) / pieces);
    return;
  }
#else
  (void)grain;
#endif
  if (n > 0) f(std::size_t(0), n);
}

}  // namespace tessera::kernels::cpu::detail
