// Sources: random-access samples read in shards (num_shards / shard_id), optionally
// shuffled first; generator_dataset, a source from a C++ callable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/data/column.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/node.hpp>
#include <tessera/data/random.hpp>

namespace tessera::data {

/// How a source reads its samples. Every source (mnist_dataset, cifar10_dataset,
/// generator_dataset) takes one:
///
///     data::mnist_dataset(dir, "train", {.num_shards = 8, .shard_id = rank, .shuffle = true, .seed = 1})
///
/// Sharding, MindSpore's distributed sampler: the n samples (after the shuffle, if
/// any) are dealt round-robin, sample position p to shard p mod num_shards, and each
/// shard reads ceil(n / num_shards) of them. When num_shards does not divide n, the
/// positions n, n + 1, ... that complete the last round wrap around to the first
/// samples (position p reads sample p mod n): shards shard_id >= n mod num_shards read
/// one sample at their end that another shard also reads. So the positions below n
/// are disjoint between shards, together they read every sample, and all shards read
/// the same number: 10 samples on 4 shards give shard 0 {0, 4, 8}, 1 {1, 5, 9},
/// 2 {2, 6, 0}, 3 {3, 7, 1}.
///
/// Shuffle: the n samples are permuted (Fisher-Yates, seeded by (seed, pass)) before
/// sharding. Every rank draws the same permutation, so the shards stay disjoint; each
/// epoch draws a new one.
struct shard_options {
  std::int64_t num_shards = 1;
  std::int64_t shard_id = 0;
  bool shuffle = false;
  std::uint64_t seed = 0;
};

/// Rows per shard: ceil(n / num_shards).
constexpr std::int64_t shard_size(std::int64_t n, std::int64_t num_shards) {
  return (n + num_shards - 1) / num_shards;
}

/// The source indices, in order, that shard `o.shard_id` reads in pass `pass` from a
/// source of n samples (the rule of shard_options).
inline std::vector<std::int64_t> shard_indices(std::int64_t n, const shard_options& o, std::int64_t pass = 0) {
  std::vector<std::int64_t> perm;
  if (o.shuffle) {
    perm.resize(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), std::int64_t{0});
    rng g(make_key({o.seed, static_cast<std::uint64_t>(pass), 0x5348554646ull}));
    for (std::int64_t i = n - 1; i > 0; --i)
      std::swap(perm[static_cast<std::size_t>(i)],
                perm[static_cast<std::size_t>(g.below(static_cast<std::uint64_t>(i) + 1))]);
  }
  std::vector<std::int64_t> out;
  const std::int64_t m = n == 0 ? 0 : shard_size(n, o.num_shards);
  out.reserve(static_cast<std::size_t>(m));
  for (std::int64_t j = 0; j < m; ++j) {
    const std::int64_t p = (j * o.num_shards + o.shard_id) % n;
    out.push_back(o.shuffle ? perm[static_cast<std::size_t>(p)] : p);
  }
  return out;
}

namespace detail {

/// "<name>: shard_id must be in [0, num_shards): ..." when `o` is not a valid shard.
inline void check_shard_options(const std::string& name, const shard_options& o) {
  if (o.num_shards < 1)
    throw error(name + ": num_shards must be at least 1: got " + std::to_string(o.num_shards));
  if (o.shard_id < 0 || o.shard_id >= o.num_shards)
    throw error(name + ": shard_id must be in [0, num_shards): shard_id " + std::to_string(o.shard_id) +
                ", num_shards " + std::to_string(o.num_shards));
}

/// One pass's access to a source's samples (it may hold open files).
class source_reader {
 public:
  virtual ~source_reader() = default;
  /// The column values of sample `index`, in the order of source::columns().
  virtual std::vector<array> read(std::int64_t index) = 0;
};

/// A source's samples, by index. Immutable; each pass reads through its own reader.
class source {
 public:
  virtual ~source() = default;
  virtual std::int64_t count() const = 0;
  virtual const std::vector<std::string>& columns() const = 0;
  virtual std::unique_ptr<source_reader> reader() const = 0;
};

/// The node reading this shard's samples of a source.
class source_node final : public node {
 public:
  source_node(std::string name, std::shared_ptr<const source> src, shard_options o)
      : src_(std::move(src)), opts_(o) {
    check_shard_options(name, o);
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    return std::make_unique<source_cursor>(std::static_pointer_cast<const source_node>(shared_from_this()),
                                           shard_indices(src_->count(), opts_, pass));
  }
  std::int64_t size() const override { return shard_size(src_->count(), opts_.num_shards); }
  const std::vector<std::string>& columns() const override { return src_->columns(); }

 private:
  class source_cursor final : public cursor {
   public:
    source_cursor(std::shared_ptr<const source_node> n, std::vector<std::int64_t> indices)
        : node_(std::move(n)), indices_(std::move(indices)) {}
    std::optional<row> next() override {
      if (pos_ == indices_.size()) return std::nullopt;
      if (!reader_) reader_ = node_->src_->reader();
      row r;
      r.index = indices_[pos_++];
      r.names = node_->src_->columns();
      r.values = reader_->read(r.index);
      return r;
    }

   private:
    std::shared_ptr<const source_node> node_;
    std::vector<std::int64_t> indices_;
    std::size_t pos_ = 0;
    std::unique_ptr<source_reader> reader_;
  };

  std::shared_ptr<const source> src_;
  shard_options opts_;
};

/// generator_dataset's source.
class generator_source final : public source {
 public:
  using function = std::function<std::vector<array>(std::int64_t)>;
  generator_source(function f, std::vector<std::string> columns, std::int64_t n)
      : f_(std::move(f)), columns_(std::move(columns)), n_(n) {}
  std::int64_t count() const override { return n_; }
  const std::vector<std::string>& columns() const override { return columns_; }
  std::unique_ptr<source_reader> reader() const override { return std::make_unique<generator_reader>(*this); }

 private:
  class generator_reader final : public source_reader {
   public:
    explicit generator_reader(const generator_source& s) : s_(s) {}
    std::vector<array> read(std::int64_t index) override {
      std::vector<array> v = s_.f_(index);
      if (v.size() != s_.columns_.size())
        throw error("generator_dataset: the callable must return one value per column: it returned " +
                    std::to_string(v.size()) + " values for " + std::to_string(s_.columns_.size()) +
                    " columns (" + row::join(s_.columns_) + ") at index " + std::to_string(index));
      return v;
    }

   private:
    const generator_source& s_;
  };

  function f_;
  std::vector<std::string> columns_;
  std::int64_t n_;
};

}  // namespace detail

/// A dataset of `size` samples made by a callable: `f(i)` returns the column values
/// of sample i (one array per name in `columns`, in that order), for i in [0, size).
/// The samples are sharded and shuffled by index as shard_options says. `f` is called
/// from the consumer's thread or a prefetch thread, one call at a time in a pass;
/// passes iterated at once (several iterators) call it concurrently.
///
///     auto ds = data::generator_dataset(
///         [](std::int64_t i) {
///           return std::vector<data::array>{xt::xarray<float>{float(i), 2.0f * i},
///                                           data::array::scalar(std::int32_t(i % 2))};
///         },
///         {"x", "y"}, 100, {.num_shards = 4, .shard_id = rank});
inline dataset generator_dataset(std::function<std::vector<array>(std::int64_t)> f,
                                 std::vector<std::string> columns, std::int64_t size, shard_options o = {}) {
  if (!f) throw error("generator_dataset: the callable is empty");
  if (size < 0) throw error("generator_dataset: size must not be negative: got " + std::to_string(size));
  if (columns.empty()) throw error("generator_dataset: at least one column name is needed");
  for (std::size_t i = 0; i < columns.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (columns[i] == columns[j]) throw error("generator_dataset: column '" + columns[i] + "' is named twice");
  auto src = std::make_shared<detail::generator_source>(std::move(f), std::move(columns), size);
  return dataset(std::make_shared<detail::source_node>("generator_dataset", std::move(src), o));
}

}  // namespace tessera::data
