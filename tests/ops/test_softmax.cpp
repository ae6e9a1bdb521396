// Sharded SoftmaxCrossEntropyWithLogits under mpiexec: for every strategy (b, c) that
// fits the ranks, the per-sample loss and the gradient of the logits equal the
// single-process kernel on the global arrays, on every rank of every shard (a rank of
// a class group holds the full loss, not a partial one); bad strategies raise errors
// naming the rule and the numbers; value_and_grad of the mean loss gives the
// single-process gradient.
#include <doctest/doctest.h>

#include "device_under_test.hpp"

#include <cmath>
#include <string>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/softmax.hpp>

namespace ops_test_softmax {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<testing::test_comm>;

constexpr index_t B = 16, C = 8;

// Logits in [-2, 2] with no two rows alike.
xt::xarray<float> logits_global() {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t(B), std::size_t(C)});
  for (index_t i = 0; i < B; ++i)
    for (index_t j = 0; j < C; ++j) x(i, j) = float((i * 7 + j * 5 + 3) % 17 - 8) / 4.0f;
  return x;
}

// One-hot labels: row i is class (3 i + 1) mod C.
xt::xarray<float> labels_global() {
  xt::xarray<float> t = xt::zeros<float>({std::size_t(B), std::size_t(C)});
  for (index_t i = 0; i < B; ++i) t(i, (i * 3 + 1) % C) = 1.0f;
  return t;
}

testing::test_tensor shard_of(const xt::xarray<float>& g, const layout& l, int rank) {
  extents shape;
  shape.ndim = int(g.dimension());
  for (int d = 0; d < shape.ndim; ++d) shape.v[d] = index_t(g.shape()[d]);
  dist_tensor<float> t(l, shape, rank);
  t.fill_global([&](const auto& i) {
    std::size_t lin = 0;
    for (int d = 0; d < shape.ndim; ++d) lin = lin * g.shape()[d] + std::size_t(i[d]);
    return g.data()[lin];
  });
  return testing::to_test_device(t);
}

bool close(float a, float b) { return std::abs(a - b) <= 1e-6f * std::abs(b) + 1e-12f; }

// Every local element of x (not partial) equals the reference at its global index.
bool shard_matches(const testing::test_tensor& x, const xt::xarray<float>& ref) {
  if (x.layout().has_partial()) return false;
  const extents ls = x.local_shape(), off = x.local_offset();
  const std::size_t cols = ls.ndim == 2 ? std::size_t(ls.v[1]) : 1;
  const std::size_t ref_cols = ref.dimension() == 2 ? ref.shape()[1] : 1;
  const xt::xarray<float> mine = testing::host_shard(x);
  for (std::size_t lin = 0; lin < mine.size(); ++lin) {
    const std::size_t i = lin / cols + std::size_t(off.v[0]);
    const std::size_t j = lin % cols + (ls.ndim == 2 ? std::size_t(off.v[1]) : 0);
    if (!close(mine.data()[lin], ref.data()[i * ref_cols + j])) return false;
  }
  return true;
}

std::vector<strategy> strategies(int p) {
  std::vector<strategy> out;
  for (int b = 1; b <= p; ++b)
    for (int c = 1; b * c <= p; ++c)
      if (p % (b * c) == 0 && B % b == 0 && C % c == 0) out.push_back(strategy{{b, c}, {b, c}});
  return out;
}

}  // namespace

TEST_CASE("softmax_cross_entropy rule: (b, c) device matrix, loss split by the batch axis") {
  constexpr cross_entropy_layouts r =
      static_softmax_cross_entropy_rule<strategy{{2, 2}, {2, 2}}, 8, extents{16, 8}>;
  static_assert(r.dev == mesh{2, 2, 2});
  static_assert(r.logits == layout(mesh{2, 2, 2}, {{1}, {2}}));
  static_assert(r.labels == r.logits);
  static_assert(r.out == layout(mesh{2, 2, 2}, {{1}}));
  static_assert(r.shape == extents{16});
  static_assert(r.class_axis == 2 && r.class_split == 2);
  constexpr cross_entropy_layouts d =
      static_softmax_cross_entropy_rule<strategy{{8, 1}, {8, 1}}, 8, extents{16, 8}>;
  static_assert(d.dev == mesh{8, 1});
  static_assert(d.out == layout(mesh{8, 1}, {{0}}));
  CHECK(d.class_split == 1);
}

TEST_CASE("softmax_cross_entropy: every strategy equals the single-process kernel") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> gx = logits_global(), gt = labels_global();
  const k::cross_entropy_result<float> ref = k::softmax_cross_entropy(gx, gt);
  xt::xarray<float> gdy = xt::xarray<float>::from_shape({std::size_t(B)});
  for (index_t i = 0; i < B; ++i) gdy(i) = 0.5f + 0.25f * float(i % 4);
  xt::xarray<float> dx_ref = ref.grad;
  for (index_t i = 0; i < B; ++i)
    for (index_t j = 0; j < C; ++j) dx_ref(i, j) *= gdy(i);
  const layout flat = layout::replicated(mesh{p}, 2);
  const testing::test_tensor dy = shard_of(gdy, layout::replicated(mesh{p}, 1), me);
  int cases = 0;
  for (const strategy& st : strategies(p)) {
    CAPTURE(to_string(st));
    const ops::softmax_cross_entropy_op op{st};
    const cross_entropy_layouts r = op.rule(p, extents{B, C}, extents{B, C});
    for (bool in_rule_layout : {true, false}) {
      CAPTURE(in_rule_layout);
      const testing::test_tensor x = shard_of(gx, in_rule_layout ? r.logits : flat, me);
      const testing::test_tensor t = shard_of(gt, in_rule_layout ? r.labels : flat, me);
      const testing::test_tensor loss = ops::softmax_cross_entropy(op, x, t, ctx);
      CHECK(loss.layout() == r.out);
      CHECK(shard_matches(loss, ref.loss));
      const testing::test_tensor dx = ops::softmax_cross_entropy_backward(op, dy, x, t, ctx);
      CHECK(dx.layout() == r.logits);
      CHECK(shard_matches(dx, dx_ref));
      ++cases;
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " softmax_cross_entropy strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("softmax_cross_entropy: numerically stable for large logits") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> gx = logits_global() * 100.0f + 1000.0f, gt = labels_global();
  const k::cross_entropy_result<float> ref = k::softmax_cross_entropy(gx, gt);
  const ops::softmax_cross_entropy_op op{strategy{{1, p}, {1, p}}};
  const cross_entropy_layouts r = op.rule(p, extents{B, C}, extents{B, C});
  const testing::test_tensor loss =
      ops::softmax_cross_entropy(op, shard_of(gx, r.logits, me), shard_of(gt, r.labels, me), ctx);
  for (float v : testing::host_shard(loss)) CHECK(std::isfinite(v));
  CHECK(shard_matches(loss, ref.loss));
}

TEST_CASE("softmax_cross_entropy: bad strategies and shapes name the rule, the numbers and the strategy") {
  const extents s{16, 8};
  CHECK_THROWS_WITH_AS((ops::softmax_cross_entropy_op{strategy{{2, 4}, {2, 2}}}.rule(8, s, s)),
                       "softmax_cross_entropy: logits and labels must be split alike: dim 1: labels "
                       "split 2 ways, logits 4 ways; strategy ((2, 4), (2, 2))",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_cross_entropy_op{strategy{{2, 4}}}.rule(8, s, s)),
                       "softmax_cross_entropy: operator: a strategy has one split tuple per operator "
                       "input: 1 split tuples for 2 inputs; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_cross_entropy_op{strategy{{3, 1}, {3, 1}}}.rule(8, s, s)),
                       "softmax_cross_entropy: strategy: the product of an input's splits must divide "
                       "the device count: input 0: product of splits 3, device count 8; strategy ((3, "
                       "1), (3, 1))",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_cross_entropy_op{strategy{{2, 4}, {2, 4}}}.rule(8, s, extents{16, 4})),
                       "softmax_cross_entropy: logits and labels must have the same shape: dim 1: "
                       "labels has extent 4, logits 8; strategy ((2, 4), (2, 4))",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_cross_entropy_op{strategy{{2}, {2}}}.rule(8, extents{16}, extents{16})),
                       "softmax_cross_entropy: logits must have rank 2 (batch, classes): input 0 has "
                       "rank 1; strategy ((2,), (2,))",
                       error);
}

TEST_CASE("softmax_cross_entropy: value_and_grad of the mean loss equals the single-process gradient") {
  any_communicator world(testing::test_world());
  context ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> gx = logits_global(), gt = labels_global();
  const k::cross_entropy_result<float> ref = k::softmax_cross_entropy(gx, gt);
  float loss_ref = 0.0f;
  for (index_t i = 0; i < B; ++i) loss_ref += ref.loss(i);
  loss_ref /= float(B);
  const xt::xarray<float> dx_ref = ref.grad / float(B);
  for (const strategy& st : strategies(p)) {
    CAPTURE(to_string(st));
    const ops::softmax_cross_entropy_op op{st};
    const ops::reduce_mean_op mean{strategy{{st.in[0].v[0]}}, {}, false};
    const cross_entropy_layouts r = op.rule(p, extents{B, C}, extents{B, C});
    const testing::test_tensor t = shard_of(gt, r.labels, me);
    const std::vector<testing::test_tensor> params = {shard_of(gx, r.logits, me)};
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float, testing::test_device>& tp, const auto& w) {
          const auto labels = tp.leaf(t, false);
          return autodiff::apply(mean, autodiff::apply(op, w[0], labels));
        },
        params, ctx);
    const testing::test_tensor l = redistribute(loss, layout::replicated(mesh{p}, 0), ctx);
    CHECK(std::abs(testing::host_shard(l)() - loss_ref) <= 1e-6f * loss_ref);
    CHECK(grads[0].layout() == r.logits);
    CHECK(shard_matches(grads[0], dx_ref));
  }
}
}  // namespace ops_test_softmax
