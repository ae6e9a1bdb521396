// Losses composed of sharded operators, under mpiexec: MSELoss and seed 003's
// SoftmaxCrossEntropyExpand (dense and sparse labels) shard like any other composition:
// under every strategy that fits the ranks they give the loss and the gradient of the
// same program on one rank, which are the closed forms' (mean((x - t)^2) and
// 2 (x - t) / n; the mean cross entropy and (softmax - labels) / B), to float rounding.
// The N-rank runs are on the test device (tests/cuda/autodiff.cu: the GPU); the one-rank
// runs stay on the host.
#include <doctest/doctest.h>

#include "device_under_test.hpp"
#include "ops/sharded_testing.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/autodiff/losses.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>

namespace autodiff_test_losses {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;
namespace k = tessera::kernels::cpu;

namespace {

constexpr index_t B = 16, C = 8;

// How close the sharded MSE loss is to the closed form, relative. The GPU's reduction
// kernel adds in another order than the host's (by threads and blocks), so the device
// run takes close()'s 1e-5.
#if TESSERA_TEST_CUDA
constexpr float mse_loss_rel = 1e-5f;
#else
constexpr float mse_loss_rel = 1e-6f;
#endif

xt::xarray<std::int32_t> class_labels() {
  xt::xarray<std::int32_t> t = xt::xarray<std::int32_t>::from_shape({std::size_t(B)});
  for (index_t i = 0; i < B; ++i) t(i) = std::int32_t((i * 5 + 2) % C);
  return t;
}

// The mean expanded cross entropy and d/dlogits, with logits laid out as `lx`, on
// device D.
template <class D>
std::pair<xt::xarray<float>, tensor_on<float, D>> expand_loss(const autodiff::softmax_cross_entropy_expand_op& op,
                                                              const xt::xarray<float>& gx,
                                                              const xt::xarray<float>& labels, const layout& lx,
                                                              context& ctx) {
  const int p = ctx.size(), me = ctx.rank();
  const tensor_on<float, D> t = shard_on<D>(labels, flat(p, int(labels.dimension())), me);
  auto [loss, grads] = autodiff::value_and_grad(
      [&](autodiff::tape<float, D>& tp, const auto& w) {
        return autodiff::softmax_cross_entropy_expand(op, w[0], tp.leaf(t, false));
      },
      std::vector<tensor_on<float, D>>{shard_on<D>(gx, lx, me)}, ctx);
  return {gather(loss, ctx), std::move(grads[0])};
}

}  // namespace

TEST_CASE("mse_loss: every strategy gives the one-rank loss and gradient") {
  any_communicator world(test_world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const int p = world.size(), me = world.rank();
  const extents shape{B, C};
  const xt::xarray<float> gx = smooth_tensor(shape, 1), gt = smooth_tensor(shape, 2);
  const xt::xarray<float> d = gx - gt;
  const float loss_ref = k::reduce_mean(xt::xarray<float>(d * d))();
  const xt::xarray<float> dx_ref = d * (2.0f / float(B * C));
  // The one-rank program, on the host.
  {
    const dist_tensor<float> t = host_shard_of(gt, flat(1, 2), 0);
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float>& tp, const auto& w) {
          return autodiff::mse_loss(autodiff::mse_loss_op::split_as(split_tuple{1, 1}), w[0], tp.leaf(t, false));
        },
        std::vector<dist_tensor<float>>{host_shard_of(gx, flat(1, 2), 0)}, solo);
    CHECK(std::fabs(loss.local()() - loss_ref) <= 1e-6f * loss_ref);
    CHECK(close(grads[0].local(), dx_ref));
  }
  int cases = 0;
  for (const split_tuple& s : split_tuples(shape, p)) {
    CAPTURE(to_string(s));
    const autodiff::mse_loss_op op = autodiff::mse_loss_op::split_as(s);
    const layout lx = op.sub.rule(p, shape_list{shape, shape}).in[0];
    const test_tensor t = shard_of(gt, flat(p, 2), me);
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float, test_device>& tp, const auto& w) {
          return autodiff::mse_loss(op, w[0], tp.leaf(t, false));
        },
        std::vector<test_tensor>{shard_of(gx, lx, me)}, ctx);
    CHECK(std::fabs(gather(loss, ctx)() - loss_ref) <= mse_loss_rel * loss_ref);
    CHECK(grads[0].layout() == lx);
    CHECK(close(gather(grads[0], ctx), dx_ref));
    ++cases;
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " mse_loss strategies checked");
}

TEST_CASE("softmax_cross_entropy_expand: shards like any composition, dense and sparse labels") {
  any_communicator world(test_world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const int p = world.size();
  const xt::xarray<float> gx = smooth_tensor(extents{B, C}, 3) * 2.0f;
  const xt::xarray<std::int32_t> classes = class_labels();
  const xt::xarray<float> sparse = xt::cast<float>(classes);
  const xt::xarray<float> dense = k::one_hot<float>(classes, C);
  // The closed form: the mean softmax cross entropy and (softmax - labels) / B.
  const k::cross_entropy_result<float> ce = k::softmax_cross_entropy(gx, dense);
  const float loss_ref = k::reduce_mean(ce.loss)();
  const xt::xarray<float> dx_ref = ce.grad / float(B);
  int cases = 0;
  for (bool is_sparse : {false, true}) {
    CAPTURE(is_sparse);
    const xt::xarray<float>& labels = is_sparse ? sparse : dense;
    // The same program on one rank, on the host.
    const auto [loss1, grad1] = expand_loss<cpu_device>(
        autodiff::softmax_cross_entropy_expand_op::with_split(1, 1, is_sparse), gx, labels, flat(1, 2), solo);
    CHECK(std::fabs(loss1() - loss_ref) <= 1e-5f * loss_ref);
    CHECK(close(grad1.local(), dx_ref));
    for (const split_tuple& s : split_tuples(extents{B, C}, p)) {
      CAPTURE(to_string(s));
      const auto op = autodiff::softmax_cross_entropy_expand_op::with_split(s.v[0], s.v[1], is_sparse);
      const layout lx = op.max.rule(p, extents{B, C}).in;
      const auto [loss, grad] = expand_loss<test_device>(op, gx, labels, lx, ctx);
      CHECK(std::fabs(loss() - loss1()) <= 1e-5f * loss_ref);
      CHECK(grad.layout() == lx);
      CHECK(close(gather(grad, ctx), grad1.local()));
      ++cases;
    }
  }
  if (world.rank() == 0) MESSAGE(p << " ranks: " << cases << " softmax_cross_entropy_expand strategies checked");
  CHECK(cases > 0);
}
}  // namespace autodiff_test_losses
