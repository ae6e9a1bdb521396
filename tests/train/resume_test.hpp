// Shared by the resume tests (test_resume.cpp, and resume_worker.cpp, the job that
// test_resume_job.py kills and restarts): a small network with a Dropout layer, whose
// draws a resumed training must continue, and batches that differ from epoch to epoch,
// as a shuffled dataset's.
#pragma once

#include <cstdint>
#include <vector>
#include <tessera/nn/layers.hpp>

#include "train_test.hpp"

namespace resume_test {

using namespace tessera;
using train_test::batch_t;

constexpr int steps_per_epoch = 4, epochs = 3;
constexpr std::size_t rows = 16;

/// Flatten, Dense with ReLU, Dropout(0.25), Dense.
struct network : nn::module<float> {
  nn::flatten<float> flatten;
  nn::dense<float> fc{train_test::IN, train_test::HID, nn::initializer::normal(0.3), {}, true, nn::activation::relu};
  nn::dropout<float> drop{0.25};
  nn::dense<float> out{train_test::HID, train_test::OUT, nn::initializer::normal(0.3)};

  void visit(nn::visitor<float>& v) override {
    v.child("flatten", flatten);
    v.child("fc", fc);
    v.child("drop", drop);
    v.child("out", out);
  }
  template <class V>
  V operator()(V x) {
    return out(drop(fc(flatten(x))));
  }
};

/// Each epoch its own batches: rank r's rows of them, or the whole batches for the
/// modes that read them whole.
struct epoch_batches {
  int r, p;
  bool whole = false;
  std::vector<batch_t> epoch(std::int64_t e) const {
    return train_test::shard(steps_per_epoch, rows, whole ? 0 : r, whole ? 1 : p, e * steps_per_epoch);
  }
  std::size_t size() const { return steps_per_epoch; }
};

}  // namespace resume_test
