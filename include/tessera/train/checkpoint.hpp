// ModelCheckpoint (MindSpore's mindspore.train.ModelCheckpoint with its
// CheckpointConfig): a callback that saves the network's parameters through io/'s
// checkpoint writer every N steps and at the end of the training, named
// "<prefix>-<epoch>_<step>.safetensors", keeping the newest keep_checkpoint_max, with
// what model.resume_from needs to continue the training exactly (the optimizer's state,
// the position, the random streams). Parameters on a device (a GPU) are copied to the
// host to be written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
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
/// `prefix` beyond the newest keep_checkpoint_max (io::rotate_checkpoints), once every
/// rank has written (a job killed while saving keeps the step before whole).
///
///     train::model_checkpoint<float> ckpt("mnist", "ckpt_" + std::to_string(rank), ctx,
///                                         {.save_checkpoint_steps = 100, .keep_checkpoint_max = 3});
///     model.train(10, dataset, {&loss_cb, &ckpt});
///
/// Under model.train a checkpoint also holds the optimizer's state and the training's
/// position (save_training_state), so that a restarted job continues exactly:
///
///     if (auto last = io::latest_complete_checkpoint("ckpt", "mnist")) model.resume_from(*last);
///     model.train(10, dataset, {&loss_cb, &ckpt});   // from the saved step on
///
/// A network on a device other than the host (a GPU) is saved from its parameters'
/// host copies (run_context::host_parameters); the checkpoint is the same file. When
/// ctx's communicator carries device buffers (the model's, staged through the host
/// world), the save's communication goes through its host communicator
/// (any_communicator::host_communicator()); a context over host memory may be passed as well.
template <class T>
class model_checkpoint : public callback<T> {
 public:
  /// MindSpore's CheckpointConfig.
  struct config {
    std::int64_t save_checkpoint_steps = 1;  ///< save every this many steps (and at the end)
    int keep_checkpoint_max = 5;             ///< checkpoints kept per folder
    bool integrated_save = false;            ///< see above
    /// Also the optimizer's state (MindSpore's names: "moments.<param>", ...) and, as
    /// metadata, the training's position, the optimizer's step count and the dropout
    /// layers' draws: what model.resume_from needs to continue exactly. Off: the
    /// network's parameters alone.
    bool save_training_state = true;
  };

  model_checkpoint(std::string prefix, std::filesystem::path directory, context& ctx)
      : model_checkpoint(std::move(prefix), std::move(directory), ctx, config{}) {}
  model_checkpoint(std::string prefix, std::filesystem::path directory, context& ctx, config c)
      : prefix_(std::move(prefix)), dir_(std::move(directory)), ctx_(&ctx), cfg_(c) {
    if (ctx.world().device_buffers() && !ctx.world().host_communicator())
      throw error("model_checkpoint: the " + std::string(ctx.world().backend()) +
                  " backend takes device buffers and has no host communicator to save through; pass a "
                  "context over host memory");
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
    // A device network's parameters: their host copies, alive until written.
    std::vector<std::pair<std::string, dist_tensor<T>>> copies;
    if (rc.host_parameters) copies = rc.host_parameters();
    std::vector<io::param_ref> refs;
    refs.reserve(rc.parameters.size() + copies.size());
    for (auto& [name, p] : rc.parameters) refs.emplace_back(name, p->data());
    for (auto& [name, t] : copies) refs.emplace_back(name, t);
    io::save_options how;
    how.integrated_save = cfg_.integrated_save;
    std::vector<std::pair<std::string, dist_tensor<T>>> state;  // the optimizer's, host copies
    if (cfg_.save_training_state && rc.optimizer_state) {
      state = rc.optimizer_state();
      for (auto& [name, t] : state) refs.emplace_back(name, t);
    }
    if (cfg_.save_training_state && rc.training_state) how.metadata = rc.training_state();
    const std::filesystem::path file = dir_ / io::checkpoint_file_name(prefix_, rc.epoch, rc.step_in_epoch);
    const std::filesystem::path written = write(file, std::span<const io::param_ref>(refs), how);
    if (!cfg_.integrated_save || ctx_->rank() == 0) {
      const std::filesystem::path folder = written.has_parent_path() ? written.parent_path() : ".";
      io::rotate_checkpoints(folder, prefix_, cfg_.keep_checkpoint_max);
    }
    saved_.push_back(file);
    last_saved_ = rc.step;
  }

  // io::save_checkpoint over host memory: ctx itself, or, when its communicator takes
  // device buffers, a context over its host communicator (made at the first save).
  std::filesystem::path write(const std::filesystem::path& file, std::span<const io::param_ref> refs,
                              const io::save_options& how) {
    if (!ctx_->world().device_buffers()) return io::save_checkpoint(file, refs, *ctx_, how);
    if (!host_ctx_) host_ctx_ = std::make_unique<context>(*ctx_->world().host_communicator());
    return io::save_checkpoint(file, refs, *host_ctx_, how);
  }

  std::string prefix_;
  std::filesystem::path dir_;
  context* ctx_;
  std::unique_ptr<context> host_ctx_;
  config cfg_;
  std::int64_t last_saved_ = 0;
  std::vector<std::filesystem::path> saved_;
};

}  // namespace tessera::train
