// value_and_grad over sharded operators, under mpiexec: the seed's network (a 32 -> 16
// -> 16 MLP on a batch of 16) with an MSE loss built from small operators gives, under
// data-parallel, model-parallel and the seed's strategies, the loss and the weight
// gradients of a single-process computation, to float rounding.
#include <doctest/doctest.h>

#include "device_under_test.hpp"

#include <cmath>
#include <string>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>

namespace autodiff_test_value_and_grad {  // the file's own scope in its test group's translation unit

using namespace tessera;
using ctx_t = context;

namespace {

constexpr index_t B = 16, IN = 32, HID = 16, OUT = 16;

xt::xarray<float> matrix(index_t rows, index_t cols, int seed) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t(rows), std::size_t(cols)});
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) x(i, j) = float((i * 5 + j * 3 + seed) % 9 - 4) / 8.0f;
  return x;
}

testing::test_tensor shard_of(const xt::xarray<float>& g, const layout& l, int rank) {
  dist_tensor<float> t(l, extents{index_t(g.shape()[0]), index_t(g.shape()[1])}, rank);
  t.fill_global([&](const auto& i) { return g(i[0], i[1]); });
  return testing::to_test_device(t);
}

xt::xarray<float> gather(const testing::test_tensor& x, ctx_t& ctx) {
  return testing::host_shard(redistribute(x, layout::replicated(mesh{ctx.size()}, x.ndim()), ctx));
}

// One strategy per operator of the network.
struct net_strategy {
  std::string name;
  strategy matmul1, relu, matmul2, sub, mul, mean;
};

std::vector<net_strategy> strategies(int p) {
  const int a = p % 2 == 0 ? 2 : 1, b = p / a;
  return {
      {"data parallel", {{p, 1}, {1, 1}}, {{p, 1}}, {{p, 1}, {1, 1}}, {{p, 1}, {p, 1}}, {{p, 1}, {p, 1}}, {{p, 1}}},
      {"hidden units split", {{1, 1}, {1, p}}, {{1, p}}, {{1, p}, {p, 1}}, {{1, 1}, {1, 1}}, {{1, 1}, {1, 1}},
       {{1, 1}}},
      {"the seed's ((2, 4), (4, 1)) pattern", {{a, b}, {b, 1}}, {{a, b}}, {{a, b}, {b, 1}}, {{p, 1}, {p, 1}},
       {{1, p}, {1, p}}, {{1, p}}},
  };
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(x.data()[i] - y.data()[i]) > 1e-5f * (1.0f + std::abs(y.data()[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("value_and_grad of the seed's MLP equals the single-process computation") {
  any_communicator world(testing::test_world());
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> gx = matrix(B, IN, 1), gw = matrix(IN, HID, 2), gw2 = matrix(HID, OUT, 3),
                          gt = matrix(B, OUT, 4);

  // The single-process reference, written out with the kernels.
  namespace cpu = kernels::cpu;
  const xt::xarray<float> z = cpu::matmul(gx, gw), h = cpu::relu(z), y = cpu::matmul(h, gw2);
  const xt::xarray<float> d = cpu::sub(y, gt);
  const float loss_ref = cpu::reduce_mean(cpu::mul(d, d))();
  const xt::xarray<float> dy = d * (2.0f / float(B * OUT));
  const xt::xarray<float> dw2_ref = cpu::matmul(h, dy, true, false);
  const xt::xarray<float> dh = cpu::relu_grad(cpu::matmul(dy, gw2, false, true), z);
  const xt::xarray<float> dw_ref = cpu::matmul(gx, dh, true, false);

  for (const net_strategy& s : strategies(p)) {
    CAPTURE(s.name);
    const ops::matmul_op mm1{s.matmul1}, mm2{s.matmul2};
    const ops::relu_op relu{s.relu};
    const ops::sub_op sub{s.sub};
    const ops::mul_op mul{s.mul};
    const ops::reduce_mean_op mean{s.mean, {}, false};  // over every dim, to a scalar
    // Parameters laid out as their MatMul wants them; data split as the first op wants.
    const testing::test_tensor x = shard_of(gx, mm1.rule(p).a, me);
    const testing::test_tensor t = shard_of(gt, layout::replicated(mesh{p}, 2), me);
    const std::vector<testing::test_tensor> params = {shard_of(gw, mm1.rule(p).b, me),
                                                    shard_of(gw2, mm2.rule(p).b, me)};
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float, testing::test_device>& tp, const auto& w) {
          const auto xin = tp.leaf(x, false), target = tp.leaf(t, false);
          const auto hid = autodiff::apply(relu, autodiff::apply(mm1, xin, w[0]));
          const auto out = autodiff::apply(mm2, hid, w[1]);
          const auto diff = autodiff::apply(sub, out, target);
          return autodiff::apply(mean, autodiff::apply(mul, diff, diff));
        },
        params, ctx);
    const xt::xarray<float> l = gather(loss, ctx);
    CHECK(std::abs(l() - loss_ref) <= 1e-5f * std::abs(loss_ref));
    CHECK(grads[0].layout() == params[0].layout());
    CHECK(grads[1].layout() == params[1].layout());
    CHECK(close(gather(grads[0], ctx), dw_ref));
    CHECK(close(gather(grads[1], ctx), dw2_ref));
  }
}

TEST_CASE("backward needs a scalar loss") {
  any_communicator world(testing::test_world());
  ctx_t ctx(world);
  autodiff::tape<float, testing::test_device> tp(ctx);
  const auto v = tp.leaf(testing::test_tensor(layout::replicated(mesh{world.size()}, 2), extents{2, 2}, world.rank()));
  CHECK_THROWS_WITH_AS(tp.backward(v), "autodiff: backward starts from a scalar loss, got shape (2, 2)", error);
}
}  // namespace autodiff_test_value_and_grad
