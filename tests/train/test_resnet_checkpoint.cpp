// Checkpoints of a ResNet, batch norm's running statistics included, under mpiexec (1, 2
// and 4 ranks): a small ResNet trained by train::model in data parallel is saved by
// ModelCheckpoint per rank (integrated_save off) and whole (integrated_save on), then
// loaded into fresh networks under other strategies and rank counts: one rank alone,
// and every rank in semi_auto_parallel with convolutions and batch norms split otherwise
// (a batch norm's channels among them). Each gets the saved parameters (moving_mean and
// moving_variance included) exactly, and evaluates (set_train(false): the running
// statistics) to the saved network's logits and loss, eagerly and through the model. A
// checkpoint without a running mean is an error naming it.
//
// Tolerance: 1e-4 relative on the evaluation. The loaded networks compute the same
// forward pass with other shards (other orders of the same sums).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/model.hpp>

#include "train_test.hpp"

namespace train_test_resnet_checkpoint {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace fs = std::filesystem;

namespace {

constexpr index_t batch = 8, image = 16, classes = 4;
using net_t = nn::resnet<float>;
using model_t = train::model<net_t, nn::cross_entropy_loss<float>>;
using train_test::batch_t;

// Global batch s: images (8, 3, 16, 16), labels in [0, 4).
batch_t global_batch(int s) { return train_test::image_batch(s, batch, image, classes); }
using train_test::rows_of;

model_t::options mode(graph::parallel_mode m) {
  model_t::options o;
  o.parallel.mode = m;
  o.seed = 3;
  return o;
}

// Every parameter's global value, by name.
std::map<std::string, xt::xarray<float>> values_of(net_t& net, context& ctx) {
  std::map<std::string, xt::xarray<float>> out;
  for (auto& [name, q] : net.named_parameters()) out[name] = train_test::gather(q->data(), ctx);
  return out;
}

// The logits of the network's eager forward pass (the module's operators on a tape) for
// a whole batch given replicated.
xt::xarray<float> eager_logits(net_t& net, context& ctx, const xt::xarray<float>& x) {
  autodiff::tape<float> t(ctx);
  extents shape;
  shape.ndim = 4;
  for (int d = 0; d < 4; ++d) shape.v[d] = index_t(x.shape()[std::size_t(d)]);
  xt::xarray<float> copy = x;
  const tensor_on<float> in(layout::replicated(mesh{ctx.size()}, 4), shape, ctx.rank(), std::move(copy));
  return train_test::gather(net(t.leaf(in, false)).value(), ctx);
}

bool close(const xt::xarray<float>& a, const xt::xarray<float>& b, float tol = 1e-4f) {
  if (a.shape() != b.shape()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a.data()[i] - b.data()[i]) <= tol * (1.0f + std::abs(b.data()[i])))) return false;
  return true;
}

std::vector<io::param_ref> refs_of(net_t& net) {
  std::vector<io::param_ref> refs;
  for (auto& [name, q] : net.named_parameters()) refs.emplace_back(name, q->data());
  return refs;
}

// What a loaded network must reproduce: its parameters, eager logits and model.eval's
// loss and accuracy on the evaluation batch.
struct reference {
  std::map<std::string, xt::xarray<float>> params;
  xt::xarray<float> logits;
  train::eval_result eval;
};

// Loads `file` into a fresh network (another seed) on ctx in `m`, with `configure`
// setting its strategies, and checks it against `ref`.
template <class Configure>
void check_loaded(const fs::path& file, context& ctx, graph::parallel_mode m, Configure configure,
                  const reference& ref, const batch_t& eval_batch) {
  net_t net(std::vector<int>{1, 1, 1, 1}, classes, 4);
  configure(net);
  net.build(ctx, 77);
  std::vector<io::param_ref> refs = refs_of(net);
  io::load_distributed_checkpoint(file, refs, false);  // the file also holds the optimizer's state
  const auto got = values_of(net, ctx);
  REQUIRE(got.size() == ref.params.size());
  for (const auto& [name, v] : ref.params) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name) == v);  // a copy of the saved values, exactly
  }
  net.set_train(false);
  CHECK(close(eager_logits(net, ctx, eval_batch.first), ref.logits));
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.05f, 0.9f);
  model_t model(net, ce, opt, ctx, mode(m));
  const bool whole = m == graph::parallel_mode::stand_alone;
  std::vector<batch_t> data{whole ? eval_batch : rows_of(eval_batch, ctx.rank(), ctx.size())};
  const train::eval_result e = model.eval(data);
  CHECK(e.loss == doctest::Approx(ref.eval.loss).epsilon(1e-4));
  CHECK(e.accuracy == ref.eval.accuracy);
}

}  // namespace

TEST_CASE("a ResNet saved per rank and whole in data parallel loads into other strategies and rank counts, "
          "running statistics included") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size(), r = world.rank();
  train_test::temp_folder tmp(world);

  // Two data-parallel steps, saved at the end per rank and whole.
  net_t net(std::vector<int>{1, 1, 1, 1}, classes, 4);
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.05f, 0.9f);
  model_t model(net, ce, opt, ctx, mode(graph::parallel_mode::data_parallel));
  train::model_checkpoint<float> per_rank("net", tmp.path / "per_rank", ctx, {.save_checkpoint_steps = 100});
  train::model_checkpoint<float> whole("net", tmp.path / "whole", ctx,
                                       {.save_checkpoint_steps = 100, .integrated_save = true});
  std::vector<batch_t> data{rows_of(global_batch(0), r, p), rows_of(global_batch(1), r, p)};
  model.train(1, data, {&per_rank, &whole});
  REQUIRE(per_rank.saved().size() == 1);
  REQUIRE(whole.saved().size() == 1);
  CHECK(fs::exists(io::rank_file(per_rank.saved().back(), r)));

  reference ref;
  ref.params = values_of(net, ctx);
  // Training moved the running statistics: they are in the checkpoint, not defaults.
  CHECK(ref.params.at("bn1.moving_mean") != xt::xarray<float>(xt::zeros<float>({4})));
  CHECK(ref.params.at("layer1.0.bn2.moving_variance") != xt::xarray<float>(xt::ones<float>({4})));
  const batch_t eval_batch = global_batch(5);
  net.set_train(false);
  ref.logits = eager_logits(net, ctx, eval_batch.first);
  std::vector<batch_t> eval_rows{rows_of(eval_batch, r, p)};
  ref.eval = model.eval(eval_rows);
  {
    // Evaluation reads the parameters: the default statistics give other logits.
    net_t fresh(std::vector<int>{1, 1, 1, 1}, classes, 4);
    fresh.build(ctx, 77);
    std::vector<io::param_ref> refs;
    for (auto& [name, q] : fresh.named_parameters())
      if (name.find("moving_") == std::string::npos) refs.emplace_back(name, q->data());
    io::load_distributed_checkpoint(per_rank.saved().back(), refs, false);
    fresh.set_train(false);
    CHECK(!close(eager_logits(fresh, ctx, eval_batch.first), ref.logits, 1e-3f));
  }

  // One rank alone (every process on its own), from the per-rank files.
  any_communicator one{local_communicator{}};
  context solo(one);
  auto as_saved = [](net_t&) {};
  {
    CAPTURE("stand-alone, per-rank files");
    check_loaded(per_rank.saved().back(), solo, graph::parallel_mode::stand_alone, as_saved, ref, eval_batch);
  }

  // Every rank, semi-auto: the stem's batch norm split by channels, layer1's batch norms
  // by batch and channels, the stem's convolution by rows, the classifier by features.
  auto semi_auto = [p](net_t& n) {
    if (p == 1) return;
    const int c = 2, b = p / 2;
    n.conv1.shard(strategy{{b, 1, 2, 1}, {1, 1, 1, 1}});
    n.bn1.shard(strategy{{1, p, 1, 1}, {p}, {p}});
    n.layer(0).block(0).bn1.shard(strategy{{b, c, 1, 1}, {c}, {c}});
    n.layer(0).block(0).bn3.shard(strategy{{b, c, 1, 1}, {c}, {c}});
    n.end_point.shard(strategy{{1, 1}, {p, 1}});
  };
  {
    CAPTURE("semi_auto_parallel, per-rank files");
    check_loaded(per_rank.saved().back(), ctx, graph::parallel_mode::semi_auto_parallel, semi_auto, ref,
                 eval_batch);
  }
  {
    CAPTURE("semi_auto_parallel, the whole file");
    check_loaded(whole.saved().back(), ctx, graph::parallel_mode::semi_auto_parallel, semi_auto, ref, eval_batch);
  }
}

TEST_CASE("a checkpoint without a batch norm's running mean is an error naming it") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  train_test::temp_folder tmp(world);
  net_t net(std::vector<int>{1, 1, 1, 1}, classes, 4);
  net.build(ctx, 3);
  std::vector<io::param_ref> saved;
  for (auto& [name, q] : net.named_parameters())
    if (name != "layer2.0.bn1.moving_mean") saved.emplace_back(name, q->data());
  const fs::path file = tmp.path / "old.safetensors";
  io::save_checkpoint(file, std::span<const io::param_ref>(saved), ctx);
  net_t fresh(std::vector<int>{1, 1, 1, 1}, classes, 4);
  fresh.build(ctx, 4);
  std::vector<io::param_ref> refs = refs_of(fresh);
  CHECK_THROWS_WITH_AS(io::load_distributed_checkpoint(file, refs),
                       ("load_distributed_checkpoint: " + file.string() +
                        ": 1 mismatch with the network:\n  missing 'layer2.0.bn1.moving_mean' (F32 (8,))")
                           .c_str(),
                       error);
}
}  // namespace train_test_resnet_checkpoint
