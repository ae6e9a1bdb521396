// Sharded BatchNorm under mpiexec: the forward against a direct loop over the batch
// (training: the batch's mean and biased variance; evaluation: the running statistics;
// the running statistics after two steps against MindSpore's formula), the backward
// against finite differences of a scalar loss, every candidate strategy on the current
// number of ranks against the one-rank run (with sync), each rank's own batch shard's
// statistics without sync, the internal collectives the definition prices, bad input
// named with the numbers, and nn::batch_norm2d eager and traced.
#include <doctest/doctest.h>

#include "sharded_testing.hpp"

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>
#include <xtensor/xmath.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/core/format.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/trace.hpp>
#include <tessera/ops/batch_norm.hpp>

using namespace tessera;

namespace {

constexpr index_t N = 8, C = 4, H = 3, W = 2;
const extents x_shape{N, C, H, W};
const shape_list shapes{x_shape, extents{C}, extents{C}};

static_assert(ops::batch_norm_supported<float, cpu_device>, "the test links tessera::dnnl");
static_assert(!ops::batch_norm_supported<double, cpu_device>);

// Smooth values, a different offset and spread per channel (so that the statistics differ).
xt::xarray<float> x_values(int seed) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t(N), std::size_t(C), std::size_t(H), std::size_t(W)});
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = (i / std::size_t(H * W)) % std::size_t(C);
    const double wave = std::sin(0.37 * double(i) + 0.9 * double(seed));
    x.data()[i] = float((1.0 + 0.4 * double(c)) * wave + 0.3 * double(c) - 0.4);
  }
  return x;
}

xt::xarray<float> channel_values(double a, double b) {
  xt::xarray<float> v = xt::xarray<float>::from_shape({std::size_t(C)});
  for (index_t c = 0; c < C; ++c) v(c) = float(a + b * double(c));
  return v;
}

// The weights of the test loss sum(w * y): dy = w.
xt::xarray<float> loss_weights() {
  xt::xarray<float> w = xt::xarray<float>::from_shape({std::size_t(N), std::size_t(C), std::size_t(H), std::size_t(W)});
  for (std::size_t i = 0; i < w.size(); ++i) w.data()[i] = float(std::cos(0.53 * double(i) + 0.2));
  return w;
}

// ---- the reference: a direct loop in double ---------------------------------------

struct stats {
  std::vector<double> mean, var;  // biased variance
};

// The mean and biased variance of each channel of x (N', C, H, W) over (N', H, W).
stats batch_stats(const xt::xarray<double>& x) {
  const std::size_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  stats s{std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  for (std::size_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < hw; ++k) sum += x.data()[(i * c + ch) * hw + k];
    const double m = sum / double(n * hw);
    double q = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < hw; ++k) {
        const double d = x.data()[(i * c + ch) * hw + k] - m;
        q += d * d;
      }
    s.mean[ch] = m;
    s.var[ch] = q / double(n * hw);
  }
  return s;
}

// y = gamma (x - mean) / sqrt(var + eps) + beta with the given statistics.
xt::xarray<double> normalise(const xt::xarray<double>& x, const xt::xarray<double>& g, const xt::xarray<double>& b,
                             const stats& s, double eps) {
  const std::size_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  xt::xarray<double> y = xt::xarray<double>::from_shape(x.shape());
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t k = 0; k < hw; ++k) {
        const std::size_t at = (i * c + ch) * hw + k;
        y.data()[at] = g(ch) * (x.data()[at] - s.mean[ch]) / std::sqrt(s.var[ch] + eps) + b(ch);
      }
  return y;
}

xt::xarray<double> to_double(const xt::xarray<float>& a) { return xt::cast<double>(a); }

bool close(const xt::xarray<float>& got, const xt::xarray<double>& want, double tol) {
  if (!std::ranges::equal(got.shape(), want.shape())) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got.data()[i]) - want.data()[i]) <= tol * (1.0 + std::abs(want.data()[i])))) return false;
  return true;
}
bool close(const xt::xarray<float>& got, const xt::xarray<float>& want, double tol = 1e-4) {
  return close(got, to_double(want), tol);
}
bool close(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-5) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= tol * (1.0 + std::abs(want[i])))) return false;
  return true;
}

// a[n0 : n0 + nl, c0 : c0 + cl, :, :].
template <class T>
xt::xarray<T> block(const xt::xarray<T>& a, std::size_t n0, std::size_t nl, std::size_t c0, std::size_t cl) {
  const std::size_t c = a.shape()[1], hw = a.shape()[2] * a.shape()[3];
  xt::xarray<T> out = xt::xarray<T>::from_shape({nl, cl, a.shape()[2], a.shape()[3]});
  for (std::size_t i = 0; i < nl; ++i)
    for (std::size_t j = 0; j < cl; ++j)
      for (std::size_t k = 0; k < hw; ++k)
        out.data()[(i * cl + j) * hw + k] = a.data()[((n0 + i) * c + c0 + j) * hw + k];
  return out;
}

// ---- running the operator ---------------------------------------------------------

struct run_result {
  tensor_on<float> y, dx, dgamma, dbeta;
};

run_result run(const ops::batch_norm_op& op, context& ctx, const tensor_on<float>& x, const tensor_on<float>& g,
               const tensor_on<float>& b, const tensor_on<float>& dy) {
  const std::vector<const tensor_on<float>*> in{&x, &g, &b};
  const ops::op_inputs<float> ins(in.data(), in.size());
  tensor_on<float> y = ops::run_forward(op, ins, ctx);
  ops::op_grads<float, cpu_device> gr = ops::run_backward(op, dy, ins, y, ctx);
  return {std::move(y), std::move(*gr[0]), std::move(*gr[1]), std::move(*gr[2])};
}

// The operator on one rank, whole tensors: the oracle of the sharded runs.
struct one_rank {
  any_communicator comm{local_communicator{}};
  context ctx{comm};

  run_result operator()(const ops::batch_norm_op& op, const xt::xarray<float>& x, const xt::xarray<float>& g,
                        const xt::xarray<float>& b, const xt::xarray<float>& dy) {
    const auto on = [](const xt::xarray<float>& a) {
      return testing::host_shard_of(a, layout::replicated(mesh{1}, int(a.dimension())), 0);
    };
    return run(op, ctx, on(x), on(g), on(b), on(dy));
  }
};

ops::batch_norm_op make_op(const strategy& st, bool sync = true) {
  ops::batch_norm_op op;
  op.st = st;
  op.sync = sync;
  return op;
}

const strategy whole{{1, 1, 1, 1}, {1}, {1}};

}  // namespace

TEST_CASE("batch_norm rule: (n, c) device matrix, parameters split by channel, their gradients partial over n") {
  constexpr batch_norm_layouts r = static_batch_norm_rule<strategy{{2, 2, 1, 1}, {2}, {2}}, 8, extents{16, 8, 4, 4}>;
  static_assert(r.dev == mesh{2, 2, 2});
  static_assert(r.x == layout(mesh{2, 2, 2}, {{1}, {2}, {}, {}}));
  static_assert(r.param == layout(mesh{2, 2, 2}, {{2}}));
  static_assert(r.param_grad == layout(mesh{2, 2, 2}, {{2}}).with_partial(1));
  static_assert(r.batch_axis == 1 && r.channel_axis == 2 && r.batch_split == 2 && r.channel_split == 2);
  constexpr batch_norm_layouts d = static_batch_norm_rule<strategy{{8, 1, 1, 1}, {1}, {1}}, 8, extents{16, 8, 4, 4}>;
  static_assert(d.dev == mesh{8, 1});
  static_assert(d.param_grad == layout(mesh{8, 1}, {{1}}).with_partial(0));
  constexpr batch_norm_layouts c = static_batch_norm_rule<strategy{{1, 4, 1, 1}, {4}, {4}}, 4, extents{16, 8, 4, 4}>;
  static_assert(c.param_grad == c.param);  // n = 1: each rank sums its whole batch
  static_assert(ops::operator_definition<ops::batch_norm_op>);

  const ops::batch_norm_op op;
  CHECK(op.output_shape(shapes) == x_shape);
  CHECK(op.attributes() == "eps: 1e-05, momentum: 0.9, sync: true");
  CHECK(op.data_parallel(4, shapes) == strategy{{4, 1, 1, 1}, {1}, {1}});
  const std::vector<strategy> cands = op.candidates(8, shapes);
  // (n, c) with n | 8, c | 4 and n c | 8: (1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1),
  // (4, 2), (8, 1).
  CHECK(cands.size() == 9);
  CHECK(cands.front() == strategy{{8, 1, 1, 1}, {1}, {1}});
  for (const strategy& s : cands) CHECK(op.check(s, 8, shapes).ok());
}

TEST_CASE("batch_norm collectives: 2 C_local over the batch axis with sync in training, none otherwise") {
  const ops::batch_norm_op op;
  const std::vector<internal_collective> c = op.collectives(strategy{{2, 2, 1, 1}, {2}, {2}}, 8, shapes);
  REQUIRE(c.size() == 2);  // the batch statistics forward, the gradient sums backward
  for (const internal_collective& k : c) {
    CHECK(k.kind == "AllReduce");
    CHECK(k.dev == mesh{2, 2, 2});
    CHECK(k.axes == axis_list{1});
    CHECK(k.elements == 2 * (C / 2));
  }
  CHECK(!c[0].backward);
  CHECK(c[1].backward);
  CHECK(ops::collectives_of(op, strategy{{2, 2, 1, 1}, {2}, {2}}, 8, shapes, 4)[0].bytes ==
        cost::all_reduce(2 * (C / 2) * 4, 2));
  CHECK(op.collectives(strategy{{1, 4, 1, 1}, {4}, {4}}, 8, shapes).empty());
  CHECK(make_op({}, false).collectives(strategy{{8, 1, 1, 1}, {1}, {1}}, 8, shapes).empty());
}

TEST_CASE("batch_norm forward: batch statistics in training, running statistics in evaluation") {
  one_rank one;
  const xt::xarray<float> x1 = x_values(1), x2 = x_values(2), g = channel_values(0.5, 0.3),
                          b = channel_values(-0.3, 0.2), dy = loss_weights();
  const ops::batch_norm_op op = make_op(whole);
  const double eps = op.eps, mom = op.momentum;
  const double count = double(N * H * W);

  // Step 1 and 2: y from the batch's statistics; running statistics by MindSpore's rule.
  std::vector<double> rm(C, 0.0), rv(C, 1.0);
  for (const xt::xarray<float>* x : {&x1, &x2}) {
    const stats s = batch_stats(to_double(*x));
    const run_result r = one(op, *x, g, b, dy);
    CHECK(close(r.y.local(), normalise(to_double(*x), to_double(g), to_double(b), s, eps), 1e-5));
    for (index_t c = 0; c < C; ++c) {
      rm[c] = mom * rm[c] + (1 - mom) * s.mean[c];
      rv[c] = mom * rv[c] + (1 - mom) * s.var[c] * count / (count - 1);
    }
  }
  CHECK(op.state->updates.load() == 2);
  CHECK(close(ops::running_mean(op), rm));
  CHECK(close(ops::running_variance(op), rv));

  // Evaluation: the running statistics, which stay as they are.
  op.state->training.store(false);
  const xt::xarray<float> x3 = x_values(3);
  const run_result r = one(op, x3, g, b, dy);
  CHECK(close(r.y.local(), normalise(to_double(x3), to_double(g), to_double(b), stats{rm, rv}, eps), 1e-5));
  CHECK(op.state->updates.load() == 2);
  CHECK(close(ops::running_mean(op), rm));
}

TEST_CASE("batch_norm backward: finite differences of sum(w * y), in training and in evaluation") {
  one_rank one;
  const xt::xarray<float> x = x_values(4), g = channel_values(0.7, -0.2), b = channel_values(0.1, 0.1),
                          w = loss_weights();
  for (bool training : {true, false}) {
    CAPTURE(training);
    const ops::batch_norm_op op = make_op(whole);
    // Running statistics as one training step leaves them (evaluation uses them).
    (void)one(op, x_values(5), g, b, w);
    const std::vector<float> rm = ops::running_mean(op), rv = ops::running_variance(op);
    const stats running{std::vector<double>(rm.begin(), rm.end()), std::vector<double>(rv.begin(), rv.end())};
    op.state->training.store(training);
    const run_result got = one(op, x, g, b, w);

    xt::xarray<double> xd = to_double(x), gd = to_double(g), bd = to_double(b);
    const xt::xarray<double> wd = to_double(w);
    const auto loss = [&] {
      const xt::xarray<double> y = normalise(xd, gd, bd, training ? batch_stats(xd) : running, op.eps);
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += wd.data()[i] * y.data()[i];
      return l;
    };
    const double h = 1e-4;
    const auto numeric = [&](xt::xarray<double>& v) {
      xt::xarray<double> d = xt::xarray<double>::from_shape(v.shape());
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double keep = v.data()[i];
        v.data()[i] = keep + h;
        const double up = loss();
        v.data()[i] = keep - h;
        const double down = loss();
        v.data()[i] = keep;
        d.data()[i] = (up - down) / (2 * h);
      }
      return d;
    };
    CHECK(close(got.dx.local(), numeric(xd), 2e-4));
    CHECK(close(got.dgamma.local(), numeric(gd), 2e-4));
    CHECK(close(got.dbeta.local(), numeric(bd), 2e-4));
  }
}

TEST_CASE("batch_norm backward: the forward's statistics of the same x, computed again for another x") {
  any_communicator comm{local_communicator{}};
  context ctx{comm};
  const auto on = [](const xt::xarray<float>& a) {
    return testing::host_shard_of(a, layout::replicated(mesh{1}, int(a.dimension())), 0);
  };
  const tensor_on<float> x = on(x_values(7)), g = on(channel_values(0.9, 0.1)), b = on(channel_values(0.2, -0.1)),
                         dy = on(loss_weights());
  const ops::batch_norm_op op = make_op(whole);
  const std::vector<const tensor_on<float>*> in{&x, &g, &b};
  const ops::op_inputs<float> ins(in.data(), in.size());
  const tensor_on<float> y = ops::run_forward(op, ins, ctx);
  CHECK(op.state->saved.size() == 1);  // kept by x's shard
  // A copy of x (another shard address): the statistics computed again, the same numbers.
  const tensor_on<float> x_copy = x;
  const std::vector<const tensor_on<float>*> in_copy{&x_copy, &g, &b};
  const ops::op_grads<float, cpu_device> again =
      ops::run_backward(op, dy, ops::op_inputs<float>(in_copy.data(), in_copy.size()), y, ctx);
  CHECK(op.state->saved.size() == 1);
  const ops::op_grads<float, cpu_device> kept = ops::run_backward(op, dy, ins, y, ctx);
  CHECK(op.state->saved.empty());  // taken by the backward of x
  for (int i = 0; i < 3; ++i) CHECK(kept[std::size_t(i)]->local() == again[std::size_t(i)]->local());
  // A forward in evaluation forgets what a training forward of the same shard kept.
  (void)ops::run_forward(op, ins, ctx);
  CHECK(op.state->saved.size() == 1);
  op.state->training.store(false);
  (void)ops::run_forward(op, ins, ctx);
  CHECK(op.state->saved.empty());
}

TEST_CASE("batch_norm: every candidate strategy equals the one-rank run; without sync each rank's own shard") {
  any_communicator world(testing::test_world());
  context ctx(world);
  one_rank one;
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> x = x_values(6), g = channel_values(0.5, 0.25), b = channel_values(-0.2, 0.1),
                          dy = loss_weights();
  const ops::batch_norm_op ref_op = make_op(whole);
  const run_result ref = one(ref_op, x, g, b, dy);
  int cases = 0;
  for (const strategy& st : ref_op.candidates(p, shapes)) {
    CAPTURE(to_string(st));
    const batch_norm_layouts r = make_op(st).rule(p, shapes);
    const extents off = local_offset(r.x, x_shape, me);
    const std::size_t n0 = std::size_t(off[0]), nl = std::size_t(N / r.batch_split);
    const std::size_t c0 = std::size_t(off[1]), cl = std::size_t(C / r.channel_split);

    // With sync, from the rule's layouts and from replicated ones: the one-rank values.
    for (bool in_rule_layout : {true, false}) {
      CAPTURE(in_rule_layout);
      const ops::batch_norm_op op = make_op(st);
      const layout lx = in_rule_layout ? r.x : testing::flat(p, 4);
      const layout lp = in_rule_layout ? r.param : testing::flat(p, 1);
      const run_result got =
          run(op, ctx, testing::host_shard_of(x, lx, me), testing::host_shard_of(g, lp, me),
              testing::host_shard_of(b, lp, me), testing::host_shard_of(dy, testing::flat(p, 4), me));
      CHECK(got.y.layout() == r.x);
      CHECK(got.dx.layout() == r.x);
      CHECK(got.dgamma.layout() == r.param_grad);
      CHECK(got.dbeta.layout() == r.param_grad);
      CHECK(close(testing::gather(got.y, ctx), ref.y.local()));
      CHECK(close(testing::gather(got.dx, ctx), ref.dx.local()));
      CHECK(close(testing::gather(got.dgamma, ctx), ref.dgamma.local()));
      CHECK(close(testing::gather(got.dbeta, ctx), ref.dbeta.local()));
      const std::vector<float> rm = ops::running_mean(op), rv = ops::running_variance(op);
      const std::vector<float> ref_rm = ops::running_mean(ref_op), ref_rv = ops::running_variance(ref_op);
      REQUIRE(rm.size() == cl);
      for (std::size_t j = 0; j < cl; ++j) {
        CHECK(std::abs(rm[j] - ref_rm[c0 + j]) <= 1e-6f);
        CHECK(std::abs(rv[j] - ref_rv[c0 + j]) <= 1e-5f);
      }
      ++cases;
    }

    // Without sync: this rank's batch shard alone, as one rank computes it for that shard.
    const ops::batch_norm_op own = make_op(st, false);
    const run_result got = run(own, ctx, testing::host_shard_of(x, r.x, me), testing::host_shard_of(g, r.param, me),
                               testing::host_shard_of(b, r.param, me), testing::host_shard_of(dy, r.x, me));
    const ops::batch_norm_op shard_op = make_op(whole);
    const run_result shard = one(shard_op, block(x, n0, nl, 0, C), g, b, block(dy, n0, nl, 0, C));
    CHECK(close(got.y.local(), block(shard.y.local(), 0, nl, c0, cl)));
    CHECK(close(got.dx.local(), block(shard.dx.local(), 0, nl, c0, cl)));
    const std::vector<float> own_rm = ops::running_mean(own), own_rv = ops::running_variance(own);
    const std::vector<float> shard_rm = ops::running_mean(shard_op), shard_rv = ops::running_variance(shard_op);
    for (std::size_t j = 0; j < cl; ++j) {
      CHECK(std::abs(got.dgamma.local()(j) - shard.dgamma.local()(c0 + j)) <= 1e-4f);
      CHECK(std::abs(got.dbeta.local()(j) - shard.dbeta.local()(c0 + j)) <= 1e-4f);
      CHECK(std::abs(own_rm[j] - shard_rm[c0 + j]) <= 1e-6f);
      CHECK(std::abs(own_rv[j] - shard_rv[c0 + j]) <= 1e-5f);
    }
    if (r.batch_split > 1) CHECK(!close(got.y.local(), block(ref.y.local(), n0, nl, c0, cl), 1e-6));
    ++cases;
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " batch_norm strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("batch_norm with relu: max(batch norm, 0) and its gradients, on every candidate strategy") {
  any_communicator world(testing::test_world());
  context ctx(world);
  one_rank one;
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> x = x_values(7), g = channel_values(0.6, -0.2), b = channel_values(0.1, 0.15),
                          dy = loss_weights();
  // The reference: the plain operator, then ReLU by hand (dy masked where y <= 0).
  for (bool training : {true, false}) {
    CAPTURE(training);
    ops::batch_norm_op plain = make_op(whole), fused = make_op(whole);
    fused.relu = true;
    (void)one(plain, x_values(8), g, b, dy);  // running statistics for the evaluation
    (void)one(fused, x_values(8), g, b, dy);
    plain.state->training.store(training);
    fused.state->training.store(training);
    const run_result y0 = one(plain, x, g, b, dy);
    xt::xarray<float> masked = dy;
    for (std::size_t i = 0; i < masked.size(); ++i)
      if (!(y0.y.local().data()[i] > 0.0f)) masked.data()[i] = 0.0f;
    const run_result want = one(plain, x, g, b, masked);
    const run_result got = one(fused, x, g, b, dy);
    CHECK(close(got.y.local(), xt::xarray<float>(xt::maximum(y0.y.local(), 0.0f)), 1e-6));
    CHECK(close(got.dx.local(), want.dx.local()));
    CHECK(close(got.dgamma.local(), want.dgamma.local()));
    CHECK(close(got.dbeta.local(), want.dbeta.local()));
  }
  // Sharded, in training: the one-rank fused values.
  ops::batch_norm_op ref_op = make_op(whole);
  ref_op.relu = true;
  const run_result ref = one(ref_op, x, g, b, dy);
  for (const strategy& st : ref_op.candidates(p, shapes)) {
    CAPTURE(to_string(st));
    ops::batch_norm_op op = make_op(st);
    op.relu = true;
    const batch_norm_layouts r = op.rule(p, shapes);
    const run_result got = run(op, ctx, testing::host_shard_of(x, r.x, me), testing::host_shard_of(g, r.param, me),
                               testing::host_shard_of(b, r.param, me), testing::host_shard_of(dy, r.x, me));
    CHECK(close(testing::gather(got.y, ctx), ref.y.local()));
    CHECK(close(testing::gather(got.dx, ctx), ref.dx.local()));
    CHECK(close(testing::gather(got.dgamma, ctx), ref.dgamma.local()));
    CHECK(close(testing::gather(got.dbeta, ctx), ref.dbeta.local()));
  }
}

TEST_CASE("batch_norm: bad input names the operator, the rule and the numbers") {
  const ops::batch_norm_op rank3 = make_op(strategy{{1, 1, 1}, {1}, {1}});
  CHECK_THROWS_WITH_AS(rank3.rule(1, shape_list{extents{8, 4, 3}, extents{4}, extents{4}}),
                       "batch_norm: x must have rank 4 (N, C, H, W), gamma and beta rank 1 (C,): input 0 has rank 3, "
                       "expected 4; strategy ((1, 1, 1), (1,), (1,))",
                       error);
  CHECK_THROWS_WITH_AS(make_op(whole).rule(1, shape_list{x_shape, extents{3}, extents{4}}),
                       "batch_norm: gamma and beta must have one entry per channel of x: input 1 has 3 entries, x has "
                       "4 channels; strategy ((1, 1, 1, 1), (1,), (1,))",
                       error);
  CHECK_THROWS_WITH_AS(make_op(strategy{{1, 1, 2, 1}, {1}, {1}}).rule(2, shapes),
                       "batch_norm: a strategy is ((n, c, 1, 1), (c,), (c,)): height and width whole, gamma and beta "
                       "split as x's channels: input 0, dim 2: split 2, expected 1; "
                       "strategy ((1, 1, 2, 1), (1,), (1,))",
                       error);
  CHECK_THROWS_WITH_AS(make_op(strategy{{1, 2, 1, 1}, {1}, {2}}).rule(2, shapes),
                       "batch_norm: a strategy is ((n, c, 1, 1), (c,), (c,)): height and width whole, gamma and beta "
                       "split as x's channels: input 1, dim 0: split 1, expected 2; "
                       "strategy ((1, 2, 1, 1), (1,), (2,))",
                       error);
  CHECK_THROWS_WITH_AS(make_op(strategy{{3, 1, 1, 1}, {1}, {1}}).rule(3, shapes),
                       "batch_norm: layout: a tensor dim must be divisible by the product of its splits: dim 0 has "
                       "extent 8, split into 3 pieces; strategy ((3, 1, 1, 1), (1,), (1,))",
                       error);

  // The same errors from a run, and from the graph builder.
  one_rank one;
  CHECK_THROWS_WITH_AS(one(make_op(whole), x_values(1), channel_values(1, 0), xt::xarray<float>::from_shape({3}),
                           loss_weights()),
                       "batch_norm: gamma and beta must have one entry per channel of x: input 2 has 3 entries, x has "
                       "4 channels; strategy ((1, 1, 1, 1), (1,), (1,))",
                       error);
  graph::graph_builder gb;
  const graph::value v = gb.input("x", extents{8, 4, 3});
  try {
    (void)gb.batch_norm(v, gb.parameter("g", {4}), gb.parameter("b", {4}));
    FAIL("no error");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("batch_norm: x must have rank 4 (N, C, H, W), gamma and beta rank 1 (C,): "
                                     "input 0 has rank 3, expected 4") != std::string::npos);
  }

  // Another element type compiles, and says at run time that it has no kernels.
  const auto on = [](const xt::xarray<double>& a) {
    return testing::host_shard_of(a, layout::replicated(mesh{1}, int(a.dimension())), 0);
  };
  const tensor_on<double> xd = on(to_double(x_values(1))), gd = on(to_double(channel_values(1, 0)));
  const std::vector<const tensor_on<double>*> in{&xd, &gd, &gd};
  CHECK_THROWS_WITH_AS(ops::run_forward(make_op(whole), ops::op_inputs<double>(in.data(), in.size()), one.ctx),
                       "batch_norm: no batch-norm kernels for this element type on this device (float only: on the "
                       "host of a program that links tessera::dnnl, on the GPU with cuDNN)",
                       error);
}

namespace {
struct bn_net : nn::module<float> {
  nn::batch_norm2d<float> bn{C};
  void visit(nn::visitor<float>& v) override { v.child("bn", bn); }
  template <class V>
  V operator()(V x) {
    return bn(x);
  }
};
}  // namespace

TEST_CASE("nn::batch_norm2d: the operator eagerly (train and eval), and traced with its names and strategy") {
  any_communicator world(testing::test_world());
  context ctx(world);
  one_rank one;
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> x = x_values(7), dy = loss_weights();
  const xt::xarray<float> ones = xt::ones<float>({std::size_t(C)}), zeros = xt::zeros<float>({std::size_t(C)});

  bn_net net;
  net.build(ctx);
  CHECK(net.bn.gamma.name() == "bn.gamma");
  CHECK(testing::gather(net.bn.gamma.data(), ctx) == ones);
  CHECK(testing::gather(net.bn.beta.data(), ctx) == zeros);
  const batch_norm_layouts r = make_op(strategy{{p, 1, 1, 1}, {1}, {1}}).rule(p, shapes);
  CHECK(net.bn.gamma.layout() == r.param);
  // MindSpore's four parameters; the running statistics need no gradient.
  std::vector<std::string> names;
  for (auto& [name, q] : net.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"bn.gamma", "bn.beta", "bn.moving_mean", "bn.moving_variance"});
  CHECK(net.trainable_params() == std::vector<nn::parameter<float>*>{&net.bn.gamma, &net.bn.beta});
  CHECK(net.bn.moving_mean.layout() == r.param);
  CHECK(testing::gather(net.bn.moving_mean.data(), ctx) == zeros);
  CHECK(testing::gather(net.bn.moving_variance.data(), ctx) == ones);

  const ops::batch_norm_op ref_op = make_op(whole);
  const run_result ref = one(ref_op, x, ones, zeros, dy);
  {
    autodiff::tape<float> t(ctx);
    const autodiff::var<float> y = net(t.leaf(testing::host_shard_of(x, r.x, me), false));
    CHECK(close(testing::gather(y.value(), ctx), ref.y.local()));
  }
  const std::vector<float> ref_rm = ops::running_mean(ref_op);
  CHECK(close(net.bn.running_mean(), std::vector<double>(ref_rm.begin(), ref_rm.end())));
  // Evaluation: the running statistics the training step left.
  net.set_train(false);
  CHECK(!net.bn.op().training());
  ref_op.state->training.store(false);
  const xt::xarray<float> x2 = x_values(8);
  const run_result ref_eval = one(ref_op, x2, ones, zeros, dy);
  {
    autodiff::tape<float> t(ctx);
    const autodiff::var<float> y = net(t.leaf(testing::host_shard_of(x2, r.x, me), false));
    CHECK(close(testing::gather(y.value(), ctx), ref_eval.y.local()));
  }
  net.set_train(true);
  CHECK(net.bn.op().training());

  // Traced: one BatchNorm named after the module, its parameters by their dotted names,
  // sharing the module's mode.
  net.bn.shard(strategy{{2, 2, 1, 1}, {2}, {2}});
  nn::mse_loss<float> mse;
  const nn::traced_network tn = nn::trace(net, mse, x_shape, x_shape);
  const graph::traced_graph& gr = tn.graph;
  const graph::node& op_node = gr.at(gr.find("bn.batch_norm"));
  CHECK(op_node.op->type() == "BatchNorm");
  CHECK(op_node.user_strategy == strategy{{2, 2, 1, 1}, {2}, {2}});
  CHECK(op_node.shape == x_shape);
  CHECK(gr.at(gr.find("bn.gamma")).kind == graph::node_kind::parameter);
  CHECK(gr.at(gr.find("bn.beta")).shape == extents{C});
  CHECK(gr.parameters().size() == 2);  // the running statistics are the operator's state, not graph inputs
  const ops::batch_norm_op* traced = op_node.op->definition<ops::batch_norm_op>();
  REQUIRE(traced != nullptr);
  CHECK(traced->state == net.bn.op().state);
  net.set_train(false);
  CHECK(!traced->training());
}
