// Sharded SparseSoftmaxCrossEntropyWithLogits under mpiexec: for every strategy (b, c)
// that fits the ranks, with class labels stored as int32 or as floats, the per-sample
// loss and the gradient of the logits equal the single-process kernel on every rank of
// every shard (a rank of a class group holds the full loss); it equals the one-hot
// form's loss; labels out of range or not integers and bad strategies raise errors
// naming the rule and the numbers; value_and_grad of the mean loss gives the
// single-process gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/softmax.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>
#include "sharded_testing.hpp"

namespace ops_test_sparse_cross_entropy {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<test_comm>;
constexpr index_t B = 16, C = 8;

xt::xarray<std::int32_t> labels_global() {
  xt::xarray<std::int32_t> t = xt::xarray<std::int32_t>::from_shape({std::size_t(B)});
  for (index_t i = 0; i < B; ++i) t(i) = std::int32_t((i * 3 + 1) % C);
  return t;
}

std::vector<strategy> strategies(int p) {
  std::vector<strategy> out;
  for (const split_tuple& s : split_tuples(extents{B, C}, p)) out.push_back(strategy{s, split_tuple{s.v[0]}});
  return out;
}

}  // namespace

TEST_CASE("sparse_softmax_cross_entropy rule: logits (b, c), labels and loss split by the batch axis") {
  constexpr sparse_cross_entropy_layouts r =
      static_sparse_softmax_cross_entropy_rule<strategy{{2, 2}, {2}}, 8, extents{16, 8}, extents{16}>;
  static_assert(r.dev == mesh{2, 2, 2});
  static_assert(r.logits == layout(mesh{2, 2, 2}, {{1}, {2}}));
  static_assert(r.labels == layout(mesh{2, 2, 2}, {{1}}));
  static_assert(r.out == r.labels);
  static_assert(r.class_axis == 2 && r.class_split == 2);
  CHECK(r.shape == extents{16});
}

TEST_CASE("sparse_softmax_cross_entropy: every strategy equals the single-process kernel") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> gx = smooth_tensor(extents{B, C}, 1);
  const xt::xarray<std::int32_t> gt = labels_global();
  const xt::xarray<float> gtf = xt::cast<float>(gt);
  const k::cross_entropy_result<float> ref = k::sparse_softmax_cross_entropy(gx, gt);
  const xt::xarray<float> gdy = smooth_tensor(extents{B}, 2);
  xt::xarray<float> dx_ref = ref.grad;
  for (index_t i = 0; i < B; ++i)
    for (index_t j = 0; j < C; ++j) dx_ref(i, j) *= gdy(i);
  // The one-hot form gives the same loss.
  const k::cross_entropy_result<float> dense = k::softmax_cross_entropy(gx, k::one_hot<float>(gt, C));
  const dev_tensor<float> dy = shard_of(gdy, flat(p, 1), me);
  int cases = 0;
  for (const strategy& st : strategies(p)) {
    CAPTURE(to_string(st));
    const ops::sparse_softmax_cross_entropy_op op{st};
    const sparse_cross_entropy_layouts r = op.rule(p, extents{B, C}, extents{B});
    for (bool in_rule_layout : {true, false}) {
      CAPTURE(in_rule_layout);
      const dev_tensor<float> x = shard_of(gx, in_rule_layout ? r.logits : flat(p, 2), me);
      const dev_tensor<std::int32_t> t = shard_of(gt, in_rule_layout ? r.labels : flat(p, 1), me);
      const dev_tensor<float> loss = ops::sparse_softmax_cross_entropy(op, x, t, ctx);
      CHECK(loss.layout() == r.out);
      CHECK(close(gather(loss, ctx), ref.loss));
      CHECK(close(gather(loss, ctx), dense.loss));
      const dev_tensor<float> dx = ops::sparse_softmax_cross_entropy_backward(op, dy, x, t, ctx);
      CHECK(dx.layout() == r.logits);
      CHECK(close(gather(dx, ctx), dx_ref));
      // Float labels, as a tape carries them.
      const dev_tensor<float> tf = shard_of(gtf, in_rule_layout ? r.labels : flat(p, 1), me);
      CHECK(close(gather(ops::sparse_softmax_cross_entropy(op, x, tf, ctx), ctx), ref.loss));
      CHECK(close(gather(ops::sparse_softmax_cross_entropy_backward(op, dy, x, tf, ctx), ctx), dx_ref));
      ++cases;
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " sparse_softmax_cross_entropy strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("sparse_softmax_cross_entropy: bad labels, strategies and shapes give the rule and the numbers") {
  const extents x{16, 8}, t{16};
  CHECK_THROWS_WITH_AS((ops::sparse_softmax_cross_entropy_op{strategy{{2, 4}, {4}}}.rule(8, x, t)),
                       "sparse_softmax_cross_entropy: labels must be split as the logits' batch dim: labels split 4 "
                       "ways, the logits' batch dim 2 ways; strategy ((2, 4), (4,))",
                       error);
  CHECK_THROWS_WITH_AS((ops::sparse_softmax_cross_entropy_op{strategy{{2, 4}, {2}}}.rule(8, x, extents{8})),
                       "sparse_softmax_cross_entropy: labels must have one entry per row of the logits: labels has 8 "
                       "entries, logits 16 rows; strategy ((2, 4), (2,))",
                       error);
  CHECK_THROWS_WITH_AS((ops::sparse_softmax_cross_entropy_op{strategy{{2, 4}, {2}}}.rule(8, x, x)),
                       "sparse_softmax_cross_entropy: logits must have rank 2 (batch, classes) and labels rank 1 "
                       "(batch): input 1 has rank 2; strategy ((2, 4), (2,))",
                       error);
  CHECK_THROWS_WITH_AS((ops::sparse_softmax_cross_entropy_op{strategy{{2, 4}, {2, 1}}}.rule(8, x, t)),
                       "sparse_softmax_cross_entropy: operator: each split tuple has one entry per dim of its input: "
                       "input 1 has 2 entries, the input has rank 1; strategy ((2, 4), (2, 1))",
                       error);
  CHECK_THROWS_WITH_AS((ops::sparse_softmax_cross_entropy_op{strategy{{2, 4}, {2}}}.rule(8, extents{16, 6}, t)),
                       "sparse_softmax_cross_entropy: layout: a tensor dim must be divisible by the product of its "
                       "splits: dim 1 has extent 6, split into 4 pieces; strategy ((2, 4), (2,))",
                       error);
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const ops::sparse_softmax_cross_entropy_op op{strategy{{1, 1}, {1}}};
  const dev_tensor<float> logits = shard_of(smooth_tensor(extents{4, 5}, 1), flat(p, 2), me);
  CHECK_THROWS_WITH_AS(ops::sparse_softmax_cross_entropy(
                           op, logits, shard_of(xt::xarray<std::int32_t>{0, 1, 2, 7}, flat(p, 1), me), ctx),
                       "sparse_softmax_cross_entropy: label 7 at row 3 is out of range [0, 5)", error);
  CHECK_THROWS_WITH_AS(ops::sparse_softmax_cross_entropy(
                           op, logits, shard_of(xt::xarray<float>{0.0f, 1.0f, 2.5f, 3.0f}, flat(p, 1), me), ctx),
                       "sparse_softmax_cross_entropy: label 2.5 at row 2 is not an integer", error);
}

TEST_CASE("sparse_softmax_cross_entropy: value_and_grad of the mean loss equals the single-process gradient") {
  any_communicator world(test_world());
  context ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> gx = smooth_tensor(extents{B, C}, 3);
  const xt::xarray<std::int32_t> gt = labels_global();
  const k::cross_entropy_result<float> ref = k::sparse_softmax_cross_entropy(gx, gt);
  float loss_ref = 0.0f;
  for (index_t i = 0; i < B; ++i) loss_ref += ref.loss(i);
  loss_ref /= float(B);
  const xt::xarray<float> dx_ref = ref.grad / float(B);
  for (const strategy& st : strategies(p)) {
    CAPTURE(to_string(st));
    const ops::sparse_softmax_cross_entropy_op op{st};
    const ops::reduce_mean_op mean{strategy{{st.in[0].v[0]}}, {}, false};
    const sparse_cross_entropy_layouts r = op.rule(p, extents{B, C}, extents{B});
    const dev_tensor<float> t = shard_of(xt::xarray<float>(xt::cast<float>(gt)), r.labels, me);
    const std::vector<dev_tensor<float>> params = {shard_of(gx, r.logits, me)};
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float, test_device>& tp, const auto& w) {
          return autodiff::apply(mean, autodiff::apply(op, w[0], tp.leaf(t, false)));
        },
        params, ctx);
    CHECK(std::abs(gather(loss, ctx)() - loss_ref) <= 1e-6f * std::abs(loss_ref));
    CHECK(grads[0].layout() == r.logits);
    CHECK(close(gather(grads[0], ctx), dx_ref));
  }
}
}  // namespace ops_test_sparse_cross_entropy
