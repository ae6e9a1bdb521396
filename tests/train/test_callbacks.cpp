// Tests of train/callbacks.hpp on one process: LossMonitor's line (the seeds' format)
// every N steps and its error on a diverged loss, TimeMonitor's epoch line and mean,
// the progress line's bar, rate and time left, and the progress bar drawing only on
// rank 0 of a terminal (or when forced).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <tessera/train/callbacks.hpp>

using namespace tessera;

TEST_CASE("loss_monitor: `epoch: E step: S, loss is L` every per_print_times steps") {
  std::ostringstream out;
  train::loss_monitor<float> lm(2, out);
  train::run_context<float> rc;
  rc.epoch = 3;
  for (int s = 1; s <= 5; ++s) {
    rc.step_in_epoch = s;
    rc.loss = 2.3026438 - 0.01 * s;
    lm.on_step_end(rc);
  }
  CHECK(out.str() == "epoch: 3 step: 2, loss is 2.2826438\nepoch: 3 step: 4, loss is 2.2626438\n");
  rc.loss = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(lm.on_step_end(rc), "loss_monitor: the loss is nan at epoch 3 step 5: training has diverged");
  CHECK_THROWS_WITH(train::loss_monitor<float>(0), "loss_monitor: per_print_times must be at least 1, got 0");
}

TEST_CASE("time_monitor: the epoch's time and mean step time, on rank 0") {
  std::ostringstream out;
  train::time_monitor<float> tm(out);
  train::run_context<float> rc;
  tm.on_epoch_begin(rc);
  for (double s : {0.002, 0.004}) {
    rc.step_seconds = s;
    tm.on_step_end(rc);
  }
  tm.on_epoch_end(rc);
  CHECK(out.str() == "epoch time: 6.000 ms, per step time: 3.000 ms\n");
  CHECK(tm.mean_step_ms() == doctest::Approx(3.0));
  std::ostringstream other;
  train::time_monitor<float> quiet(other);
  rc.rank = 1;
  quiet.on_epoch_begin(rc);
  quiet.on_step_end(rc);
  quiet.on_epoch_end(rc);
  CHECK(other.str().empty());
}

TEST_CASE("progress_line: bar, counts, loss, rate and time left") {
  CHECK(train::progress_line(5, 10, 1, 2, 0.5, 1234.4, 75.4, 10) ==
        "[=====>    ] 5/10 epoch 1/2 loss 0.5 1234 samples/s ETA 1:15");
  CHECK(train::progress_line(10, 10, 2, 2, 0.25, 100, 0, 4) == "[====] 10/10 epoch 2/2 loss 0.25 100 samples/s ETA 0:00");
  CHECK(train::progress_line(7, -1, 1, 3, 1.0, 50, -1) == "step 7 epoch 1/3 loss 1 50 samples/s");
}

TEST_CASE("progress_bar: draws in place on rank 0 when forced or on a terminal") {
  std::ostringstream out;
  train::progress_bar<float> bar(out, true);
  train::run_context<float> rc;
  rc.epochs = 1;
  rc.epoch = 1;
  rc.steps_per_epoch = 2;
  bar.on_train_begin(rc);
  CHECK(bar.active());
  rc.step_in_epoch = 1;
  rc.step_seconds = 0.5;
  rc.batch_samples = 64;
  rc.loss = 1.5;
  bar.on_step_end(rc);
  CHECK(out.str().rfind("\r[", 0) == 0);
  CHECK(out.str().find("1/2 epoch 1/1 loss 1.5 128 samples/s ETA 0:01") != std::string::npos);
  bar.on_epoch_end(rc);
  CHECK(out.str().back() == '\n');

  std::ostringstream none;
  train::progress_bar<float> off(none, true);
  rc.rank = 1;
  off.on_train_begin(rc);
  off.on_step_end(rc);
  CHECK(!off.active());
  CHECK(none.str().empty());
}
