// train/ on the GPU, against the same program on the host (FP32 matmuls, TF32 off):
// train::model on a GPU MLP gives the host model's losses step by step, its
// parameters and evaluate's accuracy; the distributed_grad_reducer on the GPU has the
// host's bucket plan (small gradients packed into shared buckets) and returns the host
// reducer's gradients, mean and sum, two steps in a row (the bucket buffers reused);
// model_checkpoint saves the GPU network's parameters as the host would, and a GPU
// training stopped and resumed from its checkpoint (Momentum's state on the GPU) takes
// the uninterrupted training's steps, bit for bit. On 2 ranks
// the batch is split (data parallel) and the buckets are reduced through MPI staged in
// host memory (staged_communicator<mpi_communicator>).
#define TESSERA_TEST_CUDA 1
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "device_under_test.hpp"
#include "nn/nn_test.hpp"
#include "train/train_test.hpp"

namespace {

using namespace tessera;
namespace fs = std::filesystem;

using train_test::batch;
using train_test::batch_t;
using train_test::block;
using train_test::shard;
template <class D>
using mlp = train_test::basic_mlp<D>;

// The global value of `x` on the host.
template <class D>
xt::xarray<float> global_of(const tensor_on<float, D>& x, context& ctx) {
  const tensor_on<float, D> r = redistribute(x, layout::replicated(x.layout().dev, x.ndim()), ctx);
  return storage<float, D>::to_host(r.local());
}

template <class D>
tensor_on<float, D> on(const dist_tensor<float>& x) {
  if constexpr (std::is_same_v<D, cpu_device>) return x;
  else return to_device(x);
}

// Records each step's loss.
struct recorder : train::callback<float> {
  std::vector<double> losses;
  void on_step_end(train::run_context<float>& rc) override { losses.push_back(rc.loss); }
};

// The reducer's bucket size in these tests: the MLP's six gradients (16 to 1024
// bytes) fall into buckets of two, two and one parameters, so that both the packed
// buckets and the in-place one are exercised.
constexpr std::size_t bucket_bytes = 1200;

struct model_result {
  std::vector<double> losses;
  std::vector<xt::xarray<float>> params;
  train::eval_result eval;
  std::vector<std::vector<std::size_t>> buckets;
};

// train::model on device D over communicator `comm`: 2 epochs of 6 batches of 32
// global samples, SGD with momentum, then evaluate on 4 other batches.
template <class D, class C>
model_result run_model(C& comm) {
  context ctx(comm);
  const int p = ctx.size(), r = ctx.rank();
  mlp<D> net;
  net.build(ctx, 3);
  nn::cross_entropy_loss<float, D> loss_fn;
  optim::sgd<float, D> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model model(net, loss_fn, opt, ctx, {.bucket_bytes = bucket_bytes});
  static_assert(std::is_same_v<typename decltype(model)::device_type, D>);
  auto data = shard(6, 32, r, p);
  recorder rec;
  model.train(2, data, {&rec});
  auto test = shard(4, 40, r, p, 100);
  model_result out;
  out.losses = rec.losses;
  out.eval = model.eval(test);
  for (nn::parameter<float, D>* q : net.trainable_params()) out.params.push_back(global_of<D>(q->data(), ctx));
  for (const auto& b : model.reducer()->buckets()) out.buckets.push_back(b.params);
  return out;
}

struct reducer_result {
  std::vector<typename train::distributed_grad_reducer<float>::bucket_info> buckets;
  std::vector<xt::xarray<float>> grads;  // step by step, parameter by parameter
};

// Two steps of value_and_grad and the reducer (no update) on device D.
template <class D, class C>
reducer_result reduce_steps(C& comm, bool mean) {
  context ctx(comm);
  const int p = ctx.size(), r = ctx.rank();
  mlp<D> net;
  net.build(ctx, 5);
  nn::cross_entropy_loss<float, D> loss_fn;
  auto forward_fn = [&](auto x, const dist_tensor<std::int32_t>& y) { return loss_fn(net(x), y); };
  auto grad_fn = train::value_and_grad(forward_fn, net.trainable_params(), ctx);
  train::distributed_grad_reducer<float, D> reducer(net.trainable_params(), ctx,
                                                        {.mean = mean, .bucket_bytes = bucket_bytes});
  reducer_result out;
  for (const auto& b : reducer.buckets()) out.buckets.push_back({b.params, b.bytes, b.group_size});
  for (int s = 0; s < 2; ++s) {
    const batch_t g = batch(10 + s, 32);
    const index_t rows = 32;
    const dist_tensor<float> x(layout(mesh{p}, {{0}, {}, {}}), extents{rows, 3, 4}, r, block(g.first, r, p));
    const dist_tensor<std::int32_t> y(layout(mesh{p}, {{0}}), extents{rows}, r, block(g.second, r, p));
    const tensor_on<float, D> xd = on<D>(x);
    auto [loss, grads] = grad_fn(xd, y);
    grads = reducer(grads);
    for (const auto& gr : grads) out.grads.push_back(global_of<D>(gr, ctx));
  }
  return out;
}


}  // namespace

TEST_CASE("train::model on the GPU: the host model's losses, parameters and accuracy") {
  kernels::cuda::set_matmul_precision(kernels::cuda::matmul_precision::fp32);  // no TF32
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  const model_result h = run_model<cpu_device>(host);
  const model_result g = run_model<cuda_device>(dev);
  REQUIRE(h.losses.size() == 12);
  REQUIRE(g.losses.size() == h.losses.size());
  for (std::size_t s = 0; s < h.losses.size(); ++s) {
    INFO("step " << s << ": host loss " << h.losses[s] << ", GPU loss " << g.losses[s]);
    CHECK(std::abs(g.losses[s] - h.losses[s]) <= 1e-4 * (1 + std::abs(h.losses[s])));
  }
  CHECK(h.losses.back() < h.losses.front());  // it learned: the comparison is of moving values
  REQUIRE(g.params.size() == h.params.size());
  for (std::size_t i = 0; i < h.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(nn_test::close(g.params[i], h.params[i], 1e-4));
  }
  CHECK(g.buckets == h.buckets);
  CHECK(g.eval.samples == 160);
  CHECK(g.eval.samples == h.eval.samples);
  CHECK(g.eval.accuracy == h.eval.accuracy);
  CHECK(std::abs(g.eval.loss - h.eval.loss) <= 1e-4 * (1 + std::abs(h.eval.loss)));
}

TEST_CASE("distributed_grad_reducer on the GPU: the host's bucket plan and gradients, packed") {
  kernels::cuda::set_matmul_precision(kernels::cuda::matmul_precision::fp32);
  any_communicator host = mpi_communicator::world();
  any_communicator dev(testing::test_world());
  for (const bool mean : {true, false}) {
    INFO("mean " << mean);
    const reducer_result h = reduce_steps<cpu_device>(host, mean);
    const reducer_result g = reduce_steps<cuda_device>(dev, mean);
    // The plan: the same buckets, members, sizes and groups.
    REQUIRE(g.buckets.size() == h.buckets.size());
    for (std::size_t k = 0; k < h.buckets.size(); ++k) {
      INFO("bucket " << k);
      CHECK(g.buckets[k].params == h.buckets[k].params);
      CHECK(g.buckets[k].bytes == h.buckets[k].bytes);
      CHECK(g.buckets[k].group_size == h.buckets[k].group_size);
    }
    // Small gradients share buckets (the packed path), a bucket of one is reduced in place.
    CHECK(std::any_of(h.buckets.begin(), h.buckets.end(), [](const auto& b) { return b.params.size() > 1; }));
    CHECK(std::any_of(h.buckets.begin(), h.buckets.end(), [](const auto& b) { return b.params.size() == 1; }));
    CHECK(h.buckets.front().group_size == host.size());
    REQUIRE(g.grads.size() == h.grads.size());
    REQUIRE(h.grads.size() == 12);
    for (std::size_t i = 0; i < h.grads.size(); ++i) {
      INFO("step " << i / 6 << " gradient " << i % 6);
      CHECK(nn_test::close(g.grads[i], h.grads[i], 1e-4));
    }
  }
}

TEST_CASE("model_checkpoint on the GPU: the device parameters saved through the host") {
  any_communicator host = mpi_communicator::world();
  // The device world as programs make it: staged through the host handle, which the
  // checkpoint's gathers and writes go through.
  any_communicator dev = device_communicator(host, cuda_device{});
  context ctx(dev);
  context hctx(host);
  const int p = ctx.size(), r = ctx.rank();
  train_test::temp_folder<any_communicator> tmp(host);
  mlp<cuda_device> net;
  nn::cross_entropy_loss<float, cuda_device> loss_fn;
  optim::sgd<float, cuda_device> opt(net.trainable_params(), 0.1f);
  train::model model(net, loss_fn, opt, ctx);
  // Each rank its folder; and rank 0 one whole file, gathered through the host communicator.
  train::model_checkpoint<float> shards("net", tmp.path / ("ckpt_" + std::to_string(r)), ctx,
                                                            {.save_checkpoint_steps = 2, .keep_checkpoint_max = 1});
  train::model_checkpoint<float> whole(
      "whole", tmp.path, ctx, {.save_checkpoint_steps = 3, .keep_checkpoint_max = 1, .integrated_save = true});
  auto data = shard(3, 16, r, p);
  model.train(1, data, {&shards, &whole});
  host.barrier();
  for (const fs::path& file : {tmp.path / "ckpt_0" / "net-1_3.safetensors", tmp.path / "whole-1_3.safetensors"}) {
    INFO(file.string());
    mlp<cpu_device> fresh;
    fresh.build(hctx, 99);
    std::vector<io::param_ref> refs;
    for (auto& [name, q] : fresh.named_parameters()) refs.emplace_back(name, q->data());
    io::load_distributed_checkpoint(file, refs);
    const auto a = net.parameters();
    const auto b = fresh.parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const xt::xarray<float> want = storage<float, cuda_device>::to_host(a[i]->data().local());
      CHECK(std::equal(want.data(), want.data() + want.size(), b[i]->data().local().data()));
    }
  }
}

TEST_CASE("a GPU training stopped and resumed from its checkpoint equals the uninterrupted one") {
  any_communicator host = mpi_communicator::world();
  any_communicator dev = device_communicator(host, cuda_device{});
  context ctx(dev);
  const int p = ctx.size(), r = ctx.rank();
  train_test::temp_folder<any_communicator> tmp(host);
  struct recorder : train::callback<float> {
    std::vector<double> losses;
    std::int64_t stop_after = -1;
    void on_step_end(train::run_context<float>& rc) override {
      losses.push_back(rc.loss);
      if (rc.step == stop_after) rc.request_stop();
    }
  };
  // Momentum's state on the GPU; 2 epochs of 3 steps, a checkpoint every step.
  const auto run = [&](const fs::path& dir, std::int64_t stop_after, bool resume) {
    mlp<cuda_device> net;
    nn::cross_entropy_loss<float, cuda_device> loss_fn;
    optim::momentum<float, cuda_device> opt(net.trainable_params(), 0.1f, 0.9f);
    train::model model(net, loss_fn, opt, ctx);
    if (resume) model.resume_from(io::latest_complete_checkpoint(dir, "net").value());
    recorder rec;
    rec.stop_after = stop_after;
    train::model_checkpoint<float> ckpt("net", dir, ctx, {.keep_checkpoint_max = 2});
    auto data = shard(3, 16, r, p);
    model.train(2, data, {&rec, &ckpt});
    std::vector<xt::xarray<float>> params;
    for (auto* q : net.parameters()) params.push_back(storage<float, cuda_device>::to_host(q->data().local()));
    return std::make_pair(rec.losses, params);
  };
  const auto [whole_losses, whole_params] = run(tmp.path / "whole", -1, false);
  REQUIRE(whole_losses.size() == 6);
  (void)run(tmp.path / "cut", 4, false);
  host.barrier();
  const auto [losses, params] = run(tmp.path / "cut", -1, true);
  REQUIRE(losses.size() == 2);
  CHECK(losses[0] == whole_losses[4]);
  CHECK(losses[1] == whole_losses[5]);
  REQUIRE(params.size() == whole_params.size());
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(params[i] == whole_params[i]);
}

// nn/ and optim/ on the GPU (nn.cu), in this translation unit: nvcc is slow.
namespace nn_on_gpu {
#include "nn.cu"
}
