// The autodiff wrappers of the sharded operators under mpiexec: for each, the program
// loss = sum(r * f(x, w)) (r a fixed tensor) run with value_and_grad under every
// strategy that fits the ranks gives the loss and the gradients of the same program run
// on one rank (a one-rank communicator, every strategy split 1 way), to float rounding;
// and the one-rank gradients agree with central differences of the loss. The pipelined
// matmuls (matmul_overlapped, matmul_summa) are checked so against their one-rank run.
// The N-rank runs are on the test device (tests/cuda/autodiff.cu: the GPU); the one-rank
// reference and the differences stay on the host.
#include <doctest/doctest.h>

#include "device_under_test.hpp"
#include "ops/sharded_testing.hpp"

#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// One program on device D: given the tape, the parameters and a split tuple s (all 1 on
// one rank), the value whose weighted sum is the loss.
template <class D>
using program = std::function<autodiff::var<float, D>(autodiff::tape<float, D>&,
                                                         const std::vector<autodiff::var<float, D>>&,
                                                         const split_tuple&)>;

// sum(r * y): r (data) is brought to y's layout by Mul, whose strategy is y's split tuple.
template <class D>
autodiff::var<float, D> weighted_sum(autodiff::tape<float, D>& tp, autodiff::var<float, D> y) {
  const tensor_on<float, D>& v = y.value();
  const split_tuple s = to_split_tuple(v.layout());
  const xt::xarray<float> r = smooth_tensor(v.global_shape(), 9);
  const auto rv = tp.leaf(shard_on<D>(r, flat(tp.ctx().size(), v.ndim()), tp.ctx().rank()), false);
  const auto prod = autodiff::apply(ops::mul_op{strategy{s, s}}, y, rv);
  return autodiff::apply(ops::reduce_sum_op{strategy{s}, {}, false}, prod);
}

// The loss and the gradients, gathered to the host.
template <class D>
std::pair<xt::xarray<float>, std::vector<xt::xarray<float>>> run(const program<D>& f,
                                                                 const std::vector<xt::xarray<float>>& params,
                                                                 const split_tuple& s, context& ctx) {
  std::vector<tensor_on<float, D>> ps;
  for (const auto& g : params) ps.push_back(shard_on<D>(g, flat(ctx.size(), int(g.dimension())), ctx.rank()));
  auto [loss, grads] = autodiff::value_and_grad(
      [&](autodiff::tape<float, D>& tp, const auto& w) { return weighted_sum(tp, f(tp, w, s)); }, ps, ctx);
  std::vector<xt::xarray<float>> g;
  for (const auto& d : grads) g.push_back(gather(d, ctx));
  return {gather(loss, ctx), std::move(g)};
}

// The one-rank program's loss alone, on the host, for finite differences.
using host_program = program<cpu_device>;

float loss_of(const host_program& f, const std::vector<xt::xarray<float>>& params, const split_tuple& s,
              context& ctx) {
  autodiff::tape<float> tp(ctx);
  std::vector<autodiff::var<float>> w;
  for (const auto& g : params) w.push_back(tp.leaf(host_shard_of(g, flat(1, int(g.dimension())), 0)));
  return weighted_sum(tp, f(tp, w, s)).value().local()();
}

split_tuple ones(int n) {
  split_tuple s;
  s.n = n;
  for (int d = 0; d < n; ++d) s.v[d] = 1;
  return s;
}

// Runs `f` on one rank (the host) and under every split tuple of `shape` on all ranks
// (the test device); compares.
struct wrapper_check {
  std::string name;
  extents shape;  // the split tuples enumerated
  std::vector<xt::xarray<float>> params;
  program<test_device> sharded;
  host_program single;
};

void check_wrapper(const wrapper_check& w) {
  any_communicator world(test_world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const auto [loss_ref, grads_ref] = run(w.single, w.params, ones(w.shape.ndim), solo);
  // The one-rank gradients are the loss' derivatives: central differences on rank 0.
  if (world.rank() == 0) {
    std::vector<xt::xarray<float>> p = w.params;
    const float h = 1e-2f;
    for (std::size_t i = 0; i < p.size(); ++i)
      for (std::size_t j = 0; j < p[i].size(); ++j) {
        const float keep = p[i].data()[j];
        p[i].data()[j] = keep + h;
        const float up = loss_of(w.single, p, ones(w.shape.ndim), solo);
        p[i].data()[j] = keep - h;
        const float down = loss_of(w.single, p, ones(w.shape.ndim), solo);
        p[i].data()[j] = keep;
        const float fd = (up - down) / (2 * h), g = grads_ref[i].data()[j];
        CAPTURE(w.name);
        CAPTURE(i);
        CAPTURE(j);
        CHECK(std::fabs(fd - g) <= 2e-2f * (1.0f + std::fabs(g)));
      }
  }
  int cases = 0;
  for (const split_tuple& s : split_tuples(w.shape, world.size())) {
    CAPTURE(w.name);
    CAPTURE(to_string(s));
    const auto [loss, grads] = run(w.sharded, w.params, s, ctx);
    CHECK(close(loss, loss_ref));
    REQUIRE(grads.size() == grads_ref.size());
    for (std::size_t i = 0; i < grads.size(); ++i) CHECK(close(grads[i], grads_ref[i]));
    ++cases;
  }
  CHECK(cases > 0);
}

// The same program for both communicators and devices.
#define TESSERA_PROGRAM(...)                          \
  [](auto& tp, const auto& w, const split_tuple& s) { \
    (void)tp;                                         \
    (void)s;                                          \
    __VA_ARGS__                                       \
  }

template <class F>
wrapper_check make(std::string name, extents shape, std::vector<xt::xarray<float>> params, F f) {
  return {std::move(name), shape, std::move(params), program<test_device>(f), host_program(f)};
}

xt::xarray<float> positive(const extents& shape, int seed) { return smooth_tensor(shape, seed) + 3.0f; }

}  // namespace

TEST_CASE("autodiff: div, exp, log, neg, reduce_max, reduce_min") {
  const extents x{8, 4};
  check_wrapper(make("div", x, {smooth_tensor(x, 1), positive(x, 2)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::div_op{strategy{s, s}}, w[0], w[1]);
                     })));
  check_wrapper(make("exp, neg", x, {smooth_tensor(x, 1)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::exp_op{strategy{s}}, autodiff::apply(ops::neg_op{strategy{s}}, w[0]));
                     })));
  check_wrapper(make("log", x, {positive(x, 3)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::log_op{strategy{s}}, w[0]);
                     })));
  check_wrapper(make("reduce_max", x, {smooth_tensor(x, 4)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::reduce_max_op{strategy{s}, {-1}, true}, w[0]);
                     })));
  check_wrapper(make("reduce_min", x, {smooth_tensor(x, 5)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::reduce_min_op{strategy{s}, {0}, false}, w[0]);
                     })));
}

TEST_CASE("autodiff: the pipelined matmuls give MatMul's loss and gradients") {
  // x (8, 6), w (6, 8); s splits (m, k, n): every contraction split, each resolution.
  for (const auto how : {ops::partial_resolution::scatter_rows, ops::partial_resolution::scatter_cols,
                         ops::partial_resolution::all_reduce})
    check_wrapper(make("matmul_overlapped", extents{8, 6, 8}, {smooth_tensor(extents{8, 6}, 1), smooth_tensor(extents{6, 8}, 2)},
                       [how](auto& tp, const auto& w, const split_tuple& s) {
                         (void)tp;
                         const strategy st{split_tuple{s.v[0], s.v[1]}, split_tuple{s.v[1], s.v[2]}};
                         return autodiff::matmul_overlapped(ops::matmul_op{st}, w[0], w[1], how, {3, 50});
                       }));
  // SUMMA: s splits (m, n), the contraction whole (A's is cut in pn panels, B's in pm:
  // k = 8); both operands transposed too.
  check_wrapper(make("matmul_summa", extents{8, 4}, {smooth_tensor(extents{8, 8}, 3), smooth_tensor(extents{8, 4}, 4)},
                     TESSERA_PROGRAM({
                       const strategy st{split_tuple{s.v[0], 1}, split_tuple{1, s.v[1]}};
                       return autodiff::matmul_summa(ops::matmul_op{st}, w[0], w[1], {2, 50});
                     })));
  check_wrapper(make("matmul_summa transposed", extents{8, 4},
                     {smooth_tensor(extents{8, 8}, 5), smooth_tensor(extents{4, 8}, 6)}, TESSERA_PROGRAM({
                       const strategy st{split_tuple{1, s.v[0]}, split_tuple{s.v[1], 1}};
                       return autodiff::matmul_summa(ops::matmul_op{st, true, true}, w[0], w[1]);
                     })));
}

TEST_CASE("autodiff: batch_matmul with a shared weight") {
  // x (4, 8, 6) batched, w (6, 4) shared; s splits (batch, m, k, n).
  check_wrapper(make("batch_matmul", extents{4, 8, 2, 4}, {smooth_tensor(extents{4, 8, 6}, 1), smooth_tensor(extents{6, 4}, 2)},
                     TESSERA_PROGRAM({
                       const strategy st{split_tuple{s.v[0], s.v[1], s.v[2]}, split_tuple{s.v[2], s.v[3]}};
                       return autodiff::apply(ops::batch_matmul_op{st}, w[0], w[1]);
                     })));
}

TEST_CASE("autodiff: softmax and log_softmax along each axis") {
  const extents x{8, 4};
  for (int axis : {0, 1}) {
    CAPTURE(axis);
    check_wrapper(make("softmax", x, {smooth_tensor(x, 1)}, [axis](auto& tp, const auto& w, const split_tuple& s) {
      (void)tp;
      return autodiff::apply(ops::softmax_op{strategy{s}, axis}, w[0]);
    }));
    check_wrapper(make("log_softmax", x, {smooth_tensor(x, 2)}, [axis](auto& tp, const auto& w, const split_tuple& s) {
      (void)tp;
      return autodiff::apply(ops::log_softmax_op{strategy{s}, axis}, w[0]);
    }));
  }
}

TEST_CASE("autodiff: transpose, reshape, flatten, strided_slice, concat") {
  const extents x{4, 2, 8};
  check_wrapper(make("transpose", x, {smooth_tensor(x, 1)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::transpose_op{strategy{s}, dim_list{2, 0, 1}}, w[0]);
                     })));
  check_wrapper(make("reshape", x, {smooth_tensor(x, 2)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::reshape_op{strategy{s}, extents{8, -1}}, w[0]);
                     })));
  check_wrapper(make("flatten", x, {smooth_tensor(x, 3)}, TESSERA_PROGRAM({
                       return autodiff::apply(ops::flatten_op{strategy{s}}, w[0]);
                     })));
  check_wrapper(make("strided_slice", x, {smooth_tensor(x, 4)}, TESSERA_PROGRAM({
                       const ops::strided_slice_op op{strategy{s}, index_list{0, 0, 1}, index_list{4, 2, 8},
                                                      index_list{1, 1, 2}};
                       return autodiff::apply(op, w[0]);
                     })));
  // Concat along dim 1 (unsplit): s's dim 1 is set to 1; the second input feeds twice.
  check_wrapper(make("concat", extents{4, 1, 8}, {smooth_tensor(x, 5), smooth_tensor(extents{4, 3, 8}, 6)},
                     TESSERA_PROGRAM({
                       return autodiff::apply(ops::concat_op{strategy{s, s, s}, 1}, {w[0], w[1], w[1]});
                     })));
}

TEST_CASE("autodiff: one_hot and argmax are constants on the tape") {
  const extents x{8, 4};
  // sum(r * x * one_hot(argmax(x))): the gradient reaches x only at each row's maximum.
  check_wrapper(make("one_hot of argmax", x, {smooth_tensor(x, 1)}, TESSERA_PROGRAM({
                       const auto idx = autodiff::apply(ops::argmax_op{strategy{s}, -1}, w[0]);
                       const auto hot = autodiff::apply(ops::one_hot_op{strategy{s}, 4}, idx);
                       return autodiff::apply(ops::mul_op{strategy{s, s}}, w[0], hot);
                     })));
}
