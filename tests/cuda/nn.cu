// nn/ and optim/ on the GPU: MNIST-sized networks built from one seed on the host and
// on the GPU and trained the same steps of SGD with momentum (optim::sgd over the
// parameters) on each: one with flatten, dense, ReLU, dropout, dense, cross entropy;
// one with Dense's fused activations (ReLU, Sigmoid, Tanh), the Sigmoid and Tanh
// layers, a Dense whose output features are split and one whose contraction is split.
// Parameters are drawn on the host and copied, dropout's masks are drawn on the host,
// so the two runs must agree to float rounding at every step: the losses, and every
// parameter at the end. On 2 ranks the batch is split and the gradients' partial sums
// go through MPI with staging in host memory. Built into test_cuda_train (train.cu
// includes it).
#define TESSERA_TEST_CUDA 1
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "device_under_test.hpp"
#include "nn/nn_test.hpp"

namespace {

using namespace tessera;

template <class D>
struct mlp : nn::module<float, D> {
  nn::flatten<float, D> flatten;
  nn::dense<float, D> fc1{784, 64};
  nn::relu<float, D> act;
  nn::dropout<float, D> drop{0.25};
  nn::dense<float, D> fc2{64, 10, "normal", "zeros"};
  void visit(nn::visitor<float, D>& v) override {
    v.child("flatten", flatten);
    v.child("fc1", fc1);
    v.child("act", act);
    v.child("drop", drop);
    v.child("fc2", fc2);
  }
  template <class V>
  V operator()(V x) {
    return fc2(drop(act(fc1(flatten(x)))));
  }
};

// Dense's fused epilogues and backwards (bias and activation in one pass), the
// activation layers, and the model-parallel paths of Dense: fc2's output features split
// over the ranks (its output, Tanh's input and output split by columns), fc3's
// contraction split the same way (ops::matmul's partial sums resolved before its
// activation, no bias).
template <class D>
struct fused_mlp : nn::module<float, D> {
  nn::flatten<float, D> flatten;
  nn::dense<float, D> fc1{784, 64, {}, {}, true, nn::activation::relu};
  nn::dense<float, D> fc2{64, 32, {}, {}, true, nn::activation::sigmoid};
  nn::tanh<float, D> th;
  nn::dense<float, D> fc3{32, 32, {}, {}, false, nn::activation::tanh};
  nn::sigmoid<float, D> sig;
  nn::dense<float, D> fc4{32, 10, "normal", "zeros"};
  void shard(int p) {
    fc2.shard(strategy{{1, 1}, {p, 1}});
    fc3.shard(strategy{{1, p}, {1, p}});
  }
  void visit(nn::visitor<float, D>& v) override {
    v.child("flatten", flatten);
    v.child("fc1", fc1);
    v.child("fc2", fc2);
    v.child("th", th);
    v.child("fc3", fc3);
    v.child("sig", sig);
    v.child("fc4", fc4);
  }
  template <class V>
  V operator()(V x) {
    return fc4(sig(fc3(th(fc2(fc1(flatten(x)))))));
  }
};

constexpr index_t batch = 32;

// This rank's rows of step `s`'s images (batch, 28, 28), values in [0, 1).
dist_tensor<float> images(int step, int p, int rank) {
  dist_tensor<float> x(layout(mesh{p}, {{0}, {}, {}}), extents{batch, 28, 28}, rank);
  x.fill_global([&](const auto& i) {
    const std::uint64_t k = std::uint64_t((i[0] * 28 + i[1]) * 28 + i[2]);
    return float(nn::random_stream(std::uint64_t(step) + 1).uniform01(k));
  });
  return x;
}

dist_tensor<std::int32_t> labels(int step, int p, int rank) {
  dist_tensor<std::int32_t> y(layout(mesh{p}, {{0}}), extents{batch}, rank);
  y.fill_global([&](const auto& i) { return std::int32_t((i[0] * 7 + step * 3) % 10); });
  return y;
}

template <class D>
tensor_on<float, D> on(const dist_tensor<float>& x) {
  if constexpr (std::is_same_v<D, cpu_device>) return x;
  else return to_device(x);
}

// The global value of `x` on the host.
template <class D>
xt::xarray<float> global_of(const tensor_on<float, D>& x, context& ctx) {
  const tensor_on<float, D> r = redistribute(x, layout::replicated(x.layout().dev, x.ndim()), ctx);
  return storage<float, D>::to_host(r.local());
}

struct run_result {
  std::vector<float> losses;
  std::vector<xt::xarray<float>> params;
};

// `steps` steps of SGD (rate 0.1, momentum 0.9) of network Net on device D over
// communicator `comm`.
template <template <class> class Net, class D, class C>
run_result train_mlp(C& comm, int steps) {
  context ctx(comm);
  const int p = ctx.size();
  Net<D> net;
  if constexpr (requires { net.shard(p); }) net.shard(p);
  net.build(ctx, 7);
  const auto params = net.trainable_params();
  optim::sgd<float, D> opt(params, 0.1f, 0.9f);
  run_result out;
  for (int s = 0; s < steps; ++s) {
    autodiff::tape<float, D> tp(ctx);
    for (std::size_t i = 0; i < params.size(); ++i) params[i]->expect_grad(tp.serial(), int(i));
    const auto x = tp.leaf(on<D>(images(s, p, ctx.rank())), false);
    const auto loss = nn::cross_entropy_loss<float, D>{}(net(x), labels(s, p, ctx.rank()));
    out.losses.push_back(train::scalar(loss.value(), ctx));
    tp.backward(loss);
    // The gradients in the parameters' layouts: the partial sums over the ranks resolved.
    std::vector<tensor_on<float, D>> grads;
    for (nn::parameter<float, D>* q : params)
      grads.push_back(tp.grad(autodiff::var<float, D>{&tp, q->leaf_id(tp.serial())}));
    opt(grads);
    for (nn::parameter<float, D>* q : params) q->unbind();
  }
  for (nn::parameter<float, D>* q : params) out.params.push_back(global_of<D>(q->data(), ctx));
  return out;
}

// The same training through train/: value_and_grad over the parameters, the
// distributed_grad_reducer (buckets started during the backward pass) and the
// optimizer's step over the parameters, as examples/mnist_data_parallel runs it.
template <class D, class C>
run_result train_with_reducer(C& comm, int steps) {
  context ctx(comm);
  const int p = ctx.size();
  mlp<D> net;
  net.build(ctx, 7);
  nn::cross_entropy_loss<float, D> loss_fn;
  optim::sgd<float, D> opt(net.trainable_params(), 0.1f, 0.9f);
  auto forward_fn = [&](auto x, const dist_tensor<std::int32_t>& y) { return loss_fn(net(x), y); };
  auto grad_fn = train::value_and_grad(forward_fn, net.trainable_params(), ctx);
  train::distributed_grad_reducer grad_reducer(opt.parameters(), ctx);
  static_assert(std::is_same_v<decltype(grad_reducer), train::distributed_grad_reducer<float, D>>);
  run_result out;
  for (int s = 0; s < steps; ++s) {
    const tensor_on<float, D> x = on<D>(images(s, p, ctx.rank()));
    auto [loss, grads] = grad_fn(x, labels(s, p, ctx.rank()));
    grads = grad_reducer(grads);
    opt(grads);
    out.losses.push_back(train::scalar(loss, ctx));
  }
  for (nn::parameter<float, D>* q : net.trainable_params()) out.params.push_back(global_of<D>(q->data(), ctx));
  return out;
}

// The GPU run `g` follows the host run `h`: every step's loss and every parameter at
// the end, to 1e-4 (relative); and training moved them (the comparison is not of
// untouched values).
void check_follows(const run_result& g, const run_result& h) {
  REQUIRE(g.losses.size() == h.losses.size());
  for (std::size_t s = 0; s < h.losses.size(); ++s) {
    INFO("step " << s << ": host loss " << h.losses[s] << ", GPU loss " << g.losses[s]);
    CHECK(std::abs(double(g.losses[s]) - double(h.losses[s])) <= 1e-4 * (1 + std::abs(double(h.losses[s]))));
  }
  CHECK(h.losses.back() != h.losses.front());
  REQUIRE(g.params.size() == h.params.size());
  for (std::size_t i = 0; i < h.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(nn_test::close(g.params[i], h.params[i], 1e-4));
  }
}

}  // namespace

TEST_CASE("nn on the GPU: an MLP trained on the device follows the host run") {
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  const int steps = 5;
  check_follows(train_mlp<mlp, cuda_device>(dev, steps), train_mlp<mlp, cpu_device>(host, steps));
}

TEST_CASE("nn on the GPU: Dense's fused activations, Sigmoid, Tanh and model-parallel Dense follow the host") {
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  const int steps = 5;
  check_follows(train_mlp<fused_mlp, cuda_device>(dev, steps), train_mlp<fused_mlp, cpu_device>(host, steps));
}

TEST_CASE("train on the GPU: value_and_grad, the gradient reducer and SGD follow the host run") {
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  const int steps = 5;
  const run_result h = train_with_reducer<cpu_device>(host, steps);
  const run_result g = train_with_reducer<cuda_device>(dev, steps);
  check_follows(g, h);
  // The host run through train/ is the host run of the tape loop above.
  const run_result t = train_mlp<mlp, cpu_device>(host, steps);
  for (std::size_t s = 0; s < h.losses.size(); ++s)
    CHECK(std::abs(double(t.losses[s]) - double(h.losses[s])) <= 1e-5 * (1 + std::abs(double(h.losses[s]))));
}

TEST_CASE("nn on the GPU: parameters are drawn on the host and copied") {
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  context hc(host);
  context dc(dev);
  mlp<cpu_device> a;
  mlp<cuda_device> b;
  a.build(hc, 3);
  b.build(dc, 3);
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CHECK(pa[i].first == pb[i].first);
    const xt::xarray<float> ha = pa[i].second->data().local();
    const xt::xarray<float> hb = storage<float, cuda_device>::to_host(pb[i].second->data().local());
    REQUIRE(ha.size() == hb.size());
    bool same = true;
    for (std::size_t k = 0; k < ha.size(); ++k) same = same && ha.data()[k] == hb.data()[k];
    CHECK(same);
  }
}

TEST_CASE("nn on the GPU: dropout drops what the host drops") {
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  context hc(host);
  context dc(dev);
  const int p = hc.size();
  nn::dropout<float, cpu_device> a(0.5);
  nn::dropout<float, cuda_device> b(0.5);
  a.named("drop", 11);
  b.named("drop", 11);
  const dist_tensor<float> x = images(0, p, hc.rank());
  autodiff::tape<float, cpu_device> ta(hc);
  autodiff::tape<float, cuda_device> tb(dc);
  const auto va = ta.leaf(x, true);
  const auto vb = tb.leaf(to_device(x), true);
  const auto ya = a(va);
  const auto yb = b(vb);
  const xt::xarray<float> ha = ya.value().local();
  const xt::xarray<float> hb = storage<float, cuda_device>::to_host(yb.value().local());
  REQUIRE(ha.size() == hb.size());
  std::size_t zeros = 0;
  bool same = true;
  for (std::size_t k = 0; k < ha.size(); ++k) {
    same = same && ha.data()[k] == hb.data()[k];
    zeros += ha.data()[k] == 0.0f;
  }
  CHECK(same);
  CHECK(zeros > 0);
  CHECK(zeros < ha.size());
}
