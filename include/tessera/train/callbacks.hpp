// Callbacks of Model::train (MindSpore's mindspore.train.Callback): hooks at the
// beginning and end of the training, of each epoch and of each step, given a
// run_context. LossMonitor prints the seeds' line `epoch: E step: S, loss is L`,
// TimeMonitor the epoch and step times, ProgressBar a one-line bar on rank 0 when
// stdout is a terminal.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <iostream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>
#include <unistd.h>
#include <tessera/core/error.hpp>
#include <tessera/nn/module.hpp>

namespace tessera::train {

/// What a callback sees (MindSpore's RunContext and its cb_params). Counts start at 1.
template <class T = float>
struct run_context {
  int epoch = 0;                      ///< the current epoch (cur_epoch_num)
  int epochs = 0;                     ///< epochs to train (epoch_num)
  std::int64_t step = 0;              ///< steps so far over the whole training (cur_step_num)
  std::int64_t step_in_epoch = 0;     ///< steps so far in this epoch
  std::int64_t steps_per_epoch = -1;  ///< batches per epoch (batch_num); -1 if not known
  double loss = 0;                    ///< the step's loss over the global batch, the same on every rank
  double step_seconds = 0;            ///< the step's wall time (forward, backward, reduction, update)
  std::int64_t batch_samples = 0;     ///< samples in the step's global batch
  int rank = 0;                       ///< this rank
  int ranks = 1;                      ///< the number of ranks
  /// The network's parameters with their dotted names (for checkpoints); empty for a
  /// network on another device (see host_parameters).
  std::vector<std::pair<std::string, nn::parameter<T>*>> parameters;
  /// For a network on a device other than the host (a GPU): its parameters copied to
  /// the host, with their dotted names, layouts and ranks (waits for the device; each
  /// call copies). Unset (empty) for a host network, whose `parameters` are the tensors
  /// themselves.
  std::function<std::vector<std::pair<std::string, dist_tensor<T>>>()> host_parameters;
  /// The optimizer's state as host tensors, named and laid out for checkpoints
  /// (optim::optimizer::state_tensors); set by model.train.
  std::function<std::vector<std::pair<std::string, dist_tensor<T>>>()> optimizer_state;
  /// What a resumed training needs besides the tensors, as checkpoint metadata: the
  /// position (epoch, step), the optimizer's step count, the dropout layers' draws; set
  /// by model.train (model.resume_from reads it back).
  std::function<std::map<std::string, std::string>()> training_state;
  /// Set by a callback to end the training after this step (MindSpore's request_stop).
  bool stop_requested = false;
  void request_stop() { stop_requested = true; }
};

/// The base of the callbacks: every hook does nothing unless overridden. Every rank
/// calls every hook at the same point; a hook that communicates must do so on every
/// rank.
template <class T = float>
class callback {
 public:
  virtual ~callback() = default;
  virtual void on_train_begin(run_context<T>&) {}
  virtual void on_epoch_begin(run_context<T>&) {}
  virtual void on_step_begin(run_context<T>&) {}
  virtual void on_step_end(run_context<T>&) {}
  virtual void on_epoch_end(run_context<T>&) {}
  virtual void on_train_end(run_context<T>&) {}
};

namespace detail {
/// A loss as MindSpore prints it: 8 significant digits ("2.3026438").
inline std::string loss_text(double loss) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.8g", loss);
  return buf;
}
}  // namespace detail

/// MindSpore's LossMonitor(per_print_times): every `per_print_times` steps of an epoch,
/// on every rank, `epoch: E step: S, loss is L` (S counts the epoch's steps from 1).
template <class T = float>
class loss_monitor : public callback<T> {
 public:
  explicit loss_monitor(int per_print_times = 1, std::ostream& out = std::cout) : every_(per_print_times), out_(&out) {
    if (per_print_times < 1)
      throw error("loss_monitor: per_print_times must be at least 1, got " + std::to_string(per_print_times));
  }
  void on_step_end(run_context<T>& rc) override {
    if (!std::isfinite(rc.loss))
      throw error("loss_monitor: the loss is " + detail::loss_text(rc.loss) + " at epoch " +
                  std::to_string(rc.epoch) + " step " + std::to_string(rc.step_in_epoch) + ": training has diverged");
    if (rc.step_in_epoch % every_ == 0)
      *out_ << "epoch: " << rc.epoch << " step: " << rc.step_in_epoch << ", loss is " << detail::loss_text(rc.loss)
            << "\n"
            << std::flush;
  }

 private:
  int every_;
  std::ostream* out_;
};

/// MindSpore's TimeMonitor: at the end of each epoch, on rank 0,
/// `epoch time: X ms, per step time: Y ms`. Keeps the mean step time of the training.
template <class T = float>
class time_monitor : public callback<T> {
 public:
  explicit time_monitor(std::ostream& out = std::cout) : out_(&out) {}
  void on_epoch_begin(run_context<T>&) override {
    epoch_seconds_ = 0;
    epoch_steps_ = 0;
  }
  void on_step_end(run_context<T>& rc) override {
    epoch_seconds_ += rc.step_seconds;
    total_seconds_ += rc.step_seconds;
    ++epoch_steps_;
    ++total_steps_;
  }
  void on_epoch_end(run_context<T>& rc) override {
    if (rc.rank != 0 || epoch_steps_ == 0) return;
    char buf[96];
    std::snprintf(buf, sizeof buf, "epoch time: %.3f ms, per step time: %.3f ms\n", epoch_seconds_ * 1e3,
                  epoch_seconds_ * 1e3 / double(epoch_steps_));
    *out_ << buf << std::flush;
  }
  /// The mean step time so far, in milliseconds (0 before any step).
  double mean_step_ms() const { return total_steps_ ? total_seconds_ * 1e3 / double(total_steps_) : 0.0; }

 private:
  std::ostream* out_;
  double epoch_seconds_ = 0, total_seconds_ = 0;
  std::int64_t epoch_steps_ = 0, total_steps_ = 0;
};

/// One line of progress: `[=======>      ] 120/1875 epoch 1/10 loss 0.34561 2345 samples/s ETA 0:12`
/// (without the bar when the epoch's length is unknown). `seconds_left` < 0 leaves ETA out.
inline std::string progress_line(std::int64_t step, std::int64_t steps, int epoch, int epochs, double loss,
                                 double samples_per_second, double seconds_left, int width = 24) {
  std::string s;
  if (steps > 0) {
    const int done = int(std::min<std::int64_t>(width, step * width / steps));
    s.push_back('[');
    s.append(std::size_t(done), '=');
    if (done < width) {
      s.push_back('>');
      s.append(std::size_t(width - done - 1), ' ');
    }
    s.append("] ").append(std::to_string(step)).append("/").append(std::to_string(steps));
  } else {
    s.append("step ").append(std::to_string(step));
  }
  char buf[128];
  std::snprintf(buf, sizeof buf, " epoch %d/%d loss %.5g %.0f samples/s", epoch, epochs, loss, samples_per_second);
  s += buf;
  if (seconds_left >= 0) {
    const long long t = std::llround(seconds_left);
    std::snprintf(buf, sizeof buf, " ETA %lld:%02lld", t / 60, t % 60);
    s += buf;
  }
  return s;
}

/// A progress bar on rank 0, redrawn in place after every step, only when stdout is a
/// terminal (or `force`): steps, loss, samples per second and the time left.
template <class T = float>
class progress_bar : public callback<T> {
 public:
  explicit progress_bar(std::ostream& out = std::cout, bool force = false) : out_(&out), force_(force) {}
  void on_train_begin(run_context<T>& rc) override {
    active_ = rc.rank == 0 && (force_ || ::isatty(STDOUT_FILENO) == 1);
    seconds_ = 0;
    steps_ = 0;
    samples_ = 0;
  }
  void on_step_end(run_context<T>& rc) override {
    seconds_ += rc.step_seconds;
    samples_ += double(rc.batch_samples);
    ++steps_;
    if (!active_) return;
    const double per_step = seconds_ / double(steps_);
    double left = -1;
    if (rc.steps_per_epoch > 0)
      left = per_step * double((rc.epochs - rc.epoch) * rc.steps_per_epoch + rc.steps_per_epoch - rc.step_in_epoch);
    *out_ << "\r" << progress_line(rc.step_in_epoch, rc.steps_per_epoch, rc.epoch, rc.epochs, rc.loss,
                                   seconds_ > 0 ? samples_ / seconds_ : 0.0, left)
          << std::flush;
  }
  void on_epoch_end(run_context<T>&) override {
    if (active_) *out_ << "\n" << std::flush;
  }
  /// Whether it draws (rank 0 and a terminal, or forced); known once training began.
  bool active() const { return active_; }

 private:
  std::ostream* out_;
  bool force_;
  bool active_ = false;
  double seconds_ = 0, samples_ = 0;
  std::int64_t steps_ = 0;
};

}  // namespace tessera::train
