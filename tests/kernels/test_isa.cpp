// Tests of kernels/cpu/isa.hpp through the loops it compiles once per instruction set
// (the split-form batch norm's, kernels/cpu/batch_norm.hpp): under each set this CPU
// has, the same values as under the baseline, in float and in double, on planes walked a
// batch row at a time and plane by plane, and on channel-blocked dnnl_tensors; and the
// setting's errors. Compiled with the
// build type's optimisation (the other kernel tests use -O1, where GCC does not
// vectorise), so the wide copies run vectorised as in the benchmarks and examples.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/kernels/cpu/batch_norm.hpp>
#include <tessera/kernels/cpu/isa.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;

namespace {

// The split form's four loops (sums, normalisation, backward sums, backward data); in
// double, three (the normalisation is float only).
template <class T>
struct split_results {
  xt::xarray<T> sum, sum_sq, y, dsum, dsum_x, dx;
};

template <class T>
split_results<T> split_form(const xt::xarray<T>& x, const xt::xarray<T>& dy, const xt::xarray<T>& gamma,
                            const xt::xarray<T>& beta, bool relu) {
  const std::size_t count = x.shape()[0] * x.shape()[2] * x.shape()[3];
  const T eps = T(1e-5);
  const auto sums = cpu::batch_norm_sums(x);
  const auto m = cpu::batch_norm_moments(sums, count);
  // The normalisation is float only (double takes the loops without it and without ReLU).
  xt::xarray<T> y = xt::zeros<T>({std::size_t(1)});
  if constexpr (std::is_same_v<T, float>)
    y = cpu::batch_norm_forward_inference(x, gamma, beta, m.mean, m.variance, eps, relu);
  const auto r = cpu::batch_norm_backward_sums(dy, x, m.mean, m.variance, eps, relu ? &y : nullptr);
  xt::xarray<T> dx =
      cpu::batch_norm_backward_data(dy, x, gamma, m.mean, m.variance, r, count, eps, relu ? &y : nullptr);
  return {sums.sum, sums.sum_sq, std::move(y), r.sum, r.sum_sq, std::move(dx)};
}

// Restores the instruction set in use when it goes out of scope.
struct isa_restorer {
  cpu::cpu_isa saved = cpu::cpu_isa_in_use();
  ~isa_restorer() { cpu::set_cpu_isa(saved); }
};

// The sets to compare: baseline and every wider one the CPU has.
std::vector<cpu::cpu_isa> available_isas() {
  std::vector<cpu::cpu_isa> isas{cpu::cpu_isa::baseline};
  for (cpu::cpu_isa i : {cpu::cpu_isa::avx2, cpu::cpu_isa::avx512})
    if (i <= cpu::detected_cpu_isa()) isas.push_back(i);
  return isas;
}

// Under each set, split_form of T equals the baseline's within `tol` (relative).
template <class T>
void check_against_baseline(double tol) {
  const std::vector<cpu::cpu_isa> isas = available_isas();
  MESSAGE("instruction sets compared: " << isas.size() << ", up to " << cpu::to_string(cpu::detected_cpu_isa()));
  std::uint64_t seed = 70;
  // Planes below small_plane (64: a batch row at a time) and above it (plane by plane,
  // through the sums' eight lanes and a remainder); enough channels for two threads.
  for (const shape_t& s : {shape_t{4, 3, 5, 5}, shape_t{3, 8, 9, 9}, shape_t{2, 4, 16, 17}, shape_t{4, 64, 16, 16}})
    for (bool relu : {false, true}) {
      if (relu && !std::is_same_v<T, float>) continue;
      CAPTURE(s[1]);
      CAPTURE(s[2]);
      CAPTURE(relu);
      const auto x = random_array<T>(s, seed++, -2.0, 3.0), dy = random_array<T>(s, seed++);
      const auto gamma = random_array<T>({s[1]}, seed++, 0.5, 1.5), beta = random_array<T>({s[1]}, seed++);
      cpu::set_cpu_isa(cpu::cpu_isa::baseline);
      const split_results<T> base = split_form(x, dy, gamma, beta, relu);
      for (cpu::cpu_isa isa : isas) {
        CAPTURE(cpu::to_string(isa));
        cpu::set_cpu_isa(isa);
        REQUIRE(cpu::cpu_isa_in_use() == isa);
        const split_results<T> r = split_form(x, dy, gamma, beta, relu);
        CHECK(relative_error(r.sum, base.sum) < tol);
        CHECK(relative_error(r.sum_sq, base.sum_sq) < tol);
        CHECK(relative_error(r.y, base.y) < tol);
        CHECK(relative_error(r.dsum, base.dsum) < tol);
        CHECK(relative_error(r.dsum_x, base.dsum_x) < 10 * tol);
        CHECK(relative_error(r.dx, base.dx) < 10 * tol);
      }
    }
}

}  // namespace

TEST_CASE("the split-form batch norm gives the baseline's values under every instruction set") {
  const isa_restorer restore;
  // The sums are kept in double either way; the wider loops contract products into fused
  // multiply-adds, a rounding apart.
  SUBCASE("float") { check_against_baseline<float>(1e-6); }
  SUBCASE("double") { check_against_baseline<double>(1e-13); }
}

TEST_CASE("the split form on channel-blocked dnnl_tensors gives the baseline's values under every instruction set") {
  const isa_restorer restore;
  const shape_t s{4, 40, 9, 9};  // channels padded up to the block (48 or 40)
  const auto x = random_array<float>(s, 80, -2.0, 3.0), dy = random_array<float>(s, 81);
  const auto gamma = random_array<float>({s[1]}, 82, 0.5, 1.5);
  const std::size_t count = s[0] * s[2] * s[3];
  for (const auto t : {dnnl::memory::format_tag::nChw16c, dnnl::memory::format_tag::nChw8c})
    for (const bool relu : {false, true}) {
      CAPTURE(relu);
      const auto blocked = [t](const xt::xarray<float>& a) { return cpu::dnnl_tensor::from_xarray(a).in_format(t); };
      const cpu::dnnl_tensor xb = blocked(x), dyb = blocked(dy), yb = blocked(xt::xarray<float>(xt::maximum(x, 0.f)));
      const auto run = [&] {
        const auto sums = cpu::batch_norm_sums(xb);
        const auto m = cpu::batch_norm_moments(sums, count);
        const auto r = cpu::batch_norm_backward_sums(dyb, xb, m.mean, m.variance, 1e-5f, relu ? &yb : nullptr);
        const cpu::dnnl_tensor dx =
            cpu::batch_norm_backward_data(dyb, xb, gamma, m.mean, m.variance, r, count, 1e-5f, relu ? &yb : nullptr);
        return split_results<float>{sums.sum, sums.sum_sq, xt::zeros<float>({1}), r.sum, r.sum_sq, dx.to_xarray()};
      };
      cpu::set_cpu_isa(cpu::cpu_isa::baseline);
      const split_results<float> base = run();
      for (cpu::cpu_isa isa : available_isas()) {
        CAPTURE(cpu::to_string(isa));
        cpu::set_cpu_isa(isa);
        const split_results<float> r = run();
        CHECK(relative_error(r.sum, base.sum) < 1e-6);
        CHECK(relative_error(r.sum_sq, base.sum_sq) < 1e-6);
        CHECK(relative_error(r.dsum, base.dsum) < 1e-6);
        CHECK(relative_error(r.dsum_x, base.dsum_x) < 1e-5);
        CHECK(relative_error(r.dx, base.dx) < 1e-5);
      }
    }
}

TEST_CASE("the instruction-set setting names what it refuses") {
  const isa_restorer restore;
  CHECK(thrown([] { (void)cpu::detail::parse_cpu_isa("sse9", "TESSERA_CPU_ISA"); }) ==
        "TESSERA_CPU_ISA: unknown instruction set 'sse9': expected baseline, avx2 or avx512");
  CHECK(cpu::detail::parse_cpu_isa("avx2", "TESSERA_CPU_ISA") == cpu::cpu_isa::avx2);
  if (cpu::detected_cpu_isa() < cpu::cpu_isa::avx512)
    CHECK(thrown([] { cpu::set_cpu_isa(cpu::cpu_isa::avx512); }) ==
          "set_cpu_isa: avx512 asked, this CPU (or build) supports up to " +
              std::string(cpu::to_string(cpu::detected_cpu_isa())));
  else
    MESSAGE("this CPU has AVX-512: no instruction set above it to refuse");
  cpu::set_cpu_isa(cpu::cpu_isa::baseline);
  CHECK(cpu::cpu_isa_in_use() == cpu::cpu_isa::baseline);
}
