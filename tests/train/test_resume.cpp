// Exact resume under mpiexec (1, 2 and 4 ranks): a training stopped after a step and
// resumed by fresh objects from its newest checkpoint (model.resume_from) takes the
// steps the uninterrupted training takes, to the last bit: the same losses and the same
// parameters, in data parallel with Momentum, with optimizer parallel and Adam on a
// cosine schedule, in semi-auto and in auto parallel, through a Dropout layer (whose
// draws the checkpoint carries) and epochs that differ (the position in the data: also
// a data::dataset pipeline, shuffled every epoch and prefetched), and on two pipeline
// stages with 2 micro-batches and optimizer parallel (stages on 2 and 4 ranks). A
// checkpoint saved on N ranks resumes on one rank to the numbers of stand-alone
// training. io::latest_complete_checkpoint skips a step that some rank did not finish
// saving; bad input is an error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include <xtensor/xview.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/source.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/adam.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/data.hpp>
#include <tessera/train/model.hpp>

#include "resume_test.hpp"
#include "train_test.hpp"

namespace train_test_resume {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace train_test;
using namespace resume_test;
namespace fs = std::filesystem;

namespace {

struct setup {
  const char* what;
  graph::parallel_config cfg;
  bool adam_parallel = false;  // Adam on a cosine schedule with optimizer parallel; else Momentum
  bool configured = false;     // strategies set on the modules
  bool pipeline = false;       // batches from a data::dataset pipeline
  bool staged = false;         // fc and out on two pipeline stages (one on one rank), 2 micro-batches
};

// The whole parameters of the newest checkpoint in `dir`, read on this rank alone.
std::vector<xt::xarray<float>> checkpointed(const fs::path& dir) {
  network net;
  any_communicator one{local_communicator{}};
  context solo(one);
  net.build(solo, 3);
  std::vector<io::param_ref> refs;
  for (auto& [name, q] : net.named_parameters()) refs.emplace_back(name, q->data());
  const auto last = io::latest_complete_checkpoint(dir, "net");
  REQUIRE(last.has_value());
  io::load_distributed_checkpoint(*last, refs, false);  // the optimizer's state aside
  std::vector<xt::xarray<float>> out;
  for (auto* q : net.parameters()) out.push_back(q->data().local());
  return out;
}

// 64 samples as train_test::batch makes them, each rank's shard of them reshuffled
// every epoch, then a buffer shuffle, batches of 16 global rows, prefetched.
data::dataset pipeline(int r, int p) {
  auto sample = [](std::int64_t i) {
    const batch_t b = train_test::batch(1000 + i, 1);
    xt::xarray<float> x = xt::view(b.first, 0);
    return std::vector<data::array>{x, data::array::scalar(b.second(0))};
  };
  return data::generator_dataset(sample, {"image", "label"}, 64, {.num_shards = p, .shard_id = r, .shuffle = true, .seed = 3})
      .shuffle(8, 5)
      .batch(16 / p, true)
      .prefetch(2);
}

struct losses : train::callback<float> {
  std::vector<double> seen;
  std::int64_t stop_after = -1;
  void on_step_end(train::run_context<float>& rc) override {
    seen.push_back(rc.loss);
    if (rc.step == stop_after) rc.request_stop();
  }
};

struct outcome {
  std::vector<double> losses;
  std::vector<xt::xarray<float>> params;  // whole
};

// Trains under `s` on ctx, saving a checkpoint every step into `dir`: the whole
// training, or up to step `stop_after`, or, with `resume`, from the newest checkpoint
// in `dir` on. Fresh objects each time (the network initialised as at the start): what
// the resumed ones hold comes from the checkpoint.
outcome run(const setup& s, context& ctx, const fs::path& dir, std::int64_t stop_after, bool resume,
            std::uint64_t seed = 7) {
  const int p = ctx.size();
  network net;
  if (s.configured && p > 1) net.fc.shard(strategy{{p >= 4 ? 2 : 1, 1}, {p >= 4 ? p / 2 : p, 1}});
  graph::parallel_config cfg = s.cfg;
  if (s.staged) {
    cfg.pipeline_stages = std::min(p, 2);
    cfg.micro_size = 2;
    net.fc.set_pipeline_stage(0);
    net.out.set_pipeline_stage(cfg.pipeline_stages - 1);
  }
  const int n = p / std::max(1, cfg.pipeline_stages);  // the ranks of a stage split the batch
  nn::cross_entropy_loss<float> ce;
  std::unique_ptr<optim::optimizer<float>> opt;
  if (s.adam_parallel) {
    opt = std::make_unique<optim::adam<float>>(net.trainable_params(), optim::cosine_lr(0.05f, 10));
    opt->enable_parallel_optimizer(ctx, {.threshold_bytes = 0});
  } else {
    opt = std::make_unique<optim::momentum<float>>(net.trainable_params(), 0.1f, 0.9f);
  }
  train::model<network, nn::cross_entropy_loss<float>>::options o;
  o.parallel = cfg;
  o.seed = seed;
  train::model model(net, ce, *opt, ctx, o);
  if (resume) {
    const auto last = io::latest_complete_checkpoint(dir, "net");
    REQUIRE(last.has_value());
    model.resume_from(*last);
  }
  const bool whole = s.cfg.mode == graph::parallel_mode::stand_alone;
  epoch_batches data{ctx.rank() % n, n, whole};
  losses rec;
  rec.stop_after = stop_after;
  train::model_checkpoint<float> ckpt("net", dir, ctx, {.save_checkpoint_steps = 1, .keep_checkpoint_max = 2});
  if (s.pipeline) {
    data::dataset ds = pipeline(ctx.rank(), p);
    model.train(epochs, ds, {&rec, &ckpt});
  } else {
    model.train(epochs, data, {&rec, &ckpt});
  }
  outcome out;
  out.losses = rec.seen;
  if (s.staged) {  // each stage holds its own: read them from the checkpoint of the last step
    out.params = checkpointed(dir);
    return out;
  }
  for (auto* q : net.parameters())
    out.params.push_back(redistribute(q->data(), layout::replicated(q->layout().dev, q->shape().ndim), ctx).local());
  return out;
}

}  // namespace

TEST_CASE("a training stopped and resumed from its checkpoint equals the uninterrupted one, bit for bit") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  temp_folder tmp(world);
  const std::vector<setup> setups = {
      {"data_parallel, Momentum", mode(graph::parallel_mode::data_parallel)},
      {"data_parallel, optimizer parallel, Adam on a cosine schedule", mode(graph::parallel_mode::data_parallel), true},
      {"data_parallel, a data::dataset pipeline", mode(graph::parallel_mode::data_parallel), false, false, true},
      {"semi_auto_parallel", mode(graph::parallel_mode::semi_auto_parallel), false, true},
      {"auto_parallel, dynamic programming",
       mode(graph::parallel_mode::auto_parallel, graph::search_mode::dynamic_programming)},
      {"pipeline stages, optimizer parallel, Adam", mode(graph::parallel_mode::data_parallel), true, false, false,
       true},
  };
  const std::int64_t total = std::int64_t(steps_per_epoch) * epochs;
  int k = 0;
  for (const setup& s : setups) {
    CAPTURE(s.what);
    const fs::path whole_dir = tmp.path / ("whole" + std::to_string(k)), cut_dir = tmp.path / ("cut" + std::to_string(k));
    ++k;
    const outcome whole = run(s, ctx, whole_dir, -1, false, 7);
    REQUIRE(whole.losses.size() == std::size_t(total));
    // Stopped in the middle of epoch 2 (step 6), and at the end of epoch 1 (step 4).
    for (const std::int64_t stop : {std::int64_t(6), std::int64_t(steps_per_epoch)}) {
      CAPTURE(stop);
      world.barrier();
      if (world.rank() == 0) fs::remove_all(cut_dir);
      world.barrier();
      const outcome first = run(s, ctx, cut_dir, stop, false, 7);
      REQUIRE(first.losses.size() == std::size_t(stop));
      const outcome rest = run(s, ctx, cut_dir, -1, true);
      REQUIRE(rest.losses.size() == std::size_t(total - stop));
      for (std::size_t i = 0; i < rest.losses.size(); ++i) {
        CAPTURE(i);
        CHECK(rest.losses[i] == whole.losses[std::size_t(stop) + i]);
      }
      REQUIRE(rest.params.size() == whole.params.size());
      for (std::size_t i = 0; i < rest.params.size(); ++i) {
        CAPTURE(i);
        CHECK(rest.params[i] == whole.params[i]);
      }
      world.barrier();
    }
  }
}

TEST_CASE("a checkpoint saved on N ranks resumes on one rank to the stand-alone numbers") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  temp_folder tmp(world);
  const setup dp{"data_parallel, optimizer parallel, Adam", mode(graph::parallel_mode::data_parallel), true};
  const setup alone{"stand_alone, Adam", mode(graph::parallel_mode::stand_alone), true};
  const std::string r = std::to_string(world.rank());
  const outcome oracle = run(alone, solo, tmp.path / ("oracle" + r), -1, false);
  (void)run(dp, ctx, tmp.path / "cut", 5, false);  // 5 steps on N ranks
  world.barrier();
  const fs::path mine = tmp.path / ("solo" + r);
  fs::copy(tmp.path / "cut", mine, fs::copy_options::recursive);
  const outcome rest = run(alone, solo, mine, -1, true);  // the rest on one
  REQUIRE(rest.losses.size() == oracle.losses.size() - 5);
  for (std::size_t i = 0; i < rest.losses.size(); ++i)
    CHECK(rest.losses[i] == doctest::Approx(oracle.losses[5 + i]).epsilon(1e-5));
  for (std::size_t i = 0; i < rest.params.size(); ++i) {
    CAPTURE(i);
    CHECK(max_rel_diff(rest.params[i], oracle.params[i]) < 2e-5);
  }
}

TEST_CASE("latest_complete_checkpoint: a step some rank did not finish saving does not count") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  temp_folder tmp(world);
  const setup dp{"data_parallel", mode(graph::parallel_mode::data_parallel)};
  CHECK_FALSE(io::latest_complete_checkpoint(tmp.path / "none", "net").has_value());
  (void)run(dp, ctx, tmp.path, 3, false);
  world.barrier();
  CHECK(io::latest_complete_checkpoint(tmp.path, "net") == tmp.path / "net-1_3.safetensors");
  world.barrier();
  // The last rank died while saving step 3: its file of that step is missing.
  if (world.rank() == 0) fs::remove(io::rank_file(tmp.path / "net-1_3.safetensors", world.size() - 1));
  world.barrier();
  CHECK(io::latest_complete_checkpoint(tmp.path, "net") == tmp.path / "net-1_2.safetensors");
  // A file cut short is an error, not a checkpoint.
  const fs::path cut = io::rank_file(tmp.path / "net-1_2.safetensors", 0);
  world.barrier();
  if (world.rank() == 0) fs::resize_file(cut, fs::file_size(cut) / 2);
  world.barrier();
  CHECK_THROWS_WITH_AS(io::latest_complete_checkpoint(tmp.path, "net"), doctest::Contains(cut.string().c_str()), error);
}

TEST_CASE("resume_from: a checkpoint without the training state, and one of another network, are errors") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  temp_folder tmp(world);
  network net;
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model model(net, ce, opt, ctx);
  epoch_batches data{ctx.rank(), ctx.size(), false};
  train::model_checkpoint<float> bare("bare", tmp.path, ctx, {.save_training_state = false});
  train::model_checkpoint<float> full("full", tmp.path, ctx);
  model.train(1, data, {&bare, &full});
  const fs::path f = tmp.path / "bare-1_4.safetensors";
  CHECK_THROWS_WITH_AS(model.resume_from(f),
                       ("model.resume_from: " + f.string() +
                        " holds no training state (no \"train.epoch\"): save it with model_checkpoint's "
                        "save_training_state on")
                           .c_str(),
                       error);
  // Another seed keys the dropout layer's stream otherwise.
  network reseeded;
  optim::momentum<float> opt2(reseeded.trainable_params(), 0.1f, 0.9f);
  train::model<network, nn::cross_entropy_loss<float>>::options o;
  o.seed = 5;
  train::model m1(reseeded, ce, opt2, ctx, o);
  m1.resume_from(tmp.path / "full-1_4.safetensors");
  CHECK_THROWS_WITH_AS(m1.train(2, data), doctest::Contains("resume with the network and the seed"), error);
  // Adam's state is not Momentum's: the load names what is missing.
  network other;
  optim::adam<float> adam(other.trainable_params(), 1e-3f);
  train::model m2(other, ce, adam, ctx);
  m2.resume_from(tmp.path / "full-1_4.safetensors");
  CHECK_THROWS_WITH_AS(m2.train(2, data), doctest::Contains("moment1.fc.weight"), error);
}

TEST_CASE("resume_from: an eval before training evaluates the saved network") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  temp_folder tmp(world);
  const auto test_set = shard(2, rows, ctx.rank(), ctx.size(), 100);
  train::eval_result saved, resumed;
  {
    network net;
    nn::cross_entropy_loss<float> ce;
    optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
    train::model model(net, ce, opt, ctx);
    epoch_batches data{ctx.rank(), ctx.size()};
    train::model_checkpoint<float> ckpt("net", tmp.path, ctx);
    model.train(1, data, {&ckpt});
    saved = model.eval(test_set);
  }
  network net;
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model model(net, ce, opt, ctx);
  model.resume_from(tmp.path / "net-1_4.safetensors");
  resumed = model.eval(test_set);
  CHECK(resumed.loss == saved.loss);
  CHECK(resumed.accuracy == saved.accuracy);
}
}  // namespace train_test_resume
