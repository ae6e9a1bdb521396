// Tests of train/grad_reducer.hpp under mpiexec (1, 2, 4 and 8 ranks): buckets by
// size in reverse parameter order; reductions started during the backward pass, before
// the first layer's gradient is computed (without overlap, all when it is called); mean
// (the one-rank gradient of the global batch) and sum (times the ranks); gradients reduced without a step;
// gradients held in a form (a kernel's layout, which may differ by rank); parameter
// broadcast from rank 0; data-parallel training equal to one-rank training over 50
// steps; and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>

#include "train_test.hpp"

namespace train_test_grad_reducer {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace train_test;
using reducer_t = train::distributed_grad_reducer<float>;

namespace {

constexpr std::size_t global_rows = 16;

// The one-rank gradients of batch `step` (this process alone).
std::vector<xt::xarray<float>> one_rank_grads(std::int64_t step, std::uint64_t seed) {
  any_communicator one{local_communicator{}};
  context solo(one);
  mlp net;
  net.build(solo, seed);
  nn::cross_entropy_loss<float> ce;
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), solo);
  const auto [x, y] = split_batch(batch(step, global_rows), solo);
  auto [loss, grads] = grad_fn(x, y);
  std::vector<xt::xarray<float>> out;
  for (auto& g : grads) out.push_back(g.local());
  return out;
}

// The gradients of `net` on this rank's rows of batch 2, before any reduction.
auto unreduced_grads(mlp& net, context& ctx) {
  nn::cross_entropy_loss<float> ce;
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), ctx);
  const auto [x, y] = split_batch(batch(2, global_rows), ctx);
  auto [loss, grads] = grad_fn(x, y);
  return std::move(grads);
}

}  // namespace

TEST_CASE("distributed_grad_reducer: buckets in reverse order, by size and replica group") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 1);
  const auto params = net.trainable_params();  // sizes 192, 16, 256, 16, 64, 4 floats
  {
    reducer_t r(params, ctx, {.mean = true, .bucket_bytes = 1});
    const auto b = r.buckets();
    REQUIRE(b.size() == 6);
    for (std::size_t k = 0; k < 6; ++k) {
      CHECK(b[k].params == std::vector<std::size_t>{5 - k});
      CHECK(b[k].group_size == world.size());
    }
  }
  {
    reducer_t r(params, ctx);  // 25 MiB: one bucket
    const auto b = r.buckets();
    REQUIRE(b.size() == 1);
    CHECK(b[0].params == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});
    CHECK(b[0].bytes == (192 + 16 + 256 + 16 + 64 + 4) * sizeof(float));
  }
  {
    reducer_t r(params, ctx, {.mean = true, .bucket_bytes = 300 * sizeof(float)});
    const auto b = r.buckets();
    REQUIRE(b.size() == 3);
    CHECK(b[0].params == std::vector<std::size_t>{5, 4, 3});  // 84 floats; + 256 > 300
    CHECK(b[1].params == std::vector<std::size_t>{2, 1});     // 272
    CHECK(b[2].params == std::vector<std::size_t>{0});
  }
  {
    // seq.2.weight (256 floats) is reduced alone and closes the bucket before it.
    reducer_t r(params, ctx, {.mean = true, .bucket_bytes = 1 << 20, .alone_bytes = 256 * sizeof(float)});
    const auto b = r.buckets();
    REQUIRE(b.size() == 3);
    CHECK(b[0].params == std::vector<std::size_t>{5, 4, 3});
    CHECK(b[1].params == std::vector<std::size_t>{2});
    CHECK(b[2].params == std::vector<std::size_t>{1, 0});
  }
}

TEST_CASE("distributed_grad_reducer: reductions start during the backward pass") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 1);
  nn::cross_entropy_loss<float> ce;
  reducer_t reducer(net.trainable_params(), ctx, {.mean = true, .bucket_bytes = 1});
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), ctx);
  const auto [x, y] = split_batch(batch(0, global_rows), ctx);
  auto [loss, grads] = grad_fn(x, y);
  // The step's events: each bucket starts right after its gradient is handed over,
  // and the last layer's buckets before the first layer's weight gradient exists.
  const auto& ev = reducer.events();
  using kind = reducer_t::event::kind;
  auto position = [&](kind k, std::size_t index) {
    return std::find_if(ev.begin(), ev.end(), [&](const auto& e) { return e.what == k && e.index == index; }) -
           ev.begin();
  };
  const auto first_weight_ready = position(kind::grad_ready, 0);
  REQUIRE(first_weight_ready < std::ptrdiff_t(ev.size()));
  for (std::size_t k = 0; k < 5; ++k) {  // buckets of seq.4.bias ... seq.0.bias
    CAPTURE(k);
    const auto started = position(kind::bucket_started, k);
    REQUIRE(started < std::ptrdiff_t(ev.size()));
    CHECK(started < first_weight_ready);
    CHECK(ev[std::size_t(started)].nodes_left > ev[std::size_t(first_weight_ready)].nodes_left);
  }
  grads = reducer(grads);
  const auto ref = one_rank_grads(0, 1);
  for (std::size_t i = 0; i < grads.size(); ++i) CHECK(max_rel_diff(grads[i].local(), ref[i]) < 1e-4);
}

TEST_CASE("distributed_grad_reducer: mean is the one-rank gradient, sum that times the ranks") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size();
  const auto ref = one_rank_grads(2, 4);
  for (const bool mean : {true, false})
    for (const std::size_t cap : {std::size_t(1), std::size_t(1) << 20})
      for (const bool overlap : {true, false}) {
      CAPTURE(mean);
      CAPTURE(cap);
      CAPTURE(overlap);
      mlp net;
      net.build(ctx, 4);
      nn::cross_entropy_loss<float> ce;
      reducer_t reducer(net.trainable_params(), ctx, {.mean = mean, .bucket_bytes = cap, .overlap = overlap});
      auto grad_fn = train::value_and_grad(
          [&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); }, net.trainable_params(), ctx);
      const auto [x, y] = split_batch(batch(2, global_rows), ctx);
      auto [loss, grads] = grad_fn(x, y);
      CHECK(reducer.events().empty() == !overlap);  // without overlap nothing happens during the pass
      grads = reducer(grads);
      const auto params = net.trainable_params();
      for (std::size_t i = 0; i < grads.size(); ++i) {
        CHECK(grads[i].layout() == params[i]->layout());
        xt::xarray<float> want = ref[i] * float(mean ? 1 : p);
        CHECK(max_rel_diff(grads[i].local(), want) < 1e-4);
      }
    }
}

TEST_CASE("distributed_grad_reducer: gradients computed before it existed are reduced when it is called") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 4);
  auto grads = unreduced_grads(net, ctx);
  reducer_t reducer(net.trainable_params(), ctx, {.mean = true, .bucket_bytes = 1000});
  grads = reducer(grads);
  const auto ref = one_rank_grads(2, 4);
  for (std::size_t i = 0; i < grads.size(); ++i) CHECK(max_rel_diff(grads[i].local(), ref[i]) < 1e-4);
}

namespace {

// A form of the test's own: the shard's elements in reverse order, or, where `reversed`
// is false, as they are (the ranks' kernels may choose different layouts).
class test_form final : public host_form<float> {
 public:
  test_form(std::size_t n, bool reversed) : v_(n), reversed_(reversed) {}
  std::uint32_t kind() const override { return 0x54455354; }
  std::span<float> values() override { return v_; }
  std::span<const float> values() const override { return v_; }
  bool is_permutation() const override { return true; }
  bool same_layout(const host_form<float>& o) const override {
    return o.kind() == kind() && static_cast<const test_form&>(o).reversed_ == reversed_ &&
           o.values().size() == v_.size();
  }
  void to_plain(float* dst) const override {
    if (reversed_) std::reverse_copy(v_.begin(), v_.end(), dst);
    else std::copy(v_.begin(), v_.end(), dst);
  }
  void from_plain(const float* src) override {
    if (reversed_) std::reverse_copy(src, src + v_.size(), v_.begin());
    else std::copy(src, src + v_.size(), v_.begin());
  }
  std::unique_ptr<host_form<float>> empty_like() const override {
    return std::make_unique<test_form>(v_.size(), reversed_);
  }
  std::unique_ptr<host_form<float>> layout_only() const override { return empty_like(); }

 private:
  std::vector<float> v_;
  bool reversed_;
};

}  // namespace

TEST_CASE("distributed_grad_reducer: gradients held in a form are reduced in row-major order and stay in it") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const auto ref = one_rank_grads(2, 4);
  for (const std::size_t cap : {std::size_t(1), std::size_t(1) << 20}) {  // each alone; packed
    CAPTURE(cap);
    mlp net;
    net.build(ctx, 4);
    auto grads = unreduced_grads(net, ctx);
    // Each rank's gradients held only in a form: reversed on even ranks, as they are on
    // odd ones.
    for (auto& g : grads) {
      auto f = std::make_unique<test_form>(g.local().size(), ctx.rank() % 2 == 0);
      f->from_plain(std::as_const(g).local().data());
      g = tensor_on<float>(g.layout(), g.global_shape(), g.rank(), std::move(f));
    }
    reducer_t reducer(net.trainable_params(), ctx, {.mean = true, .bucket_bytes = cap});
    grads = reducer(grads);
    const auto params = net.trainable_params();
    for (std::size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);
      CHECK(grads[i].layout() == params[i]->layout());
      REQUIRE(grads[i].form() != nullptr);
      CHECK(!grads[i].plain_current());
      CHECK(max_rel_diff(std::as_const(grads[i]).local(), ref[i]) < 1e-4);
    }
  }
}

TEST_CASE("broadcast_parameters and parameter_broadcast: every replica gets rank 0's values") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 9);
  const auto params = net.trainable_params();
  std::vector<std::vector<float>> rank0;
  for (auto* q : params) rank0.emplace_back(q->data().data().begin(), q->data().data().end());
  for (auto* q : params)
    for (float& v : q->data().data()) v += float(world.rank());  // replicas drift apart
  reducer_t reducer(params, ctx, {.mean = true, .bucket_bytes = 1 << 20, .parameter_broadcast = true});
  for (std::size_t i = 0; i < params.size(); ++i)
    CHECK(std::equal(rank0[i].begin(), rank0[i].end(), params[i]->data().data().begin()));

  mlp unbuilt;
  CHECK_THROWS_WITH(reducer_t(unbuilt.trainable_params(), ctx, {.mean = true, .bucket_bytes = 1, .parameter_broadcast = true}),
                    "distributed_grad_reducer: parameter_broadcast needs built parameters: parameter '' is not built; "
                    "call build(ctx) on the network first");
}

TEST_CASE("data parallel training equals one-rank training over 50 steps (global batch equal)") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  mlp net, ref;
  net.build(ctx, 21);
  ref.build(solo, 21);
  nn::cross_entropy_loss<float> ce;
  optim::sgd<float> opt(net.trainable_params(), 0.1f, 0.9f);
  optim::sgd<float> opt_ref(ref.trainable_params(), 0.1f, 0.9f);
  reducer_t reducer(opt.parameters(), ctx, {.mean = true, .bucket_bytes = 512});
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), ctx);
  auto grad_ref = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(ref(x), y); },
                                        ref.trainable_params(), solo);
  double worst = 0;
  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    const auto g = batch(step, global_rows);
    const auto [x, y] = split_batch(g, ctx);
    auto [loss, grads] = grad_fn(x, y);
    grads = reducer(grads);
    opt(grads);
    const auto [x1, y1] = split_batch(g, solo);
    auto [loss1, grads1] = grad_ref(x1, y1);
    opt_ref(grads1);
    const float l = train::scalar(loss, ctx), l1 = train::scalar(loss1, solo);
    worst = std::max(worst, std::abs(double(l) - l1) / std::abs(double(l1)));
    if (step == 0) first = l1;
    last = l1;
  }
  CHECK(worst < 1e-5);
  CHECK(last < 0.7f * first);  // it learned
  const auto params = net.trainable_params(), params1 = ref.trainable_params();
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_rel_diff(params[i]->data().local(), params1[i]->data().local()) < 1e-4);
}

TEST_CASE("distributed_grad_reducer: errors") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 1);
  nn::cross_entropy_loss<float> ce;
  reducer_t reducer(net.trainable_params(), ctx, {.mean = true, .bucket_bytes = 1});
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), ctx);
  const auto [x, y] = split_batch(batch(0, global_rows), ctx);
  auto [loss, grads] = grad_fn(x, y);
  if (world.size() > 1) {
    std::vector<dist_tensor<float>> copies = grads;  // not the tensors being reduced in place
    CHECK_THROWS_WITH(reducer(copies), doctest::Contains("is not the one handed over during the step (a copy?)"));
  } else {
    (void)reducer(grads);  // one rank reduces nothing: any copy will do; the step is over
    auto [loss2, grads2] = grad_fn(x, y);
    grads = std::move(grads2);
  }
  CHECK_THROWS_WITH(grad_fn(x, y), doctest::Contains("a new step began before the last step's gradients were collected"));
  std::vector<dist_tensor<float>> few(grads.begin(), grads.begin() + 2);
  CHECK_THROWS_WITH(reducer(few), "distributed_grad_reducer: 2 gradients for 6 parameters");
}
}  // namespace train_test_grad_reducer
