// The pipeline's building blocks: a transform (what map applies to a column value),
// and the node/cursor pair every dataset operation implements.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/data/column.hpp>
#include <tessera/data/random.hpp>

namespace tessera::data {

/// An operation on one column value, as dataset::map applies it: any callable taking
/// an array (and optionally the sample_info of its row) and returning an array. The
/// vision transforms (data/transforms.hpp) are transforms; so is a lambda:
///
///     data::transform invert = [](data::array a) {
///       auto& x = a.get<std::uint8_t>();
///       x = 255 - x;
///       return a;
///     };
///
/// A transform may be called from a prefetch thread and by several iterators at once:
/// it must not change shared state. Random transforms draw from
/// rng::for_sample(seed, info), never from a generator they keep.
class transform {
 public:
  template <class F>
    requires std::is_invocable_r_v<array, const F&, array, const sample_info&>
  transform(F f) : f_(std::move(f)) {}  // NOLINT: implicit by design
  template <class F>
    requires(!std::is_invocable_r_v<array, const F&, array, const sample_info&> &&
             std::is_invocable_r_v<array, const F&, array>)
  transform(F f)  // NOLINT: implicit by design
      : f_([g = std::move(f)](array a, const sample_info&) { return g(std::move(a)); }) {}

  array operator()(array a, const sample_info& s) const { return f_(std::move(a), s); }

 private:
  std::function<array(array, const sample_info&)> f_;
};

namespace detail {

/// One pass over a node's rows, in order; nullopt at the end.
class cursor {
 public:
  virtual ~cursor() = default;
  virtual std::optional<row> next() = 0;
};

/// One dataset operation (a source or a pipeline step). Immutable once built and
/// shared between the datasets built on it; each pass opens its own cursor, which
/// keeps the node alive.
class node : public std::enable_shared_from_this<node> {
 public:
  virtual ~node() = default;
  /// A cursor for pass `pass` (0 for the first epoch; see dataset::epoch).
  virtual std::unique_ptr<cursor> open(std::int64_t pass) const = 0;
  /// Rows per pass.
  virtual std::int64_t size() const = 0;
  virtual const std::vector<std::string>& columns() const = 0;
};

using node_ptr = std::shared_ptr<const node>;

}  // namespace detail
}  // namespace tessera::data
