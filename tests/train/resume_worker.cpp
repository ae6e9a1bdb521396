// A training job that keeps going through failures, as a user writes one: every step
// saved by model_checkpoint into a folder the ranks share, and at every start the
// newest complete checkpoint there resumed (io::latest_complete_checkpoint,
// model.resume_from). Run by test_resume_job.py under tessera-run --max-restarts.
//
//   resume_worker --dir DIR [--die-at STEP --die-rank R [--in-save]]
//
// On its first attempt (TESSERA_RESTART_COUNT 0 or unset) rank R kills itself with
// SIGKILL after step STEP: before the step's checkpoint (--in-save: while the other
// ranks write theirs, so that the step's checkpoint is left incomplete), or after it.
// Rank 0 prints each step's loss and at the end "final <digest> loss <loss>": a hash of
// every parameter's bits and the last loss, which the uninterrupted run and the resumed
// one must share.
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <tessera/comm/launch.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/model.hpp>

#include "resume_test.hpp"

using namespace tessera;
using namespace resume_test;

namespace {

// Kills this rank at the end of step `at` (placed before or after the checkpoint).
struct killer : train::callback<float> {
  std::int64_t at = -1;
  void on_step_end(train::run_context<float>& rc) override {
    if (rc.step != at) return;
    std::printf("rank %d: killed after step %lld\n", rc.rank, static_cast<long long>(rc.step));
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
};

// Rank 0 prints "step S loss L" after each step.
struct loss_lines : train::callback<float> {
  double loss = 0;
  void on_step_end(train::run_context<float>& rc) override {
    loss = rc.loss;
    if (rc.rank != 0) return;
    std::printf("step %lld loss %.9g\n", static_cast<long long>(rc.step), rc.loss);
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path dir;
  std::int64_t die_at = -1;
  int die_rank = -1;
  bool in_save = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--die-at" && i + 1 < argc) die_at = std::atoll(argv[++i]);
    else if (a == "--die-rank" && i + 1 < argc) die_rank = std::atoi(argv[++i]);
    else if (a == "--in-save") in_save = true;
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: resume_worker --dir DIR [--die-at STEP --die-rank R [--in-save]]\n");
    return 2;
  }
  const char* restart = std::getenv("TESSERA_RESTART_COUNT");
  const bool first_attempt = !restart || std::string(restart) == "0";
  return tessera::run(argc, argv, [&](any_communicator& world) {
    context ctx(world);
    network net;
    nn::cross_entropy_loss<float> ce;
    optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
    train::model<network, nn::cross_entropy_loss<float>>::options o;
    o.seed = 7;
    train::model model(net, ce, opt, ctx, o);
    if (auto last = io::latest_complete_checkpoint(dir, "net")) {
      if (world.rank() == 0) std::printf("resuming from %s\n", last->filename().string().c_str());
      model.resume_from(*last);
    }
    train::model_checkpoint<float> ckpt("net", dir, ctx, {.save_checkpoint_steps = 1, .keep_checkpoint_max = 2});
    killer kill;
    if (first_attempt && world.rank() == die_rank) kill.at = die_at;
    loss_lines loss;
    std::vector<train::callback<float>*> callbacks{&loss, &ckpt};
    callbacks.insert(in_save ? callbacks.begin() + 1 : callbacks.end(), &kill);
    epoch_batches data{world.rank(), world.size()};
    model.train(epochs, data, callbacks);
    std::uint64_t h = 1469598103934665603ull;
    for (auto* q : net.parameters())
      for (float v : q->data().data()) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 0xffu)) * 1099511628211ull;
      }
    if (world.rank() == 0) std::printf("final %016llx loss %.9g\n", static_cast<unsigned long long>(h), loss.loss);
    return 0;
  });
}
