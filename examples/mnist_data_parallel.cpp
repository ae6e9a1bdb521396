// Seed 002, data parallel: the MNIST MLP (Flatten, Dense 784 -> 512, ReLU, Dense 512 ->
// 512, ReLU, Dense 512 -> 10; normal weights, zero biases) written as modules and
// trained by train::model with SGD(1e-2), CrossEntropyLoss, 32 samples per rank, its
// gradients reduced in buckets during the backward pass. Each rank reads its shard of
// the training files (MnistDataset with num_shards and shard_id) and prints
// `epoch: E step: S, loss is L` every 10 steps (L is the loss of the global batch, the
// same on every rank), then `accuracy: X` on the test files.
//
//   mpiexec -n 8 mnist_data_parallel --data DIR      # DIR: the four idx-ubyte files
//   mpiexec -n 2 mnist_data_parallel --synthetic     # generated digits in the same files
//
// Options: --epochs N (10); --steps N: stop after N steps and print `step time: X ms`,
// the mean step (forward, backward, gradient reduction, update) after 10 warm-up steps;
// --batch N: samples per rank (32); --verify: each rank then trains the same network
// alone on the whole global batches and checks that its losses equal the data-parallel
// ones (the one-rank oracle; the check the tests run); --device cpu|cuda (cpu): where
// the parameters, activations and gradients live (with cuda each rank uses the GPU of
// its node-local rank, round-robin, and device buffers move through the host world);
// --parallel-optimizer: optimizer parallel (MindSpore's enable_parallel_optimizer: the
// gradients go to SGD as the backward pass leaves them, each reduce-scattered into the
// piece of the parameter this rank updates, the pieces then all-gathered);
// --hand-written: seed 002's own loop, value_and_grad, DistributedGradReducer and the
// optimizer, on the network run eagerly (the same losses). Built by nvcc where CMake
// finds it (then --device cuda is available).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/mnist.hpp>
#include <tessera/data/synthetic.hpp>
#include <tessera/data/transforms.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>
#include <tessera/train/data.hpp>
#include <tessera/train/model.hpp>
#include "shared_temp_dir.hpp"
#if defined(__CUDACC__)
#include <tessera/cuda.hpp>
#define MNIST_WITH_CUDA 1
#else
#define MNIST_WITH_CUDA 0
#endif

using namespace tessera;

namespace {

struct options {
  std::string data_dir;
  bool synthetic = false;
  int epochs = 10;
  std::int64_t steps = -1;
  std::int64_t batch = 32;
  bool verify = false;
  std::string device = "cpu";
  bool parallel_optimizer = false;
  bool hand_written = false;
};

// Seed 002's network, its parameters on device D.
template <class D = cpu_device>
struct network : nn::module<float, D> {
  using dense = nn::dense<float, D>;
  using relu = nn::relu<float, D>;
  nn::flatten<float, D> flatten;
  nn::sequential<dense, relu, dense, relu, dense> dense_relu_sequential{
      dense(28 * 28, 512, "normal", "zeros"), relu(), dense(512, 512, "normal", "zeros"), relu(),
      dense(512, 10, "normal", "zeros")};
  void visit(nn::visitor<float, D>& v) override {
    v.child("flatten", flatten);
    v.child("dense_relu_sequential", dense_relu_sequential);
  }
  template <class V>
  V operator()(V x) {
    return dense_relu_sequential(flatten(x));
  }
};

// Generated digits written as MNIST's idx files (data::synthetic_images: each class a
// fixed random pattern plus noise), so that the network has something to learn: 6400
// training and 1000 test images of the same classes.
void write_synthetic(const std::filesystem::path& dir) {
  const std::size_t n_train = 6400, n_test = 1000, pixels = 28 * 28;
  const auto all = data::synthetic_images(n_train + n_test, 28, 28, 1, 10, /*seed=*/1, /*noise=*/96);
  auto part = [&](std::size_t first, std::size_t n, const char* usage) {
    xt::xarray<std::uint8_t> images = xt::xarray<std::uint8_t>::from_shape({n, 28, 28, 1});
    xt::xarray<std::uint8_t> labels = xt::xarray<std::uint8_t>::from_shape({n});
    std::copy_n(all.images.data() + first * pixels, n * pixels, images.data());
    std::copy_n(all.labels.data() + first, n, labels.data());
    data::write_mnist(dir, usage, images, labels);
  };
  part(0, n_train, "train");
  part(n_train, n_test, "test");
}

// The seed's pipeline: shard, rescale to [0, 1], normalize, HWC -> CHW, batch.
data::dataset mnist(const std::filesystem::path& dir, const std::string& usage, std::int64_t shards,
                    std::int64_t shard, std::int64_t batch) {
  return data::mnist_dataset(dir, usage, {.num_shards = shards, .shard_id = shard})
      .map({data::rescale(1.0f / 255, 0), data::normalize({0.1307f}, {0.3081f}), data::hwc2chw()}, "image")
      .batch(batch, true);
}

// This rank's rows of a batch as shards of the global batch.
std::pair<dist_tensor<float>, dist_tensor<std::int32_t>> tensors(const data::row& b, int p, int rank) {
  xt::xarray<float> x = b["image"].get<float>();
  xt::xarray<std::int32_t> y = b["label"].get<std::int32_t>();
  const index_t rows = index_t(x.shape()[0]);
  return {dist_tensor<float>(layout(mesh{p}, {{0}, {}, {}, {}}), extents{rows * p, 1, 28, 28}, rank, std::move(x)),
          dist_tensor<std::int32_t>(layout(mesh{p}, {{0}}), extents{rows * p}, rank, std::move(y))};
}

constexpr std::int64_t warmup = 10;  // steps before the timed ones

// The hand-written loop's log, step limit and step timing as a callback of
// train::model: `epoch: E step: S, loss is L` every 10 steps of an epoch (S from 0),
// every step's loss when `record`, a stop after `steps` steps.
class mnist_log : public train::callback<float> {
 public:
  mnist_log(const options& o, bool print, bool record) : o_(&o), print_(print), record_(record) {}
  void on_step_end(train::run_context<float>& rc) override {
    const std::int64_t i = rc.step_in_epoch - 1, step = rc.step - 1;
    if (step >= warmup) {
      timed_ += rc.step_seconds;
      ++timed_steps_;
    }
    const float l = float(rc.loss);
    if (record_) losses_.push_back(l);
    if (print_ && i % 10 == 0)
      std::printf("epoch: %d step: %lld, loss is %.8g\n", rc.epoch - 1, (long long)i, double(l));
    if (o_->steps >= 0 && rc.step >= o_->steps) rc.request_stop();
  }
  std::vector<float>& losses() { return losses_; }
  double timed() const { return timed_; }
  std::int64_t timed_steps() const { return timed_steps_; }

 private:
  const options* o_;
  bool print_, record_;
  std::vector<float> losses_;
  double timed_ = 0;
  std::int64_t timed_steps_ = 0;
};

void print_step_time(double timed, std::int64_t timed_steps) {
  if (timed_steps > 0) std::printf("step time: %.3f ms\n", 1e3 * timed / double(timed_steps));
  else std::printf("step time: no steps after the %lld warm-up steps\n", (long long)warmup);
}

// What a training gives: every step's loss when `record` (else the printed ones), and
// the accuracy on the test files when asked.
struct outcome {
  std::vector<float> losses;
  train::eval_result test;
};

// Trains the network on device D through train::model on the ranks of ctx, each reading
// shard `shard` of `shards`; with `test`, measures it on the test files (batches of 100
// per rank).
template <class D>
outcome train_mnist(context& ctx, const options& o, const std::filesystem::path& dir, std::int64_t shards,
                    std::int64_t shard, std::int64_t batch, bool print, bool record, bool test) {
  network<D> net;
  net.build(ctx, 1);
  nn::cross_entropy_loss<float, D> loss_fn;
  optim::sgd<float, D> optimizer(net.trainable_params(), 1e-2f);
  if (o.parallel_optimizer) optimizer.enable_parallel_optimizer(ctx, {.threshold_bytes = 0});
  train::model model(net, loss_fn, optimizer, ctx);
  data::dataset data_set = mnist(dir, "train", shards, shard, batch);
  mnist_log log(o, print, record);
  model.train(o.steps == 0 ? 0 : o.epochs, data_set, {&log});
  if (print && o.steps >= 0) print_step_time(log.timed(), log.timed_steps());
  outcome out{std::move(log.losses()), {}};
  if (test) {
    data::dataset test_set = mnist(dir, "test", shards, shard, 100);
    out.test = model.eval(test_set);
  }
  return out;
}

// Seed 002's own loop on the host: value_and_grad over the network run eagerly, the
// DistributedGradReducer (none with optimizer parallel) and the optimizer.
outcome train_by_hand(context& ctx, const options& o, const std::filesystem::path& dir, std::int64_t shards,
                      std::int64_t shard, std::int64_t batch, bool print, bool record) {
  const int p = ctx.size(), me = ctx.rank();
  network<cpu_device> net;
  net.build(ctx, 1);
  nn::cross_entropy_loss<float> loss_fn;
  optim::sgd<float> optimizer(net.trainable_params(), 1e-2f);
  auto forward_fn = [&](auto data, const dist_tensor<std::int32_t>& label) { return loss_fn(net(data), label); };
  auto grad_fn = train::value_and_grad(forward_fn, net.trainable_params(), ctx);
  std::optional<train::distributed_grad_reducer<float>> grad_reducer;
  if (o.parallel_optimizer) optimizer.enable_parallel_optimizer(ctx, {.threshold_bytes = 0});
  else grad_reducer.emplace(optimizer.parameters(), ctx);
  const data::dataset data_set = mnist(dir, "train", shards, shard, batch);
  outcome out;
  std::int64_t step = 0;
  for (int epoch = 0; epoch < o.epochs && (o.steps < 0 || step < o.steps); ++epoch) {
    std::int64_t i = 0;
    for (const data::row& b : data_set.epoch(epoch)) {
      if (o.steps >= 0 && step >= o.steps) break;
      auto [data, label] = tensors(b, p, me);
      auto [loss, grads] = grad_fn(data, label);
      if (grad_reducer) grads = (*grad_reducer)(grads);
      optimizer(grads);
      if (record || i % 10 == 0) {
        const float l = train::scalar(loss, ctx);
        if (record) out.losses.push_back(l);
        if (print && i % 10 == 0) std::printf("epoch: %d step: %lld, loss is %.8g\n", epoch, (long long)i, double(l));
      }
      ++i;
      ++step;
    }
  }
  return out;
}

// One training on device D: through train::model, or seed 002's loop (host only).
template <class D>
outcome train_once(context& ctx, const options& o, const std::filesystem::path& dir, std::int64_t shards,
                   std::int64_t shard, std::int64_t batch, bool print, bool record, bool test) {
  if constexpr (std::is_same_v<D, cpu_device>)
    if (o.hand_written) return train_by_hand(ctx, o, dir, shards, shard, batch, print, record);
  return train_mnist<D>(ctx, o, dir, shards, shard, batch, print, record, test);
}

options parse(int argc, char** argv) {
  options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw error(std::string("mnist_data_parallel: ") + argv[i] + " needs a value");
    return argv[++i];
  };
  auto number = [&](int& i) {
    const std::string flag = argv[i], v = value(i);
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 0)
      throw error("mnist_data_parallel: " + flag + " needs a non-negative number, got '" + v + "'");
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data") o.data_dir = value(i);
    else if (a == "--synthetic") o.synthetic = true;
    else if (a == "--epochs") o.epochs = int(number(i));
    else if (a == "--steps") o.steps = number(i);
    else if (a == "--batch") o.batch = number(i);
    else if (a == "--verify") o.verify = true;
    else if (a == "--device") o.device = value(i);
    else if (a == "--parallel-optimizer") o.parallel_optimizer = true;
    else if (a == "--hand-written") o.hand_written = true;
    else
      throw error("mnist_data_parallel: unknown argument '" + a +
                  "'; usage: mnist_data_parallel (--data DIR | --synthetic) [--epochs N] [--steps N] [--batch N] "
                  "[--verify] [--device cpu|cuda] [--parallel-optimizer] [--hand-written]");
  }
  if (o.device != "cpu" && o.device != "cuda")
    throw error("mnist_data_parallel: unknown device '" + o.device + "' (expected cpu or cuda)");
#if !MNIST_WITH_CUDA
  if (o.device == "cuda")
    throw error("mnist_data_parallel: --device cuda: this build has no CUDA (nvcc was not found)");
#endif
  if (o.synthetic == !o.data_dir.empty())
    throw error("mnist_data_parallel: give either --data DIR (the MNIST idx-ubyte files) or --synthetic");
  if (o.batch < 1) throw error("mnist_data_parallel: --batch must be at least 1");
  if (o.hand_written && o.device != "cpu") throw error("mnist_data_parallel: --hand-written runs on the host only");
  return o;
}

// The example on device D: training, accuracy, and the --verify oracle.
template <class D>
void run(any_communicator& world, const options& o) {
  const int p = world.size(), me = world.rank();
#if MNIST_WITH_CUDA
  if constexpr (std::is_same_v<D, cuda_device>) cuda::select_device(world.node_local().rank());
#endif
  // Rank 0 writes the files into a fresh folder every rank then reads.
  std::optional<examples::shared_temp_dir> synthetic;
  if (o.synthetic) synthetic.emplace(world, "mnist_data_parallel", "tessera-mnist-", write_synthetic);
  const std::filesystem::path dir = o.synthetic ? synthetic->path() : std::filesystem::path(o.data_dir);

  any_communicator comm = device_communicator(world, D{});
  context ctx(comm);
  const outcome got = train_once<D>(ctx, o, dir, p, me, o.batch, true, o.verify, true);
  if (!o.hand_written) std::printf("accuracy: %.4f\n", got.test.accuracy);

  if (o.verify) {
    // The oracle: the same training on this process alone, whole global batches.
    any_communicator one{local_communicator{}}, one_device = device_communicator(one, D{});
    context solo(one_device);
    const std::vector<float> ref = train_once<D>(solo, o, dir, 1, 0, o.batch * p, false, true, false).losses;
    const std::vector<float>& losses = got.losses;
    if (ref.size() != losses.size())
      throw error("mnist_data_parallel: --verify: " + std::to_string(losses.size()) + " data-parallel steps, " +
                  std::to_string(ref.size()) + " steps alone");
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i)
      worst = std::max(worst, std::abs(double(losses[i]) - ref[i]) / std::abs(double(ref[i])));
    if (me == 0)
      std::printf("one-rank training, global batch %lld: %zu losses, largest relative difference %.3g\n",
                  (long long)(o.batch * p), ref.size(), worst);
    if (worst > 1e-5)
      throw error("mnist_data_parallel: the " + std::to_string(p) + "-rank losses differ from the one-rank losses by " +
                  std::to_string(worst) + " (relative), more than 1e-5");
  }
}

}  // namespace

int main(int argc, char** argv) {
  train::retain_freed_memory();  // a training process: keep freed step memory for the next step
#if MNIST_WITH_CUDA
  // Without a GPU, --device cuda exits with 77 before MPI starts (the tests' "skipped").
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--device" && std::string(argv[i + 1]) == "cuda" && !cuda::available()) {
      std::fprintf(stderr, "mnist_data_parallel: --device cuda: no CUDA device\n");
      return 77;
    }
#endif
  return tessera::run(argc, argv, [&](any_communicator& world) {
    const options o = parse(argc, argv);
#if MNIST_WITH_CUDA
    if (o.device == "cuda") return run<cuda_device>(world, o);
#endif
    run<cpu_device>(world, o);
  });
}
