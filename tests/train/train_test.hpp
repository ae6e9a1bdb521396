// Shared by the train tests (host and GPU): a small MLP of the seed's shape on any
// device, synthetic batches and their shards, gathering shards, and a temporary folder
// shared by the ranks.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/graph/parallel.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>

namespace train_test {

using namespace tessera;

constexpr index_t IN = 12, HID = 16, OUT = 4;

/// The seed's MLP at a small size on device D: Flatten, Dense-ReLU-Dense-ReLU-Dense,
/// normal weights.
template <class D>
struct basic_mlp : nn::module<float, D> {
  using dense = nn::dense<float, D>;
  using relu = nn::relu<float, D>;
  nn::flatten<float, D> flatten;
  nn::sequential<dense, relu, dense, relu, dense> seq{dense(IN, HID, nn::initializer::normal(0.3), "uniform"), relu(),
                                                      dense(HID, HID, nn::initializer::normal(0.3), "uniform"), relu(),
                                                      dense(HID, OUT, nn::initializer::normal(0.3), "uniform")};
  void visit(nn::visitor<float, D>& v) override {
    v.child("flatten", flatten);
    v.child("seq", seq);
  }
  template <class V>
  V operator()(V x) {
    return seq(flatten(x));
  }
};
using mlp = basic_mlp<cpu_device>;

/// A parallel configuration of mode `m` and search `s`.
inline graph::parallel_config mode(graph::parallel_mode m, graph::search_mode s = graph::search_mode::sharding_propagation) {
  graph::parallel_config c;
  c.mode = m;
  c.search = s;
  return c;
}

using batch_t = std::pair<xt::xarray<float>, xt::xarray<std::int32_t>>;

/// Global batch `step` of `rows` samples: inputs (rows, 3, 4) and labels in [0, OUT),
/// the label a function of the inputs (learnable).
inline batch_t batch(std::int64_t step, std::size_t rows) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({rows, 3, 4});
  xt::xarray<std::int32_t> y = xt::xarray<std::int32_t>::from_shape({rows});
  for (std::size_t i = 0; i < rows; ++i) {
    const std::uint64_t s = std::uint64_t(step) * 1000003u + i;
    float best = -1e30f;
    for (std::size_t k = 0; k < 12; ++k) {
      const float v = float(nn::random_stream(s).uniform01(k)) * 2.0f - 1.0f;
      x.data()[i * 12 + k] = v;
      if (k < std::size_t(OUT) && v > best) {
        best = v;
        y(i) = std::int32_t(k);
      }
    }
  }
  return {x, y};
}

/// Rows [r b, (r + 1) b) of a global array: rank r's block of a batch split over p ranks.
template <class T>
xt::xarray<T> block(const xt::xarray<T>& g, int r, int p) {
  const std::size_t rows = g.shape()[0] / std::size_t(p), row = g.size() / g.shape()[0];
  auto shape = g.shape();
  shape[0] = rows;
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  std::copy(g.data() + std::size_t(r) * rows * row, g.data() + std::size_t(r + 1) * rows * row, out.data());
  return out;
}

/// Rank r's rows of a global batch split over p ranks.
inline batch_t rows_of(const batch_t& g, int r, int p) { return {block(g.first, r, p), block(g.second, r, p)}; }

/// Rank r's blocks of `steps` global batches of `rows` samples, from batch `first`.
inline std::vector<batch_t> shard(int steps, std::size_t rows, int r, int p, std::int64_t first = 0) {
  std::vector<batch_t> out;
  for (int s = 0; s < steps; ++s) {
    out.push_back(rows_of(batch(first + s, rows), r, p));
  }
  return out;
}

/// Global batch s of a convolutional network's test: images (rows, 3, size, size) of
/// pseudo-random values in [-1, 1), labels in [0, classes). No two pixels are equal by
/// construction: equal values make exact ties in max pooling, and which of the tied
/// elements takes the gradient then turns on the last bit of the convolutions before it,
/// which the kernels' choice of algorithm per shard shape changes (a subgradient, not a
/// parallel difference).
inline batch_t image_batch(int s, std::size_t rows, std::size_t size, std::int32_t classes) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({rows, 3, size, size});
  const nn::random_stream pixels(std::uint64_t(s) + 101);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(2.0 * pixels.uniform01(i) - 1.0);
  xt::xarray<std::int32_t> y = xt::xarray<std::int32_t>::from_shape({rows});
  for (std::size_t i = 0; i < y.size(); ++i) y(i) = std::int32_t((i * 3 + std::size_t(s)) % std::size_t(classes));
  return {x, y};
}

/// A fresh folder, the same on every rank of `world` (rank 0 makes it); removed at the
/// end.
template <class W>
struct temp_folder {
  W& world;
  std::filesystem::path path;
  explicit temp_folder(W& w) : world(w) {
    std::vector<char> name(256, '\0');
    if (w.rank() == 0) {
      std::string t = (std::filesystem::temp_directory_path() / "tessera-ckpt-XXXXXX").string();
      if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("temp_folder: mkdtemp failed for " + t);
      std::copy(t.begin(), t.end(), name.begin());
    }
    w.broadcast(std::span<char>(name), 0);
    path = std::string(name.data());
  }
  ~temp_folder() {
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(path);
  }
};

/// x and y as dist_tensors with the batch split over the ranks of ctx.
inline std::pair<dist_tensor<float>, dist_tensor<std::int32_t>> split_batch(
    const std::pair<xt::xarray<float>, xt::xarray<std::int32_t>>& g, context& ctx) {
  const int p = ctx.size(), r = ctx.rank();
  const index_t rows = index_t(g.first.shape()[0]);
  return {dist_tensor<float>(layout(mesh{p}, {{0}, {}, {}}), extents{rows, 3, 4}, r, block(g.first, r, p)),
          dist_tensor<std::int32_t>(layout(mesh{p}, {{0}}), extents{rows}, r, block(g.second, r, p))};
}

/// The global values of x (partial sums resolved).
template <class T>
xt::xarray<T> gather(const dist_tensor<T>& x, context& ctx) {
  return redistribute(x, layout::replicated(x.layout().dev, x.ndim()), ctx).local();
}

inline double max_rel_diff(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a.data()[i]) - double(b.data()[i])) / (1e-3 + std::abs(double(b.data()[i]))));
  return worst;
}

}  // namespace train_test
