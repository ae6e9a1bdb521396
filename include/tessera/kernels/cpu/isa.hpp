// The vector instruction sets of tessera's hottest host loops (the batch norms' passes
// over memory). A program built for the compiler's default target (SSE2 on x86-64)
// still runs them with AVX2 and FMA, or AVX-512, where the CPU has them: each is compiled
// once per instruction set (GCC's and Clang's `target` attribute) and the widest that the
// CPU and the setting allow is chosen at run time, as oneDNN and BLAS choose theirs.
//
//     kernels::cpu::cpu_isa_in_use();                                // avx512 on such CPUs
//     kernels::cpu::set_cpu_isa(kernels::cpu::cpu_isa::baseline);   // the build's own only
//
// The environment variable TESSERA_CPU_ISA (baseline, avx2, avx512) caps the choice at the
// first use. The wider loops contract a * b + c into fused multiply-adds, so their results
// may differ from the baseline's in the last bits; the ranks of a job on CPUs of one kind
// take the same loops. Elsewhere (other architectures or compilers, CUDA translation
// units, a build that already targets AVX-512, TESSERA_NO_CPU_DISPATCH defined) each loop
// has one version.
#pragma once

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <tessera/core/error.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__AVX512F__) && !defined(TESSERA_NO_CPU_DISPATCH)
#define TESSERA_CPU_DISPATCH 1
#else
#define TESSERA_CPU_DISPATCH 0
#endif

// On a lambda (after its parameters) or a function: inlined wherever it is called, so the
// loops of a lambda given to on_cpu_isa take each version's instructions.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define TESSERA_ALWAYS_INLINE __attribute__((always_inline))
#else
#define TESSERA_ALWAYS_INLINE
#endif

namespace tessera::kernels::cpu {

/// The instruction sets the dispatched host loops are compiled for, narrowest first.
/// - `baseline`: the build's own target (SSE2 on x86-64 unless the build asks for more).
/// - `avx2`: AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE (x86-64-v3).
/// - `avx512`: those and AVX-512 F, VL, BW, DQ, CD (x86-64-v4).
enum class cpu_isa { baseline, avx2, avx512 };

inline constexpr std::string_view to_string(cpu_isa i) {
  switch (i) {
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx512: return "avx512";
    default: return "baseline";
  }
}

namespace detail {

/// The widest cpu_isa this CPU (with its operating system's support for the registers)
/// offers and this build can dispatch to; baseline where it cannot dispatch.
inline cpu_isa detect_cpu_isa() {
#if TESSERA_CPU_DISPATCH
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    return cpu_isa::avx512;
  return avx2 ? cpu_isa::avx2 : cpu_isa::baseline;
#else
  return cpu_isa::baseline;
#endif
}

/// The cpu_isa named `text`; throws naming `where` and the choices.
inline cpu_isa parse_cpu_isa(std::string_view text, std::string_view where) {
  for (cpu_isa i : {cpu_isa::baseline, cpu_isa::avx2, cpu_isa::avx512})
    if (text == to_string(i)) return i;
  throw error(std::string(where) + ": unknown instruction set '" + std::string(text) +
              "': expected baseline, avx2 or avx512");
}

}  // namespace detail

/// The widest instruction set this CPU supports that this build can dispatch to.
inline cpu_isa detected_cpu_isa() {
  static const cpu_isa d = detail::detect_cpu_isa();
  return d;
}

namespace detail {

/// The setting: detected_cpu_isa() capped by TESSERA_CPU_ISA, read at the first use.
inline std::atomic<cpu_isa>& cpu_isa_setting() {
  static std::atomic<cpu_isa> s{[] {
    const cpu_isa detected = detected_cpu_isa();
    const char* env = std::getenv("TESSERA_CPU_ISA");
    if (!env || !*env) return detected;
    const cpu_isa cap = parse_cpu_isa(env, "TESSERA_CPU_ISA");
    return cap < detected ? cap : detected;
  }()};
  return s;
}

#if TESSERA_CPU_DISPATCH
// f(args...) compiled with each instruction set: f, marked TESSERA_ALWAYS_INLINE, is
// inlined here and its loops vectorised with this function's registers.
template <class F, class... A>
__attribute__((target("avx2,fma,bmi,bmi2,f16c,lzcnt,movbe"))) void run_avx2(F& f, A... args) {
  f(args...);
}
template <class F, class... A>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512cd,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe"))) void
run_avx512(F& f, A... args) {
  f(args...);
}
#endif

/// f(args...) with the instructions of the set in use (cpu_isa_in_use()). f must be
/// marked TESSERA_ALWAYS_INLINE, and so must whatever it calls in its loops; args are
/// plain values (offsets, counts, coefficients), f captures the rest.
template <class F, class... A>
void on_cpu_isa(F&& f, A... args) {
#if TESSERA_CPU_DISPATCH
  switch (cpu_isa_setting().load(std::memory_order_relaxed)) {
    case cpu_isa::avx512: return run_avx512(f, args...);
    case cpu_isa::avx2: return run_avx2(f, args...);
    default: break;
  }
#endif
  f(args...);
}

}  // namespace detail

/// The instruction set the dispatched host loops use now.
inline cpu_isa cpu_isa_in_use() { return detail::cpu_isa_setting().load(std::memory_order_relaxed); }

/// Makes the dispatched host loops use `isa` from the next call on (every thread). Throws
/// unless the CPU and the build support it: "set_cpu_isa: avx512 asked, this CPU (or
/// build) supports up to avx2".
inline void set_cpu_isa(cpu_isa isa) {
  if (isa > detected_cpu_isa())
    throw error("set_cpu_isa: " + std::string(to_string(isa)) + " asked, this CPU (or build) supports up to " +
                std::string(to_string(detected_cpu_isa())));
  detail::cpu_isa_setting().store(isa, std::memory_order_relaxed);
}

}  // namespace tessera::kernels::cpu
