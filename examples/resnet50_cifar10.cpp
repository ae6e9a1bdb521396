// Seed 001, data parallel: ResNet-50 (bottleneck blocks 3-4-6-3, nn::resnet50) trained
// on CIFAR-10 by train::model with Momentum(0.01, 0.9), the cross entropy of class
// labels and the gradients' mean over the ranks. Each rank reads its shard of the binary
// files (num_shards / shard_id), maps the seed's transforms (RandomCrop 32 with padding
// 4, RandomHorizontalFlip, Resize to --image-size, Rescale 1/255, Normalize, HWC2CHW),
// shuffles with a buffer of 10, batches 32 samples dropping the remainder, and prints
// `epoch: E step: S, loss is L` every step (L the global batch's loss, the same on every
// rank), then `accuracy: X` on the test file.
//
//   mpiexec -n 8 resnet50_cifar10 --data DIR         # DIR: cifar-10-batches-bin
//   mpiexec -n 2 resnet50_cifar10 --synthetic --image-size 32 --steps 5
//
// Options: --epochs N (1); --steps N: stop after N steps and print `step time: X ms`
// (the mean step after the first); --batch N: samples per rank (32); --image-size S
// (224, the seed's Resize; 32 keeps CIFAR's size); --parallel data|semi_auto|auto
// (data: seed 001; semi_auto: seed 003's MatMul().shard(((1, 1), (1, 2))) on the final
// Dense, the rest data parallel; auto: seed 003's auto_parallel, the dynamic-programming
// search over the network and the loss SoftmaxCrossEntropyExpand(sparse=True), whose
// small operators are searched too); --verify: each
// rank then trains the same network alone on the whole global batches, checks that the
// first step's loss (the forward pass, batch norm's statistics over the split batch
// included) equals the parallel one to 1e-4 and prints every step's pair (the one-rank
// oracle; the random crop, the flip and the shuffle are left out, since a shard draws
// them apart from the whole dataset). Later steps drift apart at the small batches the
// tests use: the first updates raise the loss, and batch norm over a few 1x1 maps
// magnifies float rounding (tests/train/test_resnet.cpp checks training itself).
// --save-checkpoint DIR: at the end of the training each rank saves its shards
// (ModelCheckpoint, integrated_save off: DIR/rank_R/resnet50-E_S.safetensors) and rank
// 0 prints `checkpoint: DIR/resnet50-E_S.safetensors`; --load-checkpoint FILE: that name
// (or a whole checkpoint) loads into the network before training, whatever strategy
// and rank count saved it (seed 003's per-rank checkpoints; batch norm's running
// statistics are parameters, so `--steps 0` evaluates the saved network).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/data/cifar10.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/synthetic.hpp>
#include <tessera/data/transforms.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/data.hpp>
#include <tessera/train/model.hpp>
#include "shared_temp_dir.hpp"

using namespace tessera;

namespace {

struct options {
  std::string data_dir;
  bool synthetic = false;
  int epochs = 1;
  std::int64_t steps = -1;
  std::int64_t batch = 32;
  std::int64_t image_size = 224;
  std::string parallel = "data";
  bool verify = false;
  std::string save_checkpoint, load_checkpoint;
};

void write_synthetic(const std::filesystem::path& dir) {
  const std::size_t n_train = 640, n_test = 100, pixels = 32 * 32 * 3;
  const auto all = data::synthetic_images(n_train + n_test, 32, 32, 3, 10, /*seed=*/1, /*noise=*/64);
  auto part = [&](std::size_t first, std::size_t n, const char* usage) {
    xt::xarray<std::uint8_t> images = xt::xarray<std::uint8_t>::from_shape({n, 32, 32, 3});
    xt::xarray<std::uint8_t> labels = xt::xarray<std::uint8_t>::from_shape({n});
    std::copy_n(all.images.data() + first * pixels, n * pixels, images.data());
    std::copy_n(all.labels.data() + first, n, labels.data());
    data::write_cifar10(dir, usage, images, labels);
  };
  part(0, n_train, "train");
  part(n_train, n_test, "test");
}

// The seed's create_dataset: this rank's shard, its transforms, shuffle, batch.
// `train`: with the random crop, the flip and the shuffle.
data::dataset cifar10(const std::filesystem::path& dir, const std::string& usage, std::int64_t shards,
                      std::int64_t shard, std::int64_t batch, std::int64_t size, bool train) {
  std::vector<data::transform> t;
  if (train) t = {data::random_crop(32, 32, {4, 4, 4, 4}, 1), data::random_horizontal_flip(0.5f, 2)};
  if (size != 32) t.push_back(data::resize(size, size));
  t.push_back(data::rescale(1.0f / 255, 0));
  t.push_back(data::normalize({0.4465f, 0.4822f, 0.4914f}, {0.2010f, 0.1994f, 0.2023f}));
  t.push_back(data::hwc2chw());
  data::dataset d = data::cifar10_dataset(dir, usage, {.num_shards = shards, .shard_id = shard}).map(t, "image");
  if (train) d = d.shuffle(10, 3);
  return d.batch(batch, true);
}

// LossMonitor's lines, and the step time after the first step.
class loss_monitor : public train::callback<float> {
 public:
  loss_monitor(const options& o, bool print) : o_(&o), print_(print) {}
  void on_step_end(train::run_context<float>& rc) override {
    if (rc.step > 1) {
      timed_ += rc.step_seconds;
      ++timed_steps_;
    }
    losses.push_back(rc.loss);
    if (print_) std::printf("epoch: %d step: %lld, loss is %.8g\n", rc.epoch, (long long)rc.step_in_epoch, rc.loss);
    if (o_->steps >= 0 && rc.step >= o_->steps) rc.request_stop();
  }
  std::vector<double> losses;
  double timed_ = 0;
  std::int64_t timed_steps_ = 0;

 private:
  const options* o_;
  bool print_;
};

struct outcome {
  std::vector<double> losses;
  train::eval_result test;
};

template <class Loss>
outcome train_resnet(Loss& loss_fn, context& ctx, const options& o, const std::filesystem::path& dir,
                     std::int64_t shards, std::int64_t shard, std::int64_t batch, bool print, bool test) {
  auto net = nn::resnet50<float>(10);
  if (o.parallel == "semi_auto" && ctx.size() % 2 == 0) net->end_point.shard(strategy{{1, 1}, {2, 1}});
  optim::momentum<float> opt(net->trainable_params(), 0.01f, 0.9f);
  typename train::model<nn::resnet<float>, Loss>::options mo;
  mo.seed = 1;
  if (o.parallel == "semi_auto") mo.parallel.mode = graph::parallel_mode::semi_auto_parallel;
  if (o.parallel == "auto") {
    mo.parallel.mode = graph::parallel_mode::auto_parallel;
    mo.parallel.search = graph::search_mode::dynamic_programming;
  }
  if (ctx.size() == 1) mo.parallel.mode = graph::parallel_mode::stand_alone;
  train::model model(*net, loss_fn, opt, ctx, mo);
  if (!o.load_checkpoint.empty()) {
    net->build(ctx, mo.seed);
    std::vector<io::param_ref> refs;
    for (auto& [name, q] : net->named_parameters()) refs.emplace_back(name, q->data());
    // The network's tensors; the optimizer's state saved beside them is model.resume_from's.
    io::load_distributed_checkpoint(o.load_checkpoint, refs, false);
    if (print) std::printf("loaded %zu tensors from %s\n", refs.size(), o.load_checkpoint.c_str());
  }
  loss_monitor monitor(o, print);
  std::vector<train::callback<float>*> callbacks{&monitor};
  std::optional<train::model_checkpoint<float>> ckpt;
  if (test && !o.save_checkpoint.empty()) {
    ckpt.emplace("resnet50", o.save_checkpoint, ctx,
                 train::model_checkpoint<float>::config{.save_checkpoint_steps = INT64_MAX, .keep_checkpoint_max = 1});
    callbacks.push_back(&*ckpt);
  }
  data::dataset train_set = cifar10(dir, "train", shards, shard, batch, o.image_size, !o.verify);
  model.train(o.steps == 0 ? 0 : o.epochs, train_set, callbacks);
  if (print && ckpt && !ckpt->saved().empty()) std::printf("checkpoint: %s\n", ckpt->saved().back().c_str());
  if (print && o.steps >= 0 && monitor.timed_steps_ > 0)
    std::printf("step time: %.1f ms\n", 1e3 * monitor.timed_ / double(monitor.timed_steps_));
  outcome out{monitor.losses, {}};
  if (test) {
    net->set_train(false);
    data::dataset test_set = cifar10(dir, "test", shards, shard, batch, o.image_size, false);
    out.test = model.eval(test_set);
  }
  return out;
}

// The seeds' losses: SoftmaxCrossEntropyExpand(sparse=True) in seed 003's auto_parallel
// (its small operators searched with the network's), the cross entropy otherwise.
outcome train_resnet(context& ctx, const options& o, const std::filesystem::path& dir, std::int64_t shards,
                     std::int64_t shard, std::int64_t batch, bool print, bool test) {
  if (o.parallel == "auto") {
    nn::softmax_cross_entropy_expand<float> loss(true);
    return train_resnet(loss, ctx, o, dir, shards, shard, batch, print, test);
  }
  nn::cross_entropy_loss<float> loss;
  return train_resnet(loss, ctx, o, dir, shards, shard, batch, print, test);
}

options parse(int argc, char** argv) {
  options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw error(std::string("resnet50_cifar10: ") + argv[i] + " needs a value");
    return argv[++i];
  };
  auto number = [&](int& i) {
    const std::string flag = argv[i], v = value(i);
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 0)
      throw error("resnet50_cifar10: " + flag + " needs a non-negative number, got '" + v + "'");
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data") o.data_dir = value(i);
    else if (a == "--synthetic") o.synthetic = true;
    else if (a == "--epochs") o.epochs = int(number(i));
    else if (a == "--steps") o.steps = number(i);
    else if (a == "--batch") o.batch = number(i);
    else if (a == "--image-size") o.image_size = number(i);
    else if (a == "--parallel") o.parallel = value(i);
    else if (a == "--verify") o.verify = true;
    else if (a == "--save-checkpoint") o.save_checkpoint = value(i);
    else if (a == "--load-checkpoint") o.load_checkpoint = value(i);
    else
      throw error("resnet50_cifar10: unknown argument '" + a +
                  "'; usage: resnet50_cifar10 (--data DIR | --synthetic) [--epochs N] [--steps N] [--batch N] "
                  "[--image-size S] [--parallel data|semi_auto|auto] [--verify] [--save-checkpoint DIR] "
                  "[--load-checkpoint FILE]");
  }
  if (o.synthetic == !o.data_dir.empty())
    throw error("resnet50_cifar10: give either --data DIR (cifar-10-batches-bin) or --synthetic");
  if (o.batch < 1) throw error("resnet50_cifar10: --batch must be at least 1");
  if (o.image_size < 32)
    throw error("resnet50_cifar10: --image-size must be at least 32, got " + std::to_string(o.image_size));
  if (o.parallel != "data" && o.parallel != "semi_auto" && o.parallel != "auto")
    throw error("resnet50_cifar10: --parallel must be data, semi_auto or auto, got '" + o.parallel + "'");
  return o;
}

void run(any_communicator& world, const options& o) {
  const int p = world.size(), me = world.rank();
  std::optional<examples::shared_temp_dir> synthetic;
  if (o.synthetic) synthetic.emplace(world, "resnet50_cifar10", "tessera_cifar10_", write_synthetic);
  const std::filesystem::path dir = o.synthetic ? synthetic->path() : std::filesystem::path(o.data_dir);
  // The files of both splits are checked before the network is built: a missing or
  // truncated file ends the job at once, not after the training epochs.
  for (const char* usage : {"train", "test"}) data::cifar10_dataset(dir, usage);

  any_communicator comm = device_communicator(world, cpu_device{});
  context ctx(comm);
  const outcome got = train_resnet(ctx, o, dir, p, me, o.batch, me == 0, true);
  if (me == 0) std::printf("accuracy: %.4f\n", got.test.accuracy);
  if (!o.verify) return;
  // The oracle: the same training on this process alone, whole global batches.
  any_communicator one{local_communicator{}};
  context solo(one);
  const std::vector<double> ref = train_resnet(solo, o, dir, 1, 0, o.batch * p, false, false).losses;
  if (ref.size() != got.losses.size())
    throw error("resnet50_cifar10: --verify: " + std::to_string(got.losses.size()) + " parallel steps, " +
                std::to_string(ref.size()) + " steps alone");
  if (ref.empty()) return;
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (me == 0) std::printf("step %zu: loss %.8g, alone %.8g\n", i + 1, got.losses[i], ref[i]);
  const double first = std::abs(got.losses[0] - ref[0]) / std::abs(ref[0]);
  if (me == 0)
    std::printf("one-rank training, global batch %lld: first loss's relative difference %.3g\n",
                (long long)(o.batch * p), first);
  if (first > 1e-4)
    throw error("resnet50_cifar10: the " + std::to_string(p) + "-rank first loss differs from the one-rank one by " +
                std::to_string(first) + " (relative), more than 1e-4");
}

}  // namespace

int main(int argc, char** argv) {
  train::retain_freed_memory();  // a training process: keep freed step memory for the next step
  return tessera::run(argc, argv, [&](any_communicator& world) { run(world, parse(argc, argv)); });
}
