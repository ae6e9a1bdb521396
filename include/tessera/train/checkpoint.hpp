// ModelCheckpoint (MindSpore's mindspore.train.ModelCheckpoint with its
// CheckpointConfig): a callback that saves the network's parameters through io/'s
// checkpoint writer every N steps and at the end of the training, named
// "<prefix>-<epoch>_<step>.safetensors", keeping the newest keep_checkpoint_max.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/io/rotation.hpp>
#include <tessera/train/callbacks.hpp>

namespace tessera::train {

/// MindSpore's ModelCheckpoint(prefix, directory, config). Saving is collective: every
/// rank calls the hooks at the same steps.
///
/// - integrated_save off (the default here): each rank writes its own shards to its
///   own folder, `<directory>/rank_<r>/<prefix>-<epoch>_<step>.safetensors`
///   (io::rank_file); in data parallel each rank's shards are the whole network, as
///   each MindSpore rank saves the whole network to its own directory (the seeds pass
///   one directory per rank; the rank folder keeps them apart when they share one).
/// - integrated_save on: the tensors are gathered and rank 0 writes
///   `<directory>/<prefix>-<epoch>_<step>.safetensors`.
///
/// Either loads with io::load_distributed_checkpoint(<directory>/<name>, ...) into any
/// layout on any number of ranks. The step in the name counts the epoch's steps from 1
/// (MindSpore's naming). After each save, the rank that wrote deletes its checkpoints of
/// `prefix` beyond the newest keep_checkpoint_max (io::rotate_checkpoints).
///
///     train::model_checkpoint<float, mpi_communicator> ckpt("mnist", "ckpt_" + std::to_string(rank), ctx,
///                                                            {.save_checkpoint_steps = 100, .keep_checkpoint_max = 3});
///     model.train(10, dataset, {&loss_cb, &ckpt});
template <class T, class C>
class model_checkpoint : public callback<T> {
 public:
  /// MindSpore's CheckpointConfig.
  struct config {
    std::int64_t save_checkpoint_steps = 1;  ///< save every this many steps (and at the end)
    int keep_checkpoint_max = 5;             ///< checkpoints kept per folder
    bool integrated_save = false;            ///< see above
  };

  model_checkpoint(std::string prefix, std::filesystem::path directory, device_context<C>& ctx)
      : model_checkpoint(std::move(prefix), std::move(directory), ctx, config{}) {}
  model_checkpoint(std::string prefix, std::filesystem::path directory, device_context<C>& ctx, config c)
      : prefix_(std::move(prefix)), dir_(std::move(directory)), ctx_(&ctx), cfg_(c) {
    if (c.save_checkpoint_steps < 1)
      throw error("model_checkpoint: save_checkpoint_steps must be at least 1, got " +
                  std::to_string(c.save_checkpoint_steps));
    if (c.keep_checkpoint_max < 1)
      throw error("model_checkpoint: keep_checkpoint_max must be at least 1, got " +
                  std::to_string(c.keep_checkpoint_max));
    (void)io::checkpoint_file_name(prefix_, 0, 0);  // checks the prefix now, not at the first save
  }

  void on_step_end(run_context<T>& rc) override {
    if (rc.step % cfg_.save_checkpoint_steps == 0) save(rc);
  }
  void on_train_end(run_context<T>& rc) override {
    if (rc.step > 0 && rc.step != last_saved_) save(rc);
  }

  /// The checkpoints named so far (<directory>/<name>, what load_distributed_checkpoint
  /// takes), oldest first, including those since rotated away.
  const std::vector<std::filesystem::path>& saved() const { return saved_; }

 private:
  void save(run_context<T>& rc) {
    std::vector<io::param_ref> refs;
    refs.reserve(rc.parameters.size());
    for (auto& [name, p] : rc.parameters) refs.emplace_back(name, p->data());
    const std::filesystem::path file = dir_ / io::checkpoint_file_name(prefix_, rc.epoch, rc.step_in_epoch);
    io::save_options how;
    how.integrated_save = cfg_.integrated_save;
    const std::filesystem::path written = io::save_checkpoint(file, std::span<const io::param_ref>(refs), *ctx_, how);
    if (!cfg_.integrated_save || ctx_->rank() == 0) {
      const std::filesystem::path folder = written.has_parent_path() ? written.parent_path() : ".";
      io::rotate_checkpoints(folder, prefix_, cfg_.keep_checkpoint_max);
    }
    saved_.push_back(file);
    last_saved_ = rc.step;
  }

  std::string prefix_;
  std::filesystem::path dir_;
  device_context<C>* ctx_;
  config cfg_;
  std::int64_t last_saved_ = 0;
  std::vector<std::filesystem::path> saved_;
};

}  // namespace tessera::train
