// Tests of kernels/cpu/dnnl.hpp's reorders: convolution weights in a two-block layout
// (OIhw16i16o and the like) brought to plain by the kernels' own loop equal oneDNN's
// reorder of the same memory, over the layouts oneDNN gives weights on AVX-512 and
// AVX2, grouped ones, channel counts that leave partial blocks, several kernel sizes
// and thread counts; every other layout is still oneDNN's.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>
#include <tessera/kernels/cpu/dnnl.hpp>
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace cpu = tessera::kernels::cpu;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

namespace {

dnnl::memory::desc desc(const dims& d, tag t) { return dnnl::memory::desc(d, dnnl::memory::data_type::f32, t); }

// A plain memory of dims d holding distinct values (its index, scaled), a copy of it in
// layout t made by oneDNN's reorder, and that copy brought back to plain by
// detail::reorder_into and by oneDNN's own reorder primitive.
struct round_trip {
  std::vector<float> original, ours, onednn;
};

round_trip run(const dims& d, tag t) {
  const auto& eng = cpu::dnnl_engine();
  dnnl::memory plain(cpu::detail::plain_desc(d), eng), blocked(desc(d, t), eng);
  const std::size_t n = plain.get_desc().get_size() / sizeof(float);
  auto* p = static_cast<float*>(plain.get_data_handle());
  for (std::size_t i = 0; i < n; ++i) p[i] = float(i) * 0.5f - 7.f;
  round_trip r{std::vector<float>(p, p + n), {}, {}};
  dnnl::reorder(plain, blocked).execute(cpu::dnnl_stream(), plain, blocked);
  std::memset(p, 0, n * sizeof(float));
  cpu::detail::reorder_into(blocked, plain);
  r.ours.assign(p, p + n);
  std::memset(p, 0, n * sizeof(float));
  dnnl::reorder(blocked, plain).execute(cpu::dnnl_stream(), blocked, plain);
  r.onednn.assign(p, p + n);
  return r;
}

// Sets the OpenMP threads the kernels' loops use for its lifetime, then 1 (the test's
// environment) again.
struct omp_threads {
  explicit omp_threads(int n) { set(n); }
  ~omp_threads() { set(1); }
  omp_threads(const omp_threads&) = delete;
  omp_threads& operator=(const omp_threads&) = delete;
  static void set([[maybe_unused]] int n) {
#if defined(_OPENMP)
    omp_set_num_threads(n);
#endif
  }
};

std::string text(const dims& d) {
  std::string s;
  for (auto x : d) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

}  // namespace

TEST_CASE("weights in a two-block layout come back to plain as oneDNN's reorder brings them") {
  struct layout {
    tag t;
    int ndims;
    dnnl::memory::dim block;
    bool o_innermost;
  };
  // OIhw16i16o, OIhw16o16i, IOhw16o16i (backward data), IOhw16i16o, OIhw8i8o and
  // OIhw8o8i (AVX2), and the grouped gOIhw16i16o, gOIhw16o16i, gIOhw16o16i.
  const layout layouts[] = {
      {tag::ABcd16b16a, 4, 16, true}, {tag::ABcd16a16b, 4, 16, false}, {tag::BAcd16a16b, 4, 16, false},
      {tag::BAcd16b16a, 4, 16, true}, {tag::ABcd8b8a, 4, 8, true},     {tag::ABcd8a8b, 4, 8, false},
      {tag::aBCde16c16b, 5, 16, true}, {tag::aBCde16b16c, 5, 16, false}, {tag::aCBde16b16c, 5, 16, false},
  };
  // Whole blocks, partial ones on either channel dim (ResNet's stem has 3 input
  // channels), and 1x1, 3x3, 7x7 and 1x3 kernels.
  const std::vector<dims> shapes4{{64, 256, 1, 1}, {48, 32, 3, 3}, {20, 3, 7, 7}, {5, 37, 1, 3}, {1, 1, 1, 1}};
  const std::vector<dims> shapes5{{2, 32, 16, 1, 1}, {3, 20, 5, 3, 3}, {4, 8, 8, 1, 3}};
  for (int threads : {1, 2}) {
    const omp_threads use(threads);
    for (const layout& l : layouts)
      for (const dims& d : l.ndims == 4 ? shapes4 : shapes5) {
        CAPTURE(threads);
        CAPTURE(int(l.t));
        const std::string shape = text(d);
        CAPTURE(shape);
        const auto w = cpu::detail::as_two_block_weights(desc(d, l.t));
        REQUIRE(w.has_value());
        CHECK(w->ndims == l.ndims);
        CHECK(w->block == l.block);
        CHECK(w->o_innermost == l.o_innermost);
        const round_trip r = run(d, l.t);
        CHECK(r.onednn == r.original);
        CHECK(r.ours == r.original);
      }
  }
}

TEST_CASE("at ResNet-50's widest 1x1 weights, on several threads, the loop's plain weights are oneDNN's") {
  const omp_threads use(2);
  for (const dims& d : {dims{512, 2048, 1, 1}, dims{2048, 1024, 1, 1}, dims{256, 1024, 1, 1}}) {
    const round_trip r = run(d, tag::ABcd16b16a);
    CHECK(r.ours == r.onednn);
    CHECK(r.ours == r.original);
  }
}

TEST_CASE("other layouts are not two-block weights and keep oneDNN's reorder") {
  // One inner block (activations' nChw16c, the stem's Ohwi16o), none (plain, nhwc), two
  // of different sizes, and a two-block layout whose blocks are not on the channel dims.
  const std::vector<std::pair<dims, tag>> others{
      {{8, 32, 4, 4}, tag::aBcd16b},     {{64, 3, 7, 7}, tag::Acdb16a},       {{8, 32, 4, 4}, tag::abcd},
      {{8, 32, 4, 4}, tag::acdb},        {{32, 32, 3, 3}, tag::ABcd4b16a4b}, {{2, 32, 16, 1, 1}, tag::ABcde16b16a},
      {{32, 32, 3, 3}, tag::aBcd8b},
  };
  for (const auto& [d, t] : others) {
    CAPTURE(int(t));
    CHECK(!cpu::detail::as_two_block_weights(desc(d, t)).has_value());
    const round_trip r = run(d, t);
    CHECK(r.ours == r.original);
  }
}
