// Seed 004's SemiAutoParallelNet on 8 ranks, written with compile-time layouts:
// x (64, 128) -> fc = MatMul ((1, 1), (1, 2)) -> fc2 = MatMul ((8, 1), (1, 1)) -> ReduceSum
// over the last dim, with 128 x 128 weights. The compiler derives each operator's
// device matrix and layouts, every rank's local shapes, and the redistribution between
// fc's output (columns split 2 ways) and fc2's input (rows split 8 ways) with its price;
// a wrong strategy fails to compile. The network then trains a few steps with an MSE
// loss on the sums, and with --verify every rank also trains it alone and compares.
//
//   mpiexec -n 8 semi_auto_static --verify
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/optim/momentum.hpp>

using namespace tessera;

#ifndef SEMI_AUTO_FC_STRATEGY
#define SEMI_AUTO_FC_STRATEGY {{1, 1}, {1, 2}}
#endif

namespace {

constexpr int devices = 8;
constexpr index_t batch = 64, width = 128;
constexpr extents x_shape{batch, width}, w_shape{width, width};

// ---- everything below is decided by the compiler ----------------------------------
constexpr strategy fc_strategy SEMI_AUTO_FC_STRATEGY;
constexpr strategy fc2_strategy{{8, 1}, {1, 1}};
constexpr const matmul_layouts& fc = static_matmul_rule<fc_strategy, devices>;
constexpr const matmul_layouts& fc2 = static_matmul_rule<fc2_strategy, devices>;

static_assert(fc.dev == mesh{4, 1, 1, 2});  // 4 replicas of a (1, 1, 2) device matrix
static_assert(fc2.dev == mesh{8, 1, 1});
static_assert(local_shape(fc.a, x_shape) == extents{64, 128});  // x whole on every rank
static_assert(local_shape(fc.b, w_shape) == extents{128, 64});  // weight: columns halved
static_assert(local_shape(fc.c, x_shape) == extents{64, 64});   // fc's output: [batch, 64]
static_assert(local_shape(fc2.a, x_shape) == extents{8, 128});  // fc2 wants rows split 8 ways
static_assert(local_shape(fc2.b, w_shape) == extents{128, 128});

// Between fc and fc2: the seed inserts AllGather (columns) + StridedSlice (rows). Both
// layouts written on the device matrices' common refinement (4, 2): a local slice of the
// rows over the 4 replicas (0 bytes), then one AllToAll over the column pairs that turns
// the column split into the minor row split: half of each (16, 64) shard leaves,
// 16 * 64 * 4 / 2 = 2048 bytes per rank, where the AllGather alone receives 16384.
constexpr mesh refined = common_refinement(fc.dev, fc2.dev);
static_assert(refined == mesh{4, 2});
constexpr const plan& fc_to_fc2 = static_plan<refine(fc.c, refined), refine(fc2.a, refined), x_shape, float>;
static_assert(fc_to_fc2.size() == 2);
static_assert(fc_to_fc2[0].kind == step_kind::slice && fc_to_fc2[1].kind == step_kind::all_to_all);
static_assert(fc_to_fc2.bytes_per_rank() == 2048);

using weight_t = dist_tensor<float, fc.b, w_shape>;  // a tensor whose layout is a constant
static_assert(weight_t::static_local_shape() == extents{128, 64});
// ---------------------------------------------------------------------------------

xt::xarray<float> uniform(index_t rows, index_t cols, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.0f, scale);
  xt::xarray<float> a = xt::xarray<float>::from_shape({std::size_t(rows), std::size_t(cols)});
  for (float& v : a) v = u(gen);
  return a;
}

template <class Tensor>
void fill_from(Tensor& t, const xt::xarray<float>& g) {
  t.fill_global([&](const auto& i) { return t.ndim() == 1 ? g(i[0], 0) : g(i[0], i[1]); });
}

// Trains 5 steps; `parallel` selects the 8-device strategies (else all ones, for one
// rank). Returns the losses.
template <class C>
std::vector<float> train_network(C& world, bool parallel, bool print) {
  context ctx(world);
  const int p = world.size(), me = world.rank();
  const ops::matmul_op mm1{parallel ? fc_strategy : strategy{{1, 1}, {1, 1}}};
  const ops::matmul_op mm2{parallel ? fc2_strategy : strategy{{1, 1}, {1, 1}}};
  const ops::reduce_sum_op rsum{parallel ? strategy{{8, 1}} : strategy{{1, 1}}, {-1}, false};
  const ops::sub_op sub{parallel ? strategy{{8}, {8}} : strategy{{1}, {1}}};
  const ops::mul_op mul{parallel ? strategy{{8}, {8}} : strategy{{1}, {1}}};
  const ops::reduce_mean_op mean{parallel ? strategy{{8}} : strategy{{1}}, {}, false};

  const xt::xarray<float> gw = uniform(width, width, 7, 0.001f), gx = uniform(batch, width, 8, 1.0f),
                          gt = uniform(batch, 1, 9, 1.0f);
  std::vector<dist_tensor<float>> params;
  if (parallel) {
    weight_t w(me);  // the static layout: checked by the compiler, no run-time planning
    fill_from(w, gw);
    params.emplace_back(w);
  } else {
    dist_tensor<float> w(mm1.rule(p).b, w_shape, me);
    fill_from(w, gw);
    params.push_back(w);
  }
  dist_tensor<float> w2(mm2.rule(p).b, w_shape, me);
  fill_from(w2, gw);  // the seed gives both weights the same initial values
  params.push_back(w2);
  dist_tensor<float> x(mm1.rule(p).a, x_shape, me), t(layout::replicated(mesh{p}, 1), extents{batch}, me);
  fill_from(x, gx);
  fill_from(t, gt);
  optim::momentum<float> opt(0.005f, 0.0f);  // plain gradient descent

  std::vector<float> losses;
  for (int step = 1; step <= 5; ++step) {
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float>& tp, const auto& w) {
          const auto in = tp.leaf(x, false), target = tp.leaf(t, false);
          const auto h = autodiff::apply(mm2, autodiff::apply(mm1, in, w[0]), w[1]);
          const auto d = autodiff::apply(sub, autodiff::apply(rsum, h), target);
          return autodiff::apply(mean, autodiff::apply(mul, d, d));
        },
        params, ctx);
    opt.step(params, grads);
    const float l = redistribute(loss, layout::replicated(mesh{p}, 0), ctx).local()();
    losses.push_back(l);
    if (print && me == 0) std::cout << "step " << step << ", loss is " << l << "\n";
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  const bool verify = argc > 1 && std::strcmp(argv[1], "--verify") == 0;
  return tessera::run(argc, argv, [&](any_communicator& world) {
    if (world.size() != devices)
      throw error("semi_auto_static: the strategies are for " + std::to_string(devices) +
                  " devices; run it with mpiexec -n 8, not " + std::to_string(world.size()));
    if (world.rank() == 0)
      std::cout << "fc " << to_string(fc_strategy) << " on device matrix " << to_string(fc.dev)
                << ", fc2 " << to_string(fc2_strategy) << " on " << to_string(fc2.dev)
                << "; between them, planned by the compiler:\n"
                << to_string(fc_to_fc2);
    const std::vector<float> losses = train_network(world, true, true);
    if (!(losses.back() < losses.front()))
      throw error("semi_auto_static: the loss did not fall");
    if (!verify) return;
    any_communicator one{local_communicator{}};
    const std::vector<float> alone = train_network(one, false, false);
    double worst = 0;
    for (std::size_t i = 0; i < losses.size(); ++i)
      worst = std::max(worst, std::abs(double(losses[i]) - alone[i]) / std::abs(double(alone[i])));
    if (world.rank() == 0)
      std::cout << "stand-alone on 1 rank: largest relative difference of the losses " << worst << "\n";
    if (worst > 1e-5) throw error("semi_auto_static: 8-rank and stand-alone losses differ by " + std::to_string(worst));
  });
}
