// dataset: a lazily evaluated pipeline of rows (a source, then shuffle, map, batch,
// slice, repeat, prefetch), iterated one pass (epoch) at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/data/column.hpp>
#include <tessera/data/node.hpp>
#include <tessera/data/parallel_map.hpp>
#include <tessera/data/prefetch.hpp>
#include <tessera/data/random.hpp>
#include <tessera/tensor/copy_box.hpp>

namespace tessera::data {

namespace detail {

/// dataset::shuffle: MindSpore's buffer shuffle. The buffer is filled with the first
/// buffer_size rows; then, until the child and the buffer are empty, a uniformly
/// chosen buffer slot is emitted and refilled with the child's next row (or, once the
/// child is exhausted, with the buffer's last row). The generator is seeded by (seed,
/// pass), so every pass is shuffled differently and every run alike.
class shuffle_node final : public node {
 public:
  shuffle_node(node_ptr child, std::int64_t buffer_size, std::uint64_t seed)
      : child_(std::move(child)), buffer_size_(buffer_size), seed_(seed) {
    if (buffer_size < 1)
      throw error("shuffle: buffer_size must be at least 1: got " + std::to_string(buffer_size));
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    return std::make_unique<shuffle_cursor>(child_->open(pass), static_cast<std::size_t>(buffer_size_),
                                            rng(make_key({seed_, static_cast<std::uint64_t>(pass)})));
  }
  std::int64_t size() const override { return child_->size(); }
  const std::vector<std::string>& columns() const override { return child_->columns(); }

 private:
  class shuffle_cursor final : public cursor {
   public:
    shuffle_cursor(std::unique_ptr<cursor> c, std::size_t n, rng g) : child_(std::move(c)), n_(n), g_(g) {}
    std::optional<row> next() override {
      if (!filled_) {
        filled_ = true;
        while (buffer_.size() < n_) {
          std::optional<row> r = child_->next();
          if (!r) break;
          buffer_.push_back(std::move(*r));
        }
      }
      if (buffer_.empty()) return std::nullopt;
      const std::size_t k = static_cast<std::size_t>(g_.below(buffer_.size()));
      row out = std::move(buffer_[k]);
      if (std::optional<row> r = child_->next()) {
        buffer_[k] = std::move(*r);
      } else {
        if (k + 1 != buffer_.size()) buffer_[k] = std::move(buffer_.back());
        buffer_.pop_back();
      }
      return out;
    }

   private:
    std::unique_ptr<cursor> child_;
    std::size_t n_;
    rng g_;
    bool filled_ = false;
    std::vector<row> buffer_;
  };

  node_ptr child_;
  std::int64_t buffer_size_;
  std::uint64_t seed_;
};

/// "map: no column 'x'; the columns are v, w" unless `n` has column `column`.
inline void require_column(const node& n, const std::string& column, const char* op) {
  const auto& names = n.columns();
  for (const std::string& name : names)
    if (name == column) return;
  throw error(std::string(op) + ": no column '" + column + "'; the columns are " + row::join(names));
}

/// dataset::map: applies transforms, in order, to one column of every row; with
/// more than one worker, on that many threads (parallel_map_cursor), the rows in order.
class map_node final : public node {
 public:
  map_node(node_ptr child, std::vector<transform> ops, std::string column, int workers)
      : child_(std::move(child)), ops_(std::move(ops)), column_(std::move(column)), workers_(workers) {
    require_column(*child_, column_, "map");
    if (workers < 1)
      throw error("map: num_parallel_workers must be at least 1: got " + std::to_string(workers));
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    auto self = std::static_pointer_cast<const map_node>(shared_from_this());
    if (workers_ == 1) return std::make_unique<map_cursor>(std::move(self), child_->open(pass), pass);
    return std::make_unique<parallel_map_cursor>(
        child_->open(pass), [self, pass](row& r) { self->apply(r, pass); }, workers_);
  }
  std::int64_t size() const override { return child_->size(); }
  const std::vector<std::string>& columns() const override { return child_->columns(); }

 private:
  void apply(row& r, std::int64_t pass) const {
    array& v = r[column_];
    const sample_info info{r.index, pass};
    for (const transform& op : ops_) v = op(std::move(v), info);
  }

  class map_cursor final : public cursor {
   public:
    map_cursor(std::shared_ptr<const map_node> n, std::unique_ptr<cursor> c, std::int64_t pass)
        : node_(std::move(n)), child_(std::move(c)), pass_(pass) {}
    std::optional<row> next() override {
      std::optional<row> r = child_->next();
      if (r) node_->apply(*r, pass_);
      return r;
    }

   private:
    std::shared_ptr<const map_node> node_;
    std::unique_ptr<cursor> child_;
    std::int64_t pass_;
  };

  node_ptr child_;
  std::vector<transform> ops_;
  std::string column_;
  int workers_;
};

/// dataset::slice: each row's column `column` cut to rank `rank`'s shard of layout `l`
/// (geometry's shard_box: the same slicing as every other shard of tessera).
class slice_node final : public node {
 public:
  slice_node(node_ptr child, std::string column, layout l, int rank)
      : child_(std::move(child)), column_(std::move(column)), layout_(l), rank_(rank) {
    require_column(*child_, column_, "slice");
    if (const status st = check(l); !st.ok()) throw error(st, "slice: column '" + column_ + "': layout " + to_string(l));
    if (l.has_partial())
      throw error("slice: column '" + column_ + "': layout " + to_string(l) + " holds partial sums; data is whole");
    if (rank < 0 || rank >= l.dev.size())
      throw error("slice: column '" + column_ + "': rank " + std::to_string(rank) + " is out of range for mesh " +
                  to_string(l.dev) + " of " + std::to_string(l.dev.size()) + " ranks");
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    return std::make_unique<slice_cursor>(std::static_pointer_cast<const slice_node>(shared_from_this()),
                                          child_->open(pass));
  }
  std::int64_t size() const override { return child_->size(); }
  const std::vector<std::string>& columns() const override { return child_->columns(); }

 private:
  array cut(const array& v) const {
    const std::vector<std::size_t> dims = v.shape();
    if (dims.size() > std::size_t(max_tensor_ndim))
      throw error("slice: column '" + column_ + "': a value of rank " + std::to_string(dims.size()) +
                  ", more than " + std::to_string(max_tensor_ndim));
    extents shape;
    shape.ndim = int(dims.size());
    for (std::size_t d = 0; d < dims.size(); ++d) shape.v[d] = index_t(dims[d]);
    const std::string who = "slice: column '" + column_ + "' " + to_string(shape) + " in layout " +
                            to_string(layout_) + " on mesh " + to_string(layout_.dev);
    if (shape.ndim != layout_.ndim)
      throw error(who + ": the value has rank " + std::to_string(shape.ndim) + ", the layout " +
                  std::to_string(layout_.ndim));
    if (const status st = check(layout_, shape); !st.ok()) throw error(st, who);
    const box b = shard_box(layout_, shape, rank_);
    return v.visit([&](const auto& a) {
      using T = typename std::decay_t<decltype(a)>::value_type;
      xt::xarray<T> out = xt::xarray<T>::from_shape(
          std::vector<std::size_t>(b.shape.v.begin(), b.shape.v.begin() + b.shape.ndim));
      tessera::detail::copy_box(a.data(), shape, b.offset, out.data(), b.shape, tessera::detail::origin(shape.ndim),
                                b.shape);
      return array(std::move(out));
    });
  }

  class slice_cursor final : public cursor {
   public:
    slice_cursor(std::shared_ptr<const slice_node> n, std::unique_ptr<cursor> c)
        : node_(std::move(n)), child_(std::move(c)) {}
    std::optional<row> next() override {
      std::optional<row> r = child_->next();
      if (r) (*r)[node_->column_] = node_->cut((*r)[node_->column_]);
      return r;
    }

   private:
    std::shared_ptr<const slice_node> node_;
    std::unique_ptr<cursor> child_;
  };

  node_ptr child_;
  std::string column_;
  layout layout_;
  int rank_;
};

/// dataset::batch: stacks `size` consecutive rows column by column (data::stack). The
/// last, shorter batch is kept unless drop_remainder. A batch's index is its position
/// in the pass.
class batch_node final : public node {
 public:
  batch_node(node_ptr child, std::int64_t size, bool drop_remainder)
      : child_(std::move(child)), size_(size), drop_(drop_remainder) {
    if (size < 1) throw error("batch: the batch size must be at least 1: got " + std::to_string(size));
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    return std::make_unique<batch_cursor>(child_->open(pass), size_, drop_);
  }
  std::int64_t size() const override {
    const std::int64_t n = child_->size();
    return drop_ ? n / size_ : (n + size_ - 1) / size_;
  }
  const std::vector<std::string>& columns() const override { return child_->columns(); }

 private:
  class batch_cursor final : public cursor {
   public:
    batch_cursor(std::unique_ptr<cursor> c, std::int64_t size, bool drop)
        : child_(std::move(c)), size_(size), drop_(drop) {}
    std::optional<row> next() override {
      std::vector<row> rows;
      while (static_cast<std::int64_t>(rows.size()) < size_) {
        std::optional<row> r = child_->next();
        if (!r) break;
        rows.push_back(std::move(*r));
      }
      if (rows.empty() || (drop_ && static_cast<std::int64_t>(rows.size()) < size_)) return std::nullopt;
      row out;
      out.names = rows[0].names;
      out.index = count_++;
      for (std::size_t c = 0; c < out.names.size(); ++c) {
        std::vector<array> items;
        items.reserve(rows.size());
        for (row& r : rows) items.push_back(std::move(r.values[c]));
        out.values.push_back(stack(items, "batch: column '" + out.names[c] + "'"));
      }
      return out;
    }

   private:
    std::unique_ptr<cursor> child_;
    std::int64_t size_;
    bool drop_;
    std::int64_t count_ = 0;
  };

  node_ptr child_;
  std::int64_t size_;
  bool drop_;
};

/// dataset::repeat: `count` passes of the child, one after another. Pass p of the
/// repeated dataset runs the child's passes p * count ... p * count + count - 1.
class repeat_node final : public node {
 public:
  repeat_node(node_ptr child, std::int64_t count) : child_(std::move(child)), count_(count) {
    if (count < 1) throw error("repeat: the count must be at least 1: got " + std::to_string(count));
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    return std::make_unique<repeat_cursor>(child_, pass * count_, count_);
  }
  std::int64_t size() const override { return child_->size() * count_; }
  const std::vector<std::string>& columns() const override { return child_->columns(); }

 private:
  class repeat_cursor final : public cursor {
   public:
    repeat_cursor(node_ptr child, std::int64_t first, std::int64_t count)
        : child_(std::move(child)), pass_(first), end_(first + count) {}
    std::optional<row> next() override {
      while (pass_ < end_) {
        if (!cur_) cur_ = child_->open(pass_);
        if (std::optional<row> r = cur_->next()) return r;
        cur_.reset();
        ++pass_;
      }
      return std::nullopt;
    }

   private:
    node_ptr child_;
    std::int64_t pass_, end_;
    std::unique_ptr<cursor> cur_;
  };

  node_ptr child_;
  std::int64_t count_;
};

}  // namespace detail

/// An input iterator over one pass; compares equal to std::default_sentinel at the end.
class row_iterator {
 public:
  using value_type = row;
  using difference_type = std::ptrdiff_t;
  using reference = const row&;
  using iterator_category = std::input_iterator_tag;

  row_iterator() = default;
  explicit row_iterator(std::shared_ptr<detail::cursor> c) : cursor_(std::move(c)) { ++*this; }

  const row& operator*() const { return *row_; }
  const row* operator->() const { return &*row_; }
  row_iterator& operator++() {
    row_ = cursor_->next();
    return *this;
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const row_iterator& it, std::default_sentinel_t) { return !it.row_; }

 private:
  std::shared_ptr<detail::cursor> cursor_;
  std::optional<row> row_;
};

/// One pass over a dataset, as returned by dataset::epoch: a range of rows, or
/// next() until nullopt (both draw from the same pass). Destroying it (and the
/// iterators begin() returned) mid-pass stops the pass's prefetch threads.
class pass_iterator {
 public:
  explicit pass_iterator(std::unique_ptr<detail::cursor> c) : cursor_(std::move(c)) {}
  /// The next row, or nullopt once the pass is over.
  std::optional<row> next() { return cursor_->next(); }
  row_iterator begin() { return row_iterator(cursor_); }
  std::default_sentinel_t end() const { return {}; }

 private:
  std::shared_ptr<detail::cursor> cursor_;
};

/// A dataset: a description of rows, evaluated only while iterated. Every operation
/// returns a new dataset sharing this one's steps; datasets are cheap to copy and may
/// be iterated by several threads at once.
///
///     auto ds = data::mnist_dataset(dir, "train", {.num_shards = 8, .shard_id = rank})
///                   .map({data::rescale(1.0f / 255, 0), data::hwc2chw()}, "image")
///                   .shuffle(1024, 7)
///                   .batch(32, true)
///                   .prefetch(4);
///     for (std::int64_t e = 0; e < epochs; ++e)
///       for (const data::row& b : ds.epoch(e)) train_step(b["image"], b["label"]);
///
/// A prefetch thread starts with its pass, so the first batch of each epoch above is
/// made while the consumer waits. Put the epochs in one pass, `.repeat(epochs)` before
/// `.prefetch(n)`, and the next epoch's first batches are made during the last steps
/// of the one before: pass 0 of ds.repeat(n) runs passes 0 ... n - 1 of ds, each
/// shuffled and augmented as that epoch.
class dataset {
 public:
  explicit dataset(detail::node_ptr n) : node_(std::move(n)) {}

  /// MindSpore's shuffle(buffer_size): a buffer of `buffer_size` rows, from which a
  /// random row is emitted at each step; buffer_size >= size() is a full shuffle.
  dataset shuffle(std::int64_t buffer_size, std::uint64_t seed = 0) const {
    return wrap<detail::shuffle_node>(buffer_size, seed);
  }
  /// Applies `ops` in order to column `column` of every row, on `num_parallel_workers`
  /// threads (MindSpore's argument of that name; 1: on the consumer's thread). The rows
  /// are the same, in the same order, for any number of workers: a random transform is
  /// seeded by the row's index and the pass.
  dataset map(std::vector<transform> ops, const std::string& column, int num_parallel_workers = 1) const {
    return wrap<detail::map_node>(std::move(ops), column, num_parallel_workers);
  }
  /// Groups `size` consecutive rows into one, each column stacked along a new leading
  /// dim; the last, shorter batch is dropped when drop_remainder.
  dataset batch(std::int64_t size, bool drop_remainder = false) const {
    return wrap<detail::batch_node>(size, drop_remainder);
  }
  /// Cuts column `column` of every row to rank `rank`'s shard of layout `l` (a value of
  /// l's rank, its extents divisible by l's splits): MindSpore's per-input
  /// dataset_strategy, each rank feeding its piece of every input. After batch(), dim 0
  /// is the batch: layout(mesh{8}, {{}, {0}}) keeps every sample and gives rank r the
  /// r-th eighth of the features.
  ///
  ///     ds.batch(16).slice("image", layout(mesh{2, 4}, {{0}, {1}}), rank)  // (16, 32) -> (8, 8)
  dataset slice(const std::string& column, const layout& l, int rank) const {
    return wrap<detail::slice_node>(column, l, rank);
  }
  /// `count` passes of this dataset in one, each shuffled and augmented anew.
  dataset repeat(std::int64_t count) const { return wrap<detail::repeat_node>(count); }
  /// Runs this dataset's steps in a background thread, up to `depth` rows ahead of
  /// the consumer (data/prefetch.hpp).
  dataset prefetch(std::int64_t depth) const { return wrap<detail::prefetch_node>(depth); }

  /// Rows (or batches) one pass yields, MindSpore's get_dataset_size().
  std::int64_t get_dataset_size() const { return node_->size(); }
  const std::vector<std::string>& column_names() const { return node_->columns(); }

  /// Pass `e` (the epoch): sources' shuffles, shuffle buffers and random transforms are
  /// seeded by it, so every epoch differs and every run repeats them.
  pass_iterator epoch(std::int64_t e) const { return pass_iterator(node_->open(e)); }
  /// Iterates pass 0.
  row_iterator begin() const { return row_iterator(node_->open(0)); }
  std::default_sentinel_t end() const { return {}; }

 private:
  template <class Node, class... Args>
  dataset wrap(Args&&... args) const {
    return dataset(std::make_shared<Node>(node_, std::forward<Args>(args)...));
  }

  detail::node_ptr node_;
};

}  // namespace tessera::data
