// Every CUDA kernel against its host twin (kernels/cpu/), on shapes that take each
// code path: contiguous and vectorised, broadcast, every subset of reduced axes, rows,
// columns and whole-tensor reductions split over many blocks, transposed products.
// Small-integer data where the result must be exact; otherwise float rounding
// (different summation orders) within a relative tolerance. Plus the storage kernels,
// the caching allocator and the error texts (the same as the host kernels').
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>
#include <tessera/cuda.hpp>

namespace cuda_test_kernels {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace kc = tessera::kernels::cuda;
namespace kh = tessera::kernels::cpu;
using darray = cuda::device_array<float>;
using S = storage<float, cuda_device>;

namespace {

std::vector<std::size_t> shape_of(std::initializer_list<std::size_t> s) { return std::vector<std::size_t>(s); }

// Values i * 7 % 11 - 5 (exact in every sum and product here), or uniform in [lo, hi).
xt::xarray<float> host_array(const std::vector<std::size_t>& shape, int seed, bool ints = true, float lo = -2.0f,
                             float hi = 2.0f) {
  xt::xarray<float> x = xt::xarray<float>::from_shape(shape);
  std::mt19937 gen{unsigned(seed)};
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = ints ? float(std::int64_t(i * 7 + std::size_t(seed)) % 11 - 5) : u(gen);
  return x;
}

darray dev(const xt::xarray<float>& h) { return S::from_host(h); }
xt::xarray<float> host(const darray& d) { return S::to_host(d); }

bool same_shape(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  return std::vector<std::size_t>(a.shape().begin(), a.shape().end()) ==
         std::vector<std::size_t>(b.shape().begin(), b.shape().end());
}
bool same_values(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  if (!same_shape(a, b)) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a.data()[i] == b.data()[i]) && !(std::isnan(a.data()[i]) && std::isnan(b.data()[i]))) return false;
  return true;
}
// |a - b| <= tol (|b| + scale), scale the largest |b| (sums of many terms).
bool near(const xt::xarray<float>& a, const xt::xarray<float>& b, float tol = 1e-5f) {
  if (!same_shape(a, b)) return false;
  float scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b.data()[i]));
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::abs(a.data()[i] - b.data()[i]) > tol * (std::abs(b.data()[i]) + scale) + 1e-30f) return false;
  return true;
}

// Every subset of the dims of a rank-n shape, as ascending axis lists.
std::vector<std::vector<int>> axis_subsets(int n) {
  std::vector<std::vector<int>> out;
  for (int m = 0; m < (1 << n); ++m) {
    std::vector<int> a;
    for (int d = 0; d < n; ++d)
      if (m >> d & 1) a.push_back(d);
    out.push_back(a);
  }
  return out;
}

}  // namespace

TEST_CASE("storage: host round trip, fill, and box copies of every kind") {
  const xt::xarray<float> h = host_array(shape_of({3, 5, 7}), 1);
  CHECK(same_values(host(dev(h)), h));
  darray d(shape_of({1000003}));
  S::fill(d, 2.5f);
  const xt::xarray<float> f = host(d);
  for (float v : f) REQUIRE(v == 2.5f);
  // Boxes of a (4, 6, 8) array into a (5, 7, 9) array: contiguous, 2-D and strided copies.
  const xt::xarray<float> src = host_array(shape_of({4, 6, 8}), 2);
  const extents ss{4, 6, 8}, ds{5, 7, 9};
  struct box_case { extents so, doff, box; };
  const std::vector<box_case> cases = {
      {extents{0, 0, 0}, extents{1, 1, 1}, extents{4, 6, 8}},  // strided in dst
      {extents{1, 0, 0}, extents{0, 0, 0}, extents{2, 6, 8}},  // whole rows: 2-D copy
      {extents{0, 2, 3}, extents{3, 4, 5}, extents{1, 3, 4}},  // general
      {extents{2, 5, 7}, extents{4, 6, 8}, extents{1, 1, 1}},  // one element
  };
  for (const auto& c : cases) {
    darray dd(shape_of({5, 7, 9})), sd = dev(src);
    S::fill(dd, -1.0f);
    xt::xarray<float> expect = xt::xarray<float>::from_shape({5, 7, 9});
    std::fill(expect.begin(), expect.end(), -1.0f);
    tessera::detail::copy_box(src.data(), ss, c.so, expect.data(), ds, c.doff, c.box);
    S::copy_box(sd.data(), ss, c.so, dd.data(), ds, c.doff, c.box);
    CHECK(same_values(host(dd), expect));
  }
  // A (2, 3) box at the start of identical (2, 3) arrays: one contiguous copy.
  darray a = dev(host_array(shape_of({2, 3}), 3)), b(shape_of({2, 3}));
  S::copy_box(a.data(), extents{2, 3}, extents{0, 0}, b.data(), extents{2, 3}, extents{0, 0}, extents{2, 3});
  CHECK(same_values(host(b), host(a)));
}

TEST_CASE("device_array copies: values, shape, and empty arrays stay empty") {
  const darray a = dev(host_array(shape_of({3, 4}), 5));
  const darray b = a;
  CHECK(b.data() != a.data());
  CHECK(b.shape() == a.shape());
  CHECK(same_values(host(b), host(a)));
  // A default array (a struct's member before its use, as the reducer's) and one with a
  // zero extent copy as empty, with their shapes, and allocate nothing.
  const darray none;
  const darray none_copy = none;
  CHECK(none_copy.size() == 0);
  CHECK(none_copy.data() == nullptr);
  CHECK(none_copy.shape().empty());
  const darray zero(shape_of({2, 0, 3}));
  darray zero_copy(shape_of({1}));
  zero_copy = zero;
  CHECK(zero_copy.size() == 0);
  CHECK(zero_copy.data() == nullptr);
  CHECK(zero_copy.shape() == zero.shape());
}

TEST_CASE("element-wise kernels equal the host's, with broadcasting") {
  struct pair_case { std::vector<std::size_t> a, b; };
  const std::vector<pair_case> shapes = {{{3, 4}, {3, 4}},       {{3, 1}, {1, 4}},   {{4}, {2, 3, 4}},
                                         {{}, {5}},              {{2, 1, 3}, {4, 1}}, {{1000003}, {1000003}},
                                         {{257, 129}, {129}}};
  for (const auto& sc : shapes) {
    CAPTURE(kh::detail::shape_text(sc.a));
    CAPTURE(kh::detail::shape_text(sc.b));
    const xt::xarray<float> a = host_array(sc.a, 1), b = host_array(sc.b, 2);
    xt::xarray<float> bnz = b;  // no zero divisors
    for (float& v : bnz) v = v == 0 ? 3.0f : v;
    CHECK(same_values(host(kc::add(dev(a), dev(b))), kh::add(a, b)));
    CHECK(same_values(host(kc::sub(dev(a), dev(b))), kh::sub(a, b)));
    CHECK(same_values(host(kc::mul(dev(a), dev(b))), kh::mul(a, b)));
    CHECK(same_values(host(kc::div(dev(a), dev(bnz))), kh::div(a, bnz)));
  }
  for (const auto& s : {shape_of({}), shape_of({7}), shape_of({1000003}), shape_of({33, 65})}) {
    const xt::xarray<float> x = host_array(s, 4, false), pos = host_array(s, 5, false, 0.1f, 4.0f);
    const xt::xarray<float> dy = host_array(s, 6, false);
    CHECK(same_values(host(kc::relu(dev(x))), kh::relu(x)));
    CHECK(same_values(host(kc::neg(dev(x))), kh::neg(x)));
    CHECK(near(host(kc::exp(dev(x))), kh::exp(x), 1e-6f));
    CHECK(near(host(kc::log(dev(pos))), kh::log(pos), 1e-6f));
    CHECK(same_values(host(kc::relu_grad(dev(dy), dev(x))), kh::relu_grad(dy, x)));
    darray sx = dev(x);
    kc::scale(sx, 0.5f);
    CHECK(same_values(host(sx), x * 0.5f));
    darray acc = dev(x);
    kc::add_to(acc, dev(dy));
    CHECK(same_values(host(acc), kh::add(x, dy)));
  }
  const xt::xarray<float> x = host_array(shape_of({6, 10}), 7), bias = host_array(shape_of({10}), 8);
  CHECK(same_values(host(kc::bias_add(dev(x), dev(bias))), kh::bias_add(x, bias)));
}

TEST_CASE("element-wise kernels raise the host kernels' errors") {
  const darray a(shape_of({3, 2})), b(shape_of({4}));
  CHECK_THROWS_WITH_AS(kc::add(a, b), "add: shapes do not broadcast: a is (3, 2), b is (4,)", error);
  CHECK_THROWS_WITH_AS(kc::bias_add(a, b), "bias_add: bias is (4,), expected (2,) for x (3, 2)", error);
}

TEST_CASE("reductions over every subset of axes equal the host's") {
  for (const auto& s : {shape_of({2, 3, 4}), shape_of({5}), shape_of({3, 1, 700}), shape_of({1, 1})}) {
    const xt::xarray<float> x = host_array(s, 9), xr = host_array(s, 10, false);
    for (const std::vector<int>& axes : axis_subsets(int(s.size())))
      for (bool keep : {false, true}) {
        CAPTURE(kh::detail::shape_text(s));
        CAPTURE(kh::detail::list_text(axes));
        CAPTURE(keep);
        CHECK(same_values(host(kc::reduce_sum(dev(x), axes, keep)), kh::reduce_sum(x, axes, keep)));
        CHECK(same_values(host(kc::reduce_max(dev(xr), axes, keep)), kh::reduce_max(xr, axes, keep)));
        const xt::xarray<float> ref = kh::reduce_sum(x, axes, keep);
        const xt::xarray<float> dy = host_array(std::vector<std::size_t>(ref.shape().begin(), ref.shape().end()), 11);
        CHECK(same_values(host(kc::reduce_sum_grad(dev(dy), s, axes, keep)), kh::reduce_sum_grad(dy, s, axes, keep)));
        // A sharded ReduceMax's gradient pieces, on one shard, give the host gradient.
        const xt::xarray<float> y = kh::reduce_max(x, axes, keep);
        const darray ties = kc::reduce_max_tie_counts(dev(x), dev(y), axes, keep);
        CHECK(same_values(host(ties), kh::reduce_max_tie_counts(x, y, axes, keep)));
        CHECK(same_values(host(kc::reduce_max_spread(dev(dy), dev(x), dev(y), ties, axes, keep)),
                    kh::reduce_max_grad(dy, x, y, axes, keep)));
      }
  }
}

TEST_CASE("large reductions: rows, columns and whole tensors split over blocks") {
  // Small integers: every partial sum is exact, so any element counted twice or missed
  // shows. Random floats: within float rounding of a double-precision sum.
  const xt::xarray<float> m = host_array(shape_of({1000, 2000}), 12), mr = host_array(shape_of({1000, 2000}), 12, false);
  for (const std::vector<int>& axes : {std::vector<int>{1}, std::vector<int>{0}, std::vector<int>{}}) {
    CAPTURE(kh::detail::list_text(axes));
    CHECK(same_values(host(kc::reduce_sum(dev(m), axes, false)), kh::reduce_sum(m, axes, false)));
    CHECK(same_values(host(kc::reduce_max(dev(mr), axes, false)), kh::reduce_max(mr, axes, false)));
  }
  const xt::xarray<float> v = host_array(shape_of({3000017}), 13), vr = host_array(shape_of({3000017}), 13, false);
  CHECK(same_values(host(kc::reduce_sum(dev(v))), kh::reduce_sum(v)));
  double exact = 0, magnitude = 0;
  for (float e : vr) {
    exact += e;
    magnitude += std::abs(e);
  }
  CHECK(std::abs(double(host(kc::reduce_sum(dev(vr)))()) - exact) <= 1e-6 * magnitude);
  // A NaN wins a max, as on the host.
  xt::xarray<float> withnan = vr;
  withnan(12345) = std::nanf("");
  CHECK(std::isnan(host(kc::reduce_max(dev(withnan)))()));
}

TEST_CASE("reduce_to_shape sums a broadcast's gradient back to each operand's shape") {
  const xt::xarray<float> g = host_array(shape_of({2, 3, 4}), 14);
  for (const auto& s : {shape_of({2, 3, 4}), shape_of({3, 4}), shape_of({4}), shape_of({}), shape_of({2, 1, 4}),
                        shape_of({1, 3, 1})}) {
    CAPTURE(kh::detail::shape_text(s));
    CHECK(same_values(host(kc::reduce_to_shape(dev(g), s)), kh::reduce_to_shape(g, s)));
  }
  CHECK_THROWS_WITH_AS(kc::reduce_to_shape(dev(g), shape_of({3, 2})),
                       "reduce_to_shape: shape (3, 2) does not broadcast to the gradient's shape (2, 3, 4)", error);
}

TEST_CASE("matmul and its gradients through cuBLAS equal the host's, every transpose") {
  constexpr std::size_t m = 17, k = 33, n = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const xt::xarray<float> a = host_array(ta ? shape_of({k, m}) : shape_of({m, k}), 15);
      const xt::xarray<float> b = host_array(tb ? shape_of({n, k}) : shape_of({k, n}), 16);
      const xt::xarray<float> dc = host_array(shape_of({m, n}), 17);
      CHECK(same_values(host(kc::matmul(dev(a), dev(b), ta, tb)), kh::matmul(a, b, ta, tb)));
      CHECK(same_values(host(kc::matmul_grad_a(dev(dc), dev(a), dev(b), ta, tb)), kh::matmul_grad_a(dc, a, b, ta, tb)));
      CHECK(same_values(host(kc::matmul_grad_b(dev(dc), dev(a), dev(b), ta, tb)), kh::matmul_grad_b(dc, a, b, ta, tb)));
    }
  // An empty contraction gives zeros.
  CHECK(same_values(host(kc::matmul(dev(xt::xarray<float>::from_shape({3, 0})), dev(xt::xarray<float>::from_shape({0, 2})))),
              kh::matmul(xt::xarray<float>::from_shape({3, 0}), xt::xarray<float>::from_shape({0, 2}))));
  CHECK_THROWS_WITH_AS(kc::matmul(darray(shape_of({8, 8})), darray(shape_of({4, 16}))),
                       "matmul: contraction dims differ: a is (8, 8) with trans_a false, b is (4, 16) with "
                       "trans_b false",
                       error);
}

TEST_CASE("matmul precision: TF32 and bf16 tensor-core math within their tolerances") {
  const xt::xarray<float> a = host_array(shape_of({256, 512}), 18, false), b = host_array(shape_of({512, 128}), 19, false);
  const xt::xarray<float> ref = kh::matmul(a, b);
  CHECK(near(host(kc::matmul(dev(a), dev(b))), ref, 1e-5f));
  kc::set_matmul_precision(kc::matmul_precision::tf32);
  CHECK(near(host(kc::matmul(dev(a), dev(b))), ref, 5e-3f));
  kc::set_matmul_precision(kc::matmul_precision::bf16);
  CHECK(near(host(kc::matmul(dev(a), dev(b))), ref, 3e-2f));
  kc::set_matmul_precision(kc::matmul_precision::fp32);
}

TEST_CASE("softmax cross entropy pieces equal the host's") {
  for (const auto& s : {shape_of({5, 7}), shape_of({64, 1000}), shape_of({3, 1})}) {
    const xt::xarray<float> x = host_array(s, 20, false, -5, 5), t = host_array(s, 21, false, 0, 1);
    const xt::xarray<float> dl = host_array(shape_of({s[0]}), 22, false);
    const xt::xarray<float> mh = kh::ce_row_max(x), sh = kh::ce_row_terms(x, t, mh);
    const darray md = kc::ce_row_max(dev(x)), sd = kc::ce_row_terms(dev(x), dev(t), md);
    CHECK(same_values(host(md), mh));
    CHECK(near(host(sd), sh, 1e-5f));
    CHECK(near(host(kc::ce_loss(dev(sh))), kh::ce_loss(sh), 1e-6f));
    CHECK(near(host(kc::ce_grad(dev(dl), dev(x), dev(t), dev(mh), dev(sh))), kh::ce_grad(dl, x, t, mh, sh), 1e-5f));
  }
}

TEST_CASE("momentum update equals the host's to float rounding (the GPU fuses multiply-adds)") {
  const xt::xarray<float> p = host_array(shape_of({1001}), 23, false), a = host_array(shape_of({1001}), 24, false);
  const xt::xarray<float> g = host_array(shape_of({1001}), 25, false);
  xt::xarray<float> ph = p, ah = a;
  kernels::backend<cpu_device>::momentum_update(ph, ah, g, 0.2f, 0.9f);
  darray pd = dev(p), ad = dev(a);
  kc::momentum_update(pd, ad, dev(g), 0.2f, 0.9f);
  CHECK(near(host(pd), ph, 1e-6f));
  CHECK(near(host(ad), ah, 1e-6f));
  // With weight decay and Nesterov's variant, on the vector path and an unaligned tail.
  for (const bool nesterov : {false, true}) {
    xt::xarray<float> pw = p, aw = a;
    kernels::backend<cpu_device>::momentum_update(pw, aw, g, 0.2f, 0.9f, 0.01f, nesterov);
    darray pdw = dev(p), adw = dev(a);
    kernels::backend<cuda_device>::momentum_update(pdw, adw, dev(g), 0.2f, 0.9f, 0.01f, nesterov);
    CHECK(near(host(pdw), pw, 1e-6f));
    CHECK(near(host(adw), aw, 1e-6f));
  }
  darray short_grad = dev(xt::xarray<float>(xt::zeros<float>({1000})));
  CHECK_THROWS_WITH(kc::momentum_update(pd, ad, short_grad, 0.2f, 0.9f),
                    "momentum_update: the gradient has 1000 elements, the parameter 1001");
}

TEST_CASE("fused maps: one kernel with the host's functors, values as the host's") {
  namespace fz = kernels::fused;
  using KD = kernels::backend<cuda_device>;
  using KH = kernels::backend<cpu_device>;
  // 1001 columns: the row kernel without vectors; 1024: with them. 4099 elements: a tail.
  for (const auto& shape : {shape_of({3, 1001}), shape_of({5, 1024}), shape_of({4099})}) {
    CAPTURE(shape.size());
    const xt::xarray<float> dy = host_array(shape, 60, false), a = host_array(shape, 61, false),
                            b = host_array(shape, 62, false, 0.5f, 2.0f);
    CHECK(near(host(KD::fused_map<float>("t", fz::div_grad_divisor{}, dev(dy), dev(a), dev(b))),
               KH::fused_map<float>("t", fz::div_grad_divisor{}, dy, a, b), 1e-6f));
    CHECK(near(host(KD::fused_map<float>("t", fz::exp_grad{}, dev(dy), dev(a))),
               KH::fused_map<float>("t", fz::exp_grad{}, dy, a), 1e-6f));
    CHECK(near(host(KD::fused_map<float>("t", fz::act_grad<fz::activation::sigmoid>{}, dev(dy), dev(b))),
               KH::fused_map<float>("t", fz::act_grad<fz::activation::sigmoid>{}, dy, b), 1e-6f));
    CHECK(near(host(KD::fused_map<float>("t", fz::act_value<fz::activation::tanh>{}, dev(a))),
               KH::fused_map<float>("t", fz::act_value<fz::activation::tanh>{}, a), 1e-6f));
    // Over an rvalue: written over its own storage, as the host's; an operand may be it.
    darray d = dev(dy);
    const float* storage = d.data();
    const darray r = KD::fused_map<float>("t", fz::act_grad<fz::activation::relu>{}, std::move(d), d);
    CHECK(r.data() == storage);
    CHECK(same_values(host(r), KH::fused_map<float>("t", fz::act_grad<fz::activation::relu>{}, dy, dy)));
    const xt::xarray<float> bias = host_array(shape_of({shape.back()}), 63, false);
    CHECK(near(host(KD::fused_bias_map<float>("t", dev(a), dev(bias), fz::bias_act<fz::activation::relu>{})),
               KH::fused_bias_map<float>("t", a, bias, fz::bias_act<fz::activation::relu>{}), 1e-6f));
    CHECK(near(host(KD::fused_bias_map<float>("t", dev(a), dev(bias), fz::bias_act<fz::activation::sigmoid>{})),
               KH::fused_bias_map<float>("t", a, bias, fz::bias_act<fz::activation::sigmoid>{}), 1e-6f));
    CHECK(same_values(host(KD::bias_add<float>(dev(a), dev(bias))), KH::bias_add<float>(a, bias)));
  }
  CHECK_THROWS_WITH(KD::fused_map<float>("div_backward", fz::div_grad_divisor{}, dev(host_array(shape_of({3, 5}), 1)),
                                         dev(host_array(shape_of({3, 5}), 2)), dev(host_array(shape_of({5}), 3))),
                    "div_backward: shapes differ: operand 0 is (3, 5), operand 2 is (5,)");
  CHECK_THROWS_WITH(KD::fused_bias_map<float>("dense", dev(host_array(shape_of({5, 4}), 1)),
                                              dev(host_array(shape_of({3}), 2)), fz::bias_act<fz::activation::relu>{}),
                    "dense: bias is (3,), expected (4,) for x (5, 4)");
}

TEST_CASE("the caching allocator reuses freed blocks") {
  cuda::caching_allocator& al = cuda::allocator();
  { darray warm(shape_of({1 << 20})); }
  const cuda::memory_stats before = al.stats();
  for (int i = 0; i < 10; ++i) {
    darray x(shape_of({1 << 20}));  // the same size class every time
    S::fill(x, 1.0f);
  }
  const cuda::memory_stats after = al.stats();
  CHECK(after.device_allocs == before.device_allocs);
  CHECK(after.in_use == before.in_use);
  CHECK(cuda::caching_allocator::round_up(1) == 512);
  CHECK(cuda::caching_allocator::round_up(1000) == 1024);
  CHECK(cuda::caching_allocator::round_up((1 << 20) + 1) == 2u << 20);
  al.release_cached();
  CHECK(al.stats().cached == 0);
}

TEST_CASE("device arrays copy deeply and move their block") {
  darray a = dev(host_array(shape_of({4, 4}), 26));
  darray b = a;
  S::fill(a, 0.0f);
  CHECK(same_values(host(b), host_array(shape_of({4, 4}), 26)));
  darray c = std::move(b);
  CHECK(b.data() == nullptr);
  CHECK(c.size() == 16);
  CHECK_THROWS_WITH_AS(c.reshape(shape_of({5, 3})), "device_array::reshape: a shape of 15 elements for an array of 16",
                       error);
}

// ---- the kernels of the later operators (BatchMatMul, shape ops, Softmax along an axis,
// sparse cross entropy, ArgMax, OneHot) and of SGD and Adam ----

namespace {

template <class T>
cuda::device_array<T> dev_of(const xt::xarray<T>& h) {
  return storage<T, cuda_device>::from_host(h);
}
template <class T>
xt::xarray<T> host_of(const cuda::device_array<T>& d) {
  return storage<T, cuda_device>::to_host(d);
}

}  // namespace

TEST_CASE("batch_matmul and its gradients equal the host's: batched, shared a, shared b, every transpose") {
  constexpr std::size_t B = 5, m = 7, k = 11, n = 6;
  for (int shared = 0; shared < 3; ++shared)  // 0: both batched, 1: a shared, 2: b shared
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(shared);
        CAPTURE(ta);
        CAPTURE(tb);
        std::vector<std::size_t> sa = ta ? shape_of({k, m}) : shape_of({m, k});
        std::vector<std::size_t> sb = tb ? shape_of({n, k}) : shape_of({k, n});
        if (shared != 1) sa.insert(sa.begin(), B);
        if (shared != 2) sb.insert(sb.begin(), B);
        const xt::xarray<float> a = host_array(sa, 40), b = host_array(sb, 41);
        const xt::xarray<float> dc = host_array(shape_of({B, m, n}), 42);
        CHECK(same_values(host(kc::batch_matmul(dev(a), dev(b), ta, tb)), kh::batch_matmul(a, b, ta, tb)));
        CHECK(same_values(host(kc::batch_matmul_grad_a(dev(dc), dev(a), dev(b), ta, tb)),
                          kh::batch_matmul_grad_a(dc, a, b, ta, tb)));
        CHECK(same_values(host(kc::batch_matmul_grad_b(dev(dc), dev(a), dev(b), ta, tb)),
                          kh::batch_matmul_grad_b(dc, a, b, ta, tb)));
      }
  // An empty batch and an empty contraction give zeros.
  const xt::xarray<float> a0 = xt::xarray<float>::from_shape({0, 3, 4}), b0 = host_array(shape_of({4, 2}), 43);
  const xt::xarray<float> dc0 = xt::xarray<float>::from_shape({0, 3, 2});
  CHECK(same_values(host(kc::batch_matmul_grad_b(dev(dc0), dev(a0), dev(b0))), kh::batch_matmul_grad_b(dc0, a0, b0)));
  const xt::xarray<float> a1 = xt::xarray<float>::from_shape({2, 3, 0}), b1 = xt::xarray<float>::from_shape({0, 4});
  CHECK(same_values(host(kc::batch_matmul(dev(a1), dev(b1))), kh::batch_matmul(a1, b1)));
  CHECK_THROWS_WITH_AS(kc::batch_matmul(darray(shape_of({2, 3, 4})), darray(shape_of({3, 4, 5}))),
                       "batch_matmul: batch dims differ: a is (2, 3, 4), b is (3, 4, 5)", error);
  CHECK_THROWS_WITH_AS(kc::batch_matmul(darray(shape_of({3, 4})), darray(shape_of({4, 5}))),
                       "batch_matmul: a or b must be 3-D (batch, rows, cols): a is (3, 4), b is (4, 5)", error);
}

TEST_CASE("transpose, strided_slice, concat, split and their gradients equal the host's") {
  const xt::xarray<float> x = host_array(shape_of({3, 4, 5}), 44);
  for (const std::vector<int>& perm : {std::vector<int>{0, 1, 2}, {2, 0, 1}, {1, 2, 0}, {-1, -3, -2}}) {
    CHECK(same_values(host(kc::transpose(dev(x), perm)), kh::transpose(x, perm)));
    const xt::xarray<float> dy = kh::transpose(x, perm);
    CHECK(same_values(host(kc::transpose_grad(dev(dy), perm)), kh::transpose_grad(dy, perm)));
  }
  const xt::xarray<float> x0 = host_array(shape_of({}), 45);  // 0-D: nothing to permute
  CHECK(same_values(host(kc::transpose(dev(x0), {})), kh::transpose(x0, {})));
  struct slice {
    std::vector<index_t> begin, end, strides;
  };
  for (const slice& s : {slice{{0}, {2}, {}}, slice{{1, -1}, {3, 0}, {1, -1}},
                         slice{{2, 4, 4}, {-4, -5, 0}, {-2, -2, -3}}, slice{{0, 1, 0}, {3, 4, 5}, {2, 2, 2}},
                         slice{{5}, {9}, {1}}}) {
    const xt::xarray<float> y = kh::strided_slice(x, s.begin, s.end, s.strides);
    CHECK(same_values(host(kc::strided_slice(dev(x), s.begin, s.end, s.strides)), y));
    const xt::xarray<float> dy = host_array(std::vector<std::size_t>(y.shape().begin(), y.shape().end()), 46);
    CHECK(same_values(host(kc::strided_slice_grad(dev(dy), shape_of({3, 4, 5}), s.begin, s.end, s.strides)),
                      kh::strided_slice_grad(dy, {3, 4, 5}, s.begin, s.end, s.strides)));
  }
  CHECK_THROWS_WITH_AS(kc::strided_slice(dev(x), {0}, {2}, {0}), "strided_slice: strides [0] has 0 at dim 0", error);
  for (int axis : {0, 1, 2, -1}) {
    CAPTURE(axis);
    std::vector<std::size_t> s1 = shape_of({3, 4, 5}), s2 = s1;
    const std::size_t ax = std::size_t(axis < 0 ? axis + 3 : axis);
    s1[ax] = 2;
    s2[ax] = 3;
    const xt::xarray<float> p1 = host_array(s1, 47), p2 = host_array(s2, 48), p3 = host_array(s1, 49);
    const darray d1 = dev(p1), d2 = dev(p2), d3 = dev(p3);
    const xt::xarray<float> joined = kh::concat({p1, p2, p3}, axis);
    CHECK(same_values(host(kc::concat<float>({&d1, &d2, &d3}, axis)), joined));
    const std::vector<xt::xarray<float>> pieces = kh::split(joined, {2, 3, 2}, axis);
    const std::vector<darray> got = kc::split(dev(joined), {2, 3, 2}, axis);
    REQUIRE(got.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(same_values(host(got[i]), pieces[i]));
  }
  const darray a = darray(shape_of({2, 5})), b = darray(shape_of({3, 4}));
  CHECK_THROWS_WITH_AS(kc::concat<float>({&b, &a}, 0),
                       "concat: input 1 is (2, 5), input 0 is (3, 4): the dims other than axis 0 must agree", error);
  CHECK_THROWS_WITH_AS(kc::split(darray(shape_of({4, 6})), {2, 3}, 0),
                       "split: sizes [2, 3] add up to 5, x (4, 6) has extent 4 at axis 0", error);
}

TEST_CASE("softmax and log-softmax pieces along every axis equal the host's") {
  for (const auto& s : {shape_of({4, 5, 6}), shape_of({2, 300}), shape_of({7})}) {
    const xt::xarray<float> x = host_array(s, 50, false, -6, 6), dy = host_array(s, 51, false);
    for (int axis = -1; axis < int(s.size()); ++axis)
      for (bool log : {false, true}) {
        CAPTURE(axis);
        CAPTURE(log);
        const xt::xarray<float> mh = kh::softmax_axis_max(x, axis), sh = kh::softmax_axis_sum(x, axis, mh);
        const darray md = kc::softmax_axis_max(dev(x), axis);
        CHECK(same_values(host(md), mh));
        CHECK(near(host(kc::softmax_axis_sum(dev(x), axis, md)), sh, 1e-5f));
        const xt::xarray<float> yh = kh::softmax_axis_out(x, axis, mh, sh, log);
        CHECK(near(host(kc::softmax_axis_out(dev(x), axis, dev(mh), dev(sh), log)), yh, 1e-5f));
        const xt::xarray<float> ah = kh::softmax_axis_grad_sum(dy, yh, axis, log);
        CHECK(near(host(kc::softmax_axis_grad_sum(dev(dy), dev(yh), axis, log)), ah, 1e-5f));
        CHECK(near(host(kc::softmax_axis_grad(dev(dy), dev(yh), axis, dev(ah), log)),
                   kh::softmax_axis_grad(dy, yh, axis, ah, log), 1e-5f));
      }
    // The whole chain against the host's single-process softmax.
    CHECK(near(host(kc::softmax_axis_out(dev(x), 0, kc::softmax_axis_max(dev(x), 0),
                                         kc::softmax_axis_sum(dev(x), 0, kc::softmax_axis_max(dev(x), 0)), false)),
               kh::softmax(x, 0), 1e-5f));
  }
}

TEST_CASE("sparse softmax cross entropy pieces equal the host's, with the host's label errors") {
  constexpr std::size_t rows = 9, cols = 13;
  const xt::xarray<float> x = host_array(shape_of({rows, cols}), 52, false, -5, 5);
  const xt::xarray<float> dl = host_array(shape_of({rows}), 53, false);
  xt::xarray<std::int32_t> labels = xt::xarray<std::int32_t>::from_shape({rows});
  for (std::size_t i = 0; i < rows; ++i) labels.data()[i] = std::int32_t(i * 5 % 20);  // some out of [4, 8)
  for (index_t first_col : {index_t(0), index_t(4)}) {
    const index_t classes = 20;
    const xt::xarray<std::int64_t> ch = kh::sparse_ce_columns(labels, classes, 3, first_col, cols);
    const cuda::device_array<std::int64_t> cd = kc::sparse_ce_columns(dev_of(labels), classes, 3, first_col, cols);
    CHECK(host_of(cd) == ch);
    const xt::xarray<float> mh = kh::softmax_axis_max(x, 1), th = kh::sparse_ce_terms(x, ch, mh);
    CHECK(near(host(kc::sparse_ce_terms(dev(x), cd, dev(mh))), th, 1e-5f));
    CHECK(near(host(kc::sparse_ce_loss(dev(mh), dev(th))), kh::sparse_ce_loss(mh, th), 1e-6f));
    CHECK(near(host(kc::sparse_ce_grad(dev(dl), dev(x), cd, dev(mh), dev(th))), kh::sparse_ce_grad(dl, x, ch, mh, th),
               1e-5f));
  }
  const xt::xarray<float> bad{1.0f, 2.5f};
  CHECK_THROWS_WITH_AS(kc::sparse_ce_columns(dev(bad), 8, 3, 0, 8),
                       "sparse_softmax_cross_entropy: label 2.5 at row 4 is not an integer", error);
  const xt::xarray<std::int64_t> big{1, 9};
  CHECK_THROWS_WITH_AS(kc::sparse_ce_columns(dev_of(big), 8, 2, 0, 8),
                       "sparse_softmax_cross_entropy: label 9 at row 3 is out of range [0, 8)", error);
}

TEST_CASE("argmax pieces, the tie resolution and conversion equal the host's") {
  xt::xarray<float> x = host_array(shape_of({4, 6, 5}), 54);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(int(x.data()[i]) % 3);  // many ties
  for (int axis = -1; axis < 3; ++axis) {
    CAPTURE(axis);
    const auto [bh, ih] = kh::argmax_local(x, axis, 10);
    auto [bd, id] = kc::argmax_local(dev(x), axis, 10);
    CHECK(same_values(host(bd), bh));
    CHECK(host_of(id) == ih);
    // A "group top" one above every other row's best: those rows give up their index.
    xt::xarray<float> top = bh;
    for (std::size_t o = 0; o < top.size(); o += 2) top.data()[o] += 1.0f;
    xt::xarray<std::int64_t> rh = ih;
    kh::argmax_resolve(rh, bh, top);
    kc::argmax_resolve(id, bd, dev(top));
    CHECK(host_of(id) == rh);
    CHECK(host_of(kc::convert<std::int32_t>(id)) == kh::convert<std::int32_t>(rh));
    CHECK(host_of(kc::convert<float>(id)) == kh::convert<float>(rh));
  }
}

TEST_CASE("one_hot pieces of the depth equal the host's, with the host's index errors") {
  xt::xarray<std::int32_t> idx = xt::xarray<std::int32_t>::from_shape({3, 4});
  for (std::size_t i = 0; i < idx.size(); ++i) idx.data()[i] = std::int32_t(i * 3 % 11) - 1;  // -1 and >= depth too
  for (index_t first : {index_t(0), index_t(4), index_t(8)}) {
    CAPTURE(first);
    CHECK(host(kc::one_hot<float>(dev_of(idx), 9, first, 4, 1.0f, -0.5f)) ==
          kh::one_hot_piece<float>(idx, 9, first, 4, 1.0f, -0.5f));
    const xt::xarray<double> fidx = xt::cast<double>(idx);
    CHECK(host_of(kc::one_hot<double>(dev_of(fidx), 9, first, 4, 2.0, 0.0)) ==
          kh::one_hot_piece<double>(fidx, 9, first, 4, 2.0, 0.0));
  }
  const xt::xarray<float> bad{0.0f, 1.0f, 2.0f, 2.5f};
  CHECK_THROWS_WITH_AS(kc::one_hot<float>(dev(bad), 4, 0, 4, 1.0f, 0.0f),
                       "one_hot: index 2.5 at local position 3 is not an integer", error);
}

TEST_CASE("SGD (plain, momentum, Nesterov, dampening, weight decay) and Adam/AdamW updates equal the host's") {
  using KH = kernels::backend<cpu_device>;
  using KD = kernels::backend<cuda_device>;
  const xt::xarray<float> p0 = host_array(shape_of({1001}), 55, false), g = host_array(shape_of({1001}), 56, false);
  for (float wd : {0.0f, 0.01f}) {
    xt::xarray<float> ph = p0;
    darray pd = dev(p0);
    KH::sgd_update(ph, g, 0.1f, wd);
    KD::sgd_update(pd, dev(g), 0.1f, wd);
    CHECK(near(host(pd), ph, 1e-6f));
  }
  struct sgd_case {
    float mu, damp, wd;
    bool nesterov;
  };
  for (const sgd_case& c : {sgd_case{0.9f, 0.0f, 0.0f, false}, sgd_case{0.8f, 0.1f, 0.01f, false},
                            sgd_case{0.9f, 0.0f, 0.01f, true}}) {
    xt::xarray<float> ph = p0, bh = xt::zeros<float>({1001});
    darray pd = dev(p0), bd = dev(bh);
    for (int t = 0; t < 3; ++t) {
      KH::sgd_momentum_update(ph, g, bh, 0.05f, c.mu, c.damp, c.wd, c.nesterov, t == 0);
      KD::sgd_momentum_update(pd, dev(g), bd, 0.05f, c.mu, c.damp, c.wd, c.nesterov, t == 0);
    }
    CHECK(near(host(pd), ph, 1e-5f));
    CHECK(near(host(bd), bh, 1e-5f));
  }
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    xt::xarray<float> ph = p0, mh = xt::zeros<float>({1001}), vh = xt::zeros<float>({1001});
    darray pd = dev(p0), md = dev(mh), vd = dev(vh);
    for (std::int64_t t = 1; t <= 4; ++t) {
      KH::adam_update(ph, g, mh, vh, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, decoupled, t);
      KD::adam_update(pd, dev(g), md, vd, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, decoupled, t);
    }
    CHECK(near(host(pd), ph, 1e-5f));
    CHECK(near(host(md), mh, 1e-5f));
    CHECK(near(host(vd), vh, 1e-5f));
  }
  darray pd = dev(p0), md = dev(p0), vd = dev(p0);
  CHECK_THROWS_WITH_AS(KD::adam_update(pd, dev(g), md, vd, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 0),
                       "adam_update: the step t counts from 1, got 0", error);
  darray small(shape_of({3}));
  CHECK_THROWS_WITH_AS(KD::sgd_update(pd, small, 0.1f, 0.0f),
                       "sgd_update: the gradient has 3 elements, the parameter 1001", error);
}

struct add_one {
  __device__ void operator()(float& v) const { v += 1.0f; }
};

TEST_CASE("batched updates over many arrays (*_update_many) equal the host's, array by array") {
  using KH = kernels::backend<cpu_device>;
  using KD = kernels::backend<cuda_device>;
  // 130 arrays (two launches: one holds 112 groups of three arrays, 90 of four), sizes
  // 0, 1, odd ones, and one larger than a launch's grid-stride.
  std::vector<std::size_t> sizes;
  for (std::size_t j = 0; j < 129; ++j) sizes.push_back(j == 0 ? 0 : j == 1 ? 1 : 37 * j + j % 5);
  sizes.push_back(std::size_t(1) << 22 | 17);
  struct arrays {
    std::vector<xt::xarray<float>> h;
    std::vector<darray> d;
    std::vector<xt::xarray<float>*> hp;
    std::vector<darray*> dp;
    std::vector<const xt::xarray<float>*> hc;
    std::vector<const darray*> dc;
    arrays(const std::vector<std::size_t>& n, int seed) {
      for (std::size_t j = 0; j < n.size(); ++j) {
        h.push_back(host_array(shape_of({n[j]}), seed + int(j), false));
        d.push_back(dev(h.back()));
      }
      for (std::size_t j = 0; j < n.size(); ++j) {
        hp.push_back(&h[j]);
        dp.push_back(&d[j]);
        hc.push_back(&h[j]);
        dc.push_back(&d[j]);
      }
    }
    bool agree(float tol) const {
      for (std::size_t j = 0; j < h.size(); ++j)
        if (!near(host(d[j]), h[j], tol)) return false;
      return true;
    }
  };
  const arrays g(sizes, 100);
  for (const bool nesterov : {false, true}) {
    arrays p(sizes, 200), a(sizes, 300);
    for (int t = 0; t < 2; ++t) {
      KH::momentum_update_many<float>(p.hp, a.hp, g.hc, 0.2f, 0.9f, 0.01f, nesterov);
      KD::momentum_update_many<float>(p.dp, a.dp, g.dc, 0.2f, 0.9f, 0.01f, nesterov);
    }
    CHECK(p.agree(1e-5f));
    CHECK(a.agree(1e-5f));
  }
  for (const float wd : {0.0f, 0.01f}) {
    arrays p(sizes, 400);
    KH::sgd_update_many<float>(p.hp, g.hc, 0.1f, wd);
    KD::sgd_update_many<float>(p.dp, g.dc, 0.1f, wd);
    CHECK(p.agree(1e-6f));
  }
  {
    arrays p(sizes, 500), b(sizes, 600);
    for (int t = 0; t < 3; ++t) {
      KH::sgd_momentum_update_many<float>(p.hp, g.hc, b.hp, 0.05f, 0.8f, 0.1f, 0.01f, false, t == 0);
      KD::sgd_momentum_update_many<float>(p.dp, g.dc, b.dp, 0.05f, 0.8f, 0.1f, 0.01f, false, t == 0);
    }
    CHECK(p.agree(1e-5f));
    CHECK(b.agree(1e-5f));
  }
  for (const bool decoupled : {false, true}) {
    arrays p(sizes, 700), m(sizes, 800), v(sizes, 900);
    for (auto& x : v.h) x = xt::abs(x);
    for (std::size_t j = 0; j < sizes.size(); ++j) v.d[j] = dev(v.h[j]);
    for (std::int64_t t = 1; t <= 3; ++t) {
      KH::adam_update_many<float>(p.hp, g.hc, m.hp, v.hp, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, decoupled, t);
      KD::adam_update_many<float>(p.dp, g.dc, m.dp, v.dp, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, decoupled, t);
    }
    CHECK(p.agree(1e-5f));
    CHECK(m.agree(1e-5f));
    CHECK(v.agree(1e-5f));
  }
  // The launcher alone over one array a group: 500 groups, three launches.
  {
    std::vector<darray> x;
    std::vector<std::array<float*, 1>> ptrs;
    std::vector<std::int64_t> n;
    x.reserve(500);
    for (std::size_t j = 0; j < 500; ++j) {
      x.push_back(dev(xt::xarray<float>(xt::zeros<float>({10 * j + 3}))));
      ptrs.push_back({x.back().data()});
      n.push_back(std::int64_t(10 * j + 3));
    }
    kc::detail::multi_map<float, 1>("test", std::span<const std::array<float*, 1>>(ptrs),
                                    std::span<const std::int64_t>(n), add_one{});
    bool all_one = true;
    for (const darray& d : x) all_one = all_one && same_values(host(d), xt::xarray<float>(xt::ones<float>({d.size()})));
    CHECK(all_one);
  }
  arrays p(sizes, 1000), a(sizes, 1100);
  std::vector<const darray*> short_list(g.dc.begin(), g.dc.end() - 1);
  CHECK_THROWS_WITH_AS(KD::momentum_update_many<float>(p.dp, a.dp, short_list, 0.2f, 0.9f, 0.0f, false),
                       "momentum_update: 129 gradient arrays for 130 parameters", error);
  std::vector<const darray*> swapped = g.dc;
  std::swap(swapped[2], swapped[3]);
  CHECK_THROWS_WITH_AS(KD::momentum_update_many<float>(p.dp, a.dp, swapped, 0.2f, 0.9f, 0.0f, false),
                       "momentum_update: the gradient of parameter 2 has 114 elements, the parameter 76", error);
}

TEST_CASE("optim::sgd, adam and adamw over bare device tensors take the host tensors' steps") {
  const layout l = layout::replicated(mesh{1}, 1);
  const xt::xarray<float> p0 = host_array(shape_of({300}), 57, false), g0 = host_array(shape_of({300}), 58, false);
  auto host_tensor = [&](const xt::xarray<float>& v) {
    return tensor_on<float, cpu_device>(l, extents{300}, 0, xt::xarray<float>(v));
  };
  auto run = [&](auto& on_host, auto& on_gpu) {
    std::vector<tensor_on<float, cpu_device>> ph{host_tensor(p0)}, gh{host_tensor(g0)};
    std::vector<tensor_on<float, cuda_device>> pd{to_device(ph[0])}, gd{to_device(gh[0])};
    for (int t = 0; t < 3; ++t) {
      on_host.step(ph, gh);
      on_gpu.step(pd, gd);
    }
    CHECK(near(host(pd[0].local()), ph[0].local(), 1e-5f));
  };
  {
    optim::sgd<float> h(0.05f, 0.9f, 0.1f, 0.01f);
    optim::sgd<float, cuda_device> d(0.05f, 0.9f, 0.1f, 0.01f);
    run(h, d);
  }
  {
    optim::sgd<float> h(0.05f, 0.9f, 0.0f, 0.01f, true);
    optim::sgd<float, cuda_device> d(0.05f, 0.9f, 0.0f, 0.01f, true);
    run(h, d);
  }
  {
    optim::adam<float> h(1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f);
    optim::adam<float, cuda_device> d(1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f);
    run(h, d);
  }
  {
    optim::adamw<float> h(1e-2f);
    optim::adamw<float, cuda_device> d(1e-2f);
    run(h, d);
  }
}
}  // namespace cuda_test_kernels
