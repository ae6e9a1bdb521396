// docs/training.md's restartable program (train/checkpoint.hpp): a training that saves a
// checkpoint every step and, started again, goes on from the newest complete one. Checks
// that a training stopped after step 3 and started again by fresh objects takes the steps
// of the uninterrupted training (the same losses, to the last bit), that each rank's
// checkpoints lie in its folder as <prefix>-<epoch>_<step>.safetensors, and that the
// newest keep_checkpoint_max (5) are kept.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/model.hpp>
using namespace tessera;
namespace fs = std::filesystem;

struct network : nn::module<float> {
  nn::dense<float> fc{12, 16, {}, {}, true, nn::activation::relu}, out{16, 4};
  void visit(nn::visitor<float>& v) override {
    v.child("fc", fc);
    v.child("out", out);
  }
  template <class V>
  V operator()(V x) {
    return out(fc(x));
  }
};

using batch = std::pair<xt::xarray<float>, xt::xarray<int>>;
constexpr int epochs = 2;

// 4 global batches of 16 rows (inputs in [-1, 1), each label the index of the largest
// of the row's first 4 inputs); of each, the rows of rank `rank` of `ranks`.
std::vector<batch> dataset_of(int rank, int ranks) {
  const std::size_t mine = 16 / std::size_t(ranks);
  std::vector<batch> out;
  for (std::size_t b = 0; b < 4; ++b) {
    xt::xarray<float> x = xt::xarray<float>::from_shape({mine, 12});
    xt::xarray<int> y = xt::xarray<int>::from_shape({mine});
    for (std::size_t i = 0; i < mine; ++i) {
      const std::size_t row = b * 16 + std::size_t(rank) * mine + i;
      for (std::size_t k = 0; k < 12; ++k) {
        std::uint64_t h = (row * 12 + k + 1) * 0x9E3779B97F4A7C15ull;
        h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
        x(i, k) = float((h ^ (h >> 29)) % 20000) / 10000.0f - 1.0f;
      }
      y(i) = 0;
      for (int k = 1; k < 4; ++k)
        if (x(i, k) > x(i, y(i))) y(i) = k;
    }
    out.emplace_back(std::move(x), std::move(y));
  }
  return out;
}

// [restartable]
// The job's program, the same at its first start and after each restart: `dataset` holds
// this rank's rows of each batch, `monitor` is a callback (a loss_monitor, say).
void train_job(context& ctx, const std::filesystem::path& dir, std::vector<batch>& dataset,
               train::callback<float>& monitor) {
  network net;
  nn::cross_entropy_loss<float> loss_fn;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model model(net, loss_fn, opt, ctx);
  if (auto last = io::latest_complete_checkpoint(dir, "net")) model.resume_from(*last);
  train::model_checkpoint<float> ckpt("net", dir, ctx);  // a folder the ranks share
  model.train(epochs, dataset, {&monitor, &ckpt});       // killed and restarted: the same numbers
}
// [/restartable]

namespace {

// Each step's loss; stops the training after step `stop_after` (as a job killed then).
struct recorder : train::callback<float> {
  std::vector<double> losses;
  std::int64_t stop_after = -1;
  void on_step_end(train::run_context<float>& rc) override {
    losses.push_back(rc.loss);
    if (rc.step == stop_after) rc.request_stop();
  }
};

// A fresh folder, the same on every rank (rank 0 makes it).
fs::path shared_folder(any_communicator& world) {
  std::vector<char> name(256, '\0');
  if (world.rank() == 0) {
    std::string t = (fs::temp_directory_path() / "tessera-training-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw error("training_checkpoint: mkdtemp failed for " + t);
    std::copy(t.begin(), t.end(), name.begin());
  }
  world.broadcast(std::span<char>(name), 0);
  return fs::path(std::string(name.data()));
}

void check(bool ok, const std::string& what) {
  if (!ok) throw error("training_checkpoint: " + what);
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    context ctx(world);
    std::vector<batch> dataset = dataset_of(ctx.rank(), ctx.size());
    const fs::path whole = shared_folder(world), restarted = shared_folder(world);

    recorder all;  // the training uninterrupted: 2 epochs of 4 steps
    train_job(ctx, whole, dataset, all);
    check(all.losses.size() == 8, std::to_string(all.losses.size()) + " steps, not 8");
    check(all.losses.back() < all.losses.front(), "the loss did not fall");

    recorder first;  // stopped after step 3, then started again by fresh objects
    first.stop_after = 3;
    train_job(ctx, restarted, dataset, first);
    const std::optional<fs::path> last = io::latest_complete_checkpoint(restarted, "net");
    check(last && *last == restarted / "net-1_3.safetensors", "the newest checkpoint is not net-1_3");
    recorder second;
    train_job(ctx, restarted, dataset, second);
    std::vector<double> both = first.losses;
    both.insert(both.end(), second.losses.begin(), second.losses.end());
    check(both == all.losses, "the restarted training's " + std::to_string(first.losses.size()) + " + " +
                                  std::to_string(second.losses.size()) + " losses differ from the uninterrupted one's");

    // This rank's folder keeps the newest 5 of the 8 checkpoints.
    std::vector<std::string> kept;
    for (const auto& e : fs::directory_iterator(whole / ("rank_" + std::to_string(ctx.rank()))))
      if (e.path().extension() == ".safetensors") kept.push_back(e.path().filename().string());
    std::sort(kept.begin(), kept.end());
    const std::vector<std::string> newest{"net-1_4.safetensors", "net-2_1.safetensors", "net-2_2.safetensors",
                                          "net-2_3.safetensors", "net-2_4.safetensors"};
    check(kept == newest, "rank " + std::to_string(ctx.rank()) + " kept " + std::to_string(kept.size()) +
                              " checkpoints, not net-1_4 to net-2_4");

    world.barrier();
    if (world.rank() == 0) {
      fs::remove_all(whole);
      fs::remove_all(restarted);
    }
  });
}
