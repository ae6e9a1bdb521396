// Tests of train/checkpoint.hpp under mpiexec (1, 2 and 4 ranks): ModelCheckpoint
// during Model.train saves every N steps and at the end, each rank into its own
// folder (or rank 0 one whole file with integrated_save), keeps the newest
// keep_checkpoint_max, and the newest loads back into a fresh network as the trained
// parameters; a device network's parameters are written from their host copies; bad
// settings are errors.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/model.hpp>

#include "train_test.hpp"

namespace train_test_checkpoint {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace train_test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("model_checkpoint: every N steps and at the end, each rank in its folder, the newest kept") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size(), r = world.rank();
  temp_folder tmp(world);
  const fs::path mine = tmp.path / ("ckpt_" + std::to_string(r));  // the seeds' per-rank directory

  auto data = shard(3, 16, r, p);
  mlp net;
  nn::cross_entropy_loss<float> ce;
  optim::sgd<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model model(net, ce, opt, ctx);
  train::model_checkpoint<float> ckpt("net", mine, ctx,
                                                        {.save_checkpoint_steps = 2, .keep_checkpoint_max = 2});
  model.train(3, data, {&ckpt});
  // Steps 2, 4, 6, 8 and the last (9): epoch 1 step 2, 2_1, 2_3, 3_2 and 3_3.
  std::vector<std::string> saved;
  for (const auto& f : ckpt.saved()) saved.push_back(f.filename().string());
  CHECK(saved == std::vector<std::string>{"net-1_2.safetensors", "net-2_1.safetensors", "net-2_3.safetensors",
                                          "net-3_2.safetensors", "net-3_3.safetensors"});
  CHECK(names_in(mine) == std::vector<std::string>{"rank_" + std::to_string(r)});
  CHECK(names_in(mine / ("rank_" + std::to_string(r))) ==
        std::vector<std::string>{"net-3_2.safetensors", "net-3_3.safetensors"});

  // The newest loads into a fresh network (another seed) as the trained parameters. Data
  // parallel: rank 0's shards are the whole network, so its folder alone is a checkpoint.
  mlp fresh;
  fresh.build(ctx, 99);
  std::vector<io::param_ref> refs;
  for (auto& [name, q] : fresh.named_parameters()) refs.emplace_back(name, q->data());
  // The file also holds SGD's momentum buffers ("accum.<param>"): not strict.
  io::load_distributed_checkpoint(tmp.path / "ckpt_0" / "net-3_3.safetensors", refs, false);
  const io::checkpoint written = io::load_checkpoint(io::rank_file(tmp.path / "ckpt_0" / "net-3_3.safetensors", 0));
  for (auto& [name, q] : net.named_parameters()) CHECK(written.contains("accum." + name));
  const auto a = net.parameters(), b = fresh.parameters();
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(std::equal(a[i]->data().data().begin(), a[i]->data().data().end(), b[i]->data().data().begin()));
}

TEST_CASE("model_checkpoint: integrated_save writes one whole file on rank 0") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  temp_folder tmp(world);
  auto data = shard(2, 8, world.rank(), world.size());
  mlp net;
  nn::cross_entropy_loss<float> ce;
  optim::sgd<float> opt(net.trainable_params(), 0.1f);
  train::model model(net, ce, opt, ctx);
  train::model_checkpoint<float> ckpt(
      "whole", tmp.path, ctx, {.save_checkpoint_steps = 1, .keep_checkpoint_max = 1, .integrated_save = true});
  model.train(1, data, {&ckpt});
  world.barrier();
  CHECK(names_in(tmp.path) == std::vector<std::string>{"whole-1_2.safetensors"});
  mlp fresh;
  fresh.build(ctx, 5);
  std::vector<io::param_ref> refs;
  for (auto& [name, q] : fresh.named_parameters()) refs.emplace_back(name, q->data());
  io::load_distributed_checkpoint(tmp.path / "whole-1_2.safetensors", refs);
  CHECK(std::equal(net.parameters()[0]->data().data().begin(), net.parameters()[0]->data().data().end(),
                   fresh.parameters()[0]->data().data().begin()));
}

TEST_CASE("model_checkpoint: bad settings are errors") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  using ckpt_t = train::model_checkpoint<float>;
  CHECK_THROWS_WITH(ckpt_t("net", "d", ctx, {.save_checkpoint_steps = 0}),
                    "model_checkpoint: save_checkpoint_steps must be at least 1, got 0");
  CHECK_THROWS_WITH(ckpt_t("net", "d", ctx, {.save_checkpoint_steps = 1, .keep_checkpoint_max = 0}),
                    "model_checkpoint: keep_checkpoint_max must be at least 1, got 0");
  CHECK_THROWS_WITH(ckpt_t("", "d", ctx), doctest::Contains("checkpoint_file_name"));
}

TEST_CASE("model_checkpoint: a device network is written from its parameters' host copies") {
  // What train::model hands a callback for a network on a GPU: no `parameters`, and
  // host_parameters() making host copies (here of a host network, so that the test runs
  // on the host); the checkpoint is made from those copies, once per save.
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  temp_folder tmp(world);
  mlp net;
  net.build(ctx, 3);
  int calls = 0;
  train::run_context<float> rc;
  rc.epoch = 1;
  rc.host_parameters = [&] {
    ++calls;
    std::vector<std::pair<std::string, dist_tensor<float>>> out;
    for (auto& [name, q] : net.named_parameters()) out.emplace_back(name, dist_tensor<float>(q->data()));
    return out;
  };
  train::model_checkpoint<float> ckpt(
      "dev", tmp.path, ctx, {.save_checkpoint_steps = 2, .keep_checkpoint_max = 1, .integrated_save = true});
  for (int s = 1; s <= 3; ++s) {
    rc.step = rc.step_in_epoch = s;
    ckpt.on_step_end(rc);
  }
  ckpt.on_train_end(rc);
  CHECK(calls == 2);  // steps 2 and 3
  world.barrier();
  CHECK(names_in(tmp.path) == std::vector<std::string>{"dev-1_3.safetensors"});
  mlp fresh;
  fresh.build(ctx, 5);
  std::vector<io::param_ref> refs;
  for (auto& [name, q] : fresh.named_parameters()) refs.emplace_back(name, q->data());
  io::load_distributed_checkpoint(tmp.path / "dev-1_3.safetensors", refs);
  const auto a = net.parameters(), b = fresh.parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(std::equal(a[i]->data().data().begin(), a[i]->data().data().end(), b[i]->data().data().begin()));
}
}  // namespace train_test_checkpoint
