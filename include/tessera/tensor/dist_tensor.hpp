// dist_tensor: a global shape, a layout over a mesh, and this rank's shard on a
// device (an xtensor container on the host, a device array on a GPU). The layout (and
// optionally the shape) can be template arguments, checked by the compiler, or
// run-time values, checked on construction. A host shard may also be held in a kernel's
// own layout (tensor/host_form.hpp).
#pragma once

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/host_form.hpp>
#include <tessera/tensor/host_storage.hpp>

namespace tessera {

/// Marks a layout or shape argument of dist_tensor as known only at run time.
struct dynamic_t {
  friend constexpr bool operator==(dynamic_t, dynamic_t) = default;
};
inline constexpr dynamic_t dynamic{};

namespace detail {
template <auto L>
inline constexpr bool is_static_layout = std::is_same_v<std::remove_cvref_t<decltype(L)>, layout>;
template <auto G>
inline constexpr bool is_static_shape = std::is_same_v<std::remove_cvref_t<decltype(G)>, extents>;
/// A static shape none of whose extents is dynamic_extent.
template <auto G>
inline constexpr bool is_fully_static_shape = [] {
  if constexpr (is_static_shape<G>) return G.is_static();
  else return false;
}();

template <auto L, auto G>
constexpr bool check_static_arguments() {
  static_assert(is_static_layout<L> || std::is_same_v<std::remove_cvref_t<decltype(L)>, dynamic_t>,
                "dist_tensor: the layout argument must be a tessera::layout or tessera::dynamic");
  static_assert(is_static_shape<G> || std::is_same_v<std::remove_cvref_t<decltype(G)>, dynamic_t>,
                "dist_tensor: the shape argument must be a tessera::extents or tessera::dynamic");
  if constexpr (is_static_layout<L> && is_static_shape<G>) {
    return static_require<check(L, G)>();
  } else if constexpr (is_static_layout<L>) {
    return static_require<check(L)>();
  } else {
    static_assert(!is_static_shape<G>, "dist_tensor: a static shape needs a static layout");
    return true;
  }
}

// Multi-index iteration over a row-major box, calling f(index array, linear offset).
template <class F>
void for_each_index(const extents& shape, F&& f) {
  const index_t n = shape.size();
  std::array<index_t, max_tensor_ndim> idx{};
  for (index_t lin = 0; lin < n; ++lin) {
    f(idx, lin);
    for (int d = shape.ndim - 1; d >= 0; --d) {
      if (++idx[d] < shape.v[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace detail

/// A distributed tensor of element type T on this rank.
///
/// - `dist_tensor<float, L, extents{16, 32}>`: layout and shape static; an invalid
///   pair fails to compile, and `static_local_shape()` is a constant.
/// - `dist_tensor<float, L>`: static layout, shape given at run time (its extents
///   are checked against L on construction).
/// - `dist_tensor<float>`: layout and shape given at run time.
/// - The fourth argument is the device of the shard: `cpu_device` (the default; an
///   `xt::xarray<T>`) or `cuda_device` (a `cuda::device_array<T>`, with
///   <tessera/cuda.hpp>). `tensor_on<float, cuda_device>` names the run-time form.
///
/// The local shard (`storage<T, D>::array`) has shape local_shape(layout, global),
/// row-major. For a partial layout it holds this rank's partial values.
///
/// A host shard may also be held in a kernel's layout (a host_form: the convolutions
/// keep their weights in oneDNN's), beside the row-major array or instead of it: form()
/// gives it to the kernels that understand it, and local() and data() make the
/// row-major array from it when it is not current. The non-const local() and data()
/// drop the form, since the caller may write the array. A copy holds the row-major
/// values only. A tensor read from several threads at once must not be given a form
/// (keep_form) at the same time.
template <class T, auto L = dynamic, auto Global = dynamic, class D = cpu_device>
class dist_tensor {
  static_assert(detail::check_static_arguments<L, Global>());
  static_assert(device<D>, "dist_tensor: the device must be tessera::cpu_device or tessera::cuda_device");

 public:
  using value_type = T;
  using device_type = D;
  using storage_type = storage<T, D>;
  /// The shard's type: xt::xarray<T> on the host.
  using array_type = typename storage_type::array;
  static constexpr bool static_layout = detail::is_static_layout<L>;
  static constexpr bool static_shape = detail::is_static_shape<Global>;

  /// Fully static: shape and layout from the template arguments (every extent known).
  explicit dist_tensor(int rank)
    requires(static_layout && detail::is_fully_static_shape<Global>)
      : dist_tensor(L, Global, rank) {}
  /// Static layout, run-time shape.
  dist_tensor(const extents& global, int rank)
    requires(static_layout)
      : dist_tensor(L, global, rank) {}
  /// Run-time layout (must equal L when L is static).
  dist_tensor(const tessera::layout& l, const extents& global, int rank)
      : layout_(store_layout(l)), global_(global), rank_(rank) {
    if constexpr (static_layout) {
      if (!(l == L))
        throw error(fail(errc::static_layout_mismatch),
                    "dist_tensor " + to_string(l) + " vs " + to_string(L));
    }
    if constexpr (static_shape) {
      // static_shape_mismatch's rule already names dist_tensor.
      const status s = check_matches_static(global);
      require(s, s.code == errc::static_shape_mismatch ? "" : "dist_tensor");
    }
    require(check(l, global), "dist_tensor");
    for (int d = 0; d < global.ndim; ++d)  // a shard needs every extent known
      if (global.v[d] == dynamic_extent)
        throw error(fail(errc::negative_extent, d, -1, global.v[d]), "dist_tensor");
    if (rank < 0 || rank >= l.dev.size())
      throw error(fail(errc::rank_out_of_range, -1, -1, rank, l.dev.size()), "dist_tensor");
    local_ = storage_type::empty(tessera::local_shape(l, global));
    storage_type::fill(local_, T(0));
  }

  /// A tensor whose shard is `local` (its size must be the layout's shard size; it takes
  /// the shard's shape): adopts the buffer, no fill, no copy.
  dist_tensor(const tessera::layout& l, const extents& global, int rank, array_type&& local)
    requires(!static_layout)
      : layout_(store_layout(l)), global_(global), rank_(rank) {
    require(check(l, global), "dist_tensor");
    if (rank < 0 || rank >= l.dev.size())
      throw error(fail(errc::rank_out_of_range, -1, -1, rank, l.dev.size()), "dist_tensor");
    assign_local(std::move(local));
  }

  /// A tensor whose values are held in the form `f` only (host shards; the row-major
  /// shard is made from it when read).
  dist_tensor(const tessera::layout& l, const extents& global, int rank, std::unique_ptr<host_form<T>> f)
    requires(!static_layout && std::same_as<D, cpu_device>)
      : layout_(store_layout(l)), global_(global), rank_(rank) {
    require(check(l, global), "dist_tensor");
    if (rank < 0 || rank >= l.dev.size())
      throw error(fail(errc::rank_out_of_range, -1, -1, rank, l.dev.size()), "dist_tensor");
    set_form(std::move(f));
  }

  /// Copies hold the row-major values (made from the form first where it is not current)
  /// and no form.
  dist_tensor(const dist_tensor& o)
      : layout_(o.layout_), global_(o.global_), rank_(o.rank_), local_(o.local()) {}
  dist_tensor& operator=(const dist_tensor& o) {
    if (this != &o) {
      local_ = o.local();
      layout_ = o.layout_;
      global_ = o.global_;
      rank_ = o.rank_;
      form_.reset();
    }
    return *this;
  }
  dist_tensor(dist_tensor&&) noexcept = default;
  dist_tensor& operator=(dist_tensor&&) noexcept = default;
  ~dist_tensor() = default;

  /// A run-time tensor from any tensor of the same element type: the static layout and
  /// shape become values (the shard is copied).
  template <auto L2, auto G2>
    requires(!static_layout && !static_shape && (detail::is_static_layout<L2> || detail::is_static_shape<G2>))
  explicit dist_tensor(const dist_tensor<T, L2, G2, D>& other)
      : layout_(other.layout()), global_(other.global_shape()), rank_(other.rank()), local_(other.local()) {}

  /// The layout (a constant for a static layout).
  constexpr const tessera::layout& layout() const {
    if constexpr (static_layout) return static_layout_value;
    else return layout_;
  }
  constexpr const extents& global_shape() const { return global_; }
  constexpr int rank() const { return rank_; }
  constexpr int ndim() const { return global_.ndim; }
  constexpr const mesh& dev() const { return layout().dev; }

  /// The shard's shape, known to the compiler when layout and shape are static.
  static constexpr extents static_local_shape()
    requires(static_layout && detail::is_fully_static_shape<Global>)
  {
    return tessera::local_shape(L, Global);
  }
  extents local_shape() const { return tessera::local_shape(layout(), global_); }
  extents local_offset() const { return tessera::local_offset(layout(), global_, rank_); }

  /// The row-major shard, for writing: made from the form first where it is not
  /// current, and the form dropped.
  array_type& local() {
    drop_form();
    return local_;
  }
  /// The row-major shard, made from the form first where it is not current.
  const array_type& local() const {
    make_plain();
    return local_;
  }
  std::span<T> data() {
    drop_form();
    return {local_.data(), local_.size()};
  }
  std::span<const T> data() const {
    make_plain();
    return {local_.data(), local_.size()};
  }

  /// The kernel's layout the values are also (or only) held in, or null.
  const host_form<T>* form() const { return form_ ? form_->form.get() : nullptr; }
  /// Whether the row-major shard is current (no form, or a form kept beside it).
  bool plain_current() const { return !form_ || form_->plain.load(std::memory_order_acquire); }
  /// Keeps `f`, which holds the same values as the row-major shard, beside it (a kernel's
  /// copy of its operand, kept for its next call; the values do not change, hence const).
  void keep_form(std::unique_ptr<host_form<T>> f) const
    requires std::same_as<D, cpu_device>
  {
    make_plain();
    form_ = std::make_unique<form_slot>(std::move(f), true);
  }
  /// Holds the values in `f` only: the row-major shard is released, and made from `f`
  /// when read.
  void set_form(std::unique_ptr<host_form<T>> f)
    requires std::same_as<D, cpu_device>
  {
    local_ = array_type();
    form_ = std::make_unique<form_slot>(std::move(f), false);
  }
  /// The form, for the caller to write the values in place there: the row-major shard
  /// is released (made from the form when read). Null without a form.
  host_form<T>* form_for_update()
    requires std::same_as<D, cpu_device>
  {
    if (!form_) return nullptr;
    if (form_->plain.load(std::memory_order_relaxed)) {
      local_ = array_type();
      form_->plain.store(false, std::memory_order_release);
    }
    return form_->form.get();
  }
  /// The same values under layout `l`, which gives this rank a shard of the same shape
  /// (a layout placing the same elements, on another device matrix of the same ranks):
  /// the shard, and its form, move over as they are.
  dist_tensor relabeled(const tessera::layout& l) &&
    requires(!static_layout)
  {
    require(check(l, global_), "dist_tensor");
    if (!(tessera::local_shape(l, global_) == local_shape()))
      throw error("dist_tensor: relabeled to " + to_string(l) + ": this rank's shard would be " +
                  to_string(tessera::local_shape(l, global_)) + ", it is " + to_string(local_shape()));
    dist_tensor out(std::move(*this));
    out.layout_ = l;
    return out;
  }
  /// The row-major shard's buffer for reuse, its values unspecified (not made from the
  /// form); the tensor is left without values (for a gradient whose storage goes back
  /// to its parameter).
  array_type release_storage() {
    form_.reset();
    return std::move(local_);
  }

  /// Sets every local element to f(global index), index an array of max_tensor_ndim
  /// entries of which the first ndim() are used. For a partial layout the caller
  /// decides what each rank's share is. Host shards only.
  template <class F>
    requires std::same_as<D, cpu_device>
  void fill_global(F&& f) {
    drop_form();
    const extents off = local_offset();
    detail::for_each_index(local_shape(), [&](const auto& idx, index_t lin) {
      std::array<index_t, max_tensor_ndim> g{};
      for (int d = 0; d < global_.ndim; ++d) g[d] = off.v[d] + idx[d];
      local_.data()[lin] = f(g);
    });
  }

  /// Replaces the shard with `local`, whose size must match the layout's shard; it
  /// takes the shard's shape (row-major), whatever shape it had.
  void assign_local(array_type&& local) {
    const index_t need = tessera::local_size(layout(), global_);
    if (index_t(local.size()) != need)
      throw error(fail(errc::buffer_size, -1, -1, index_t(local.size()), need), "dist_tensor");
    local_ = std::move(local);
    local_.reshape(detail::shape_vector(local_shape()));
    form_.reset();
  }

 private:
  static constexpr tessera::layout static_layout_value = [] {
    if constexpr (static_layout) return L;
    else return tessera::layout{};
  }();

  static constexpr status check_matches_static(const extents& global) {
    if constexpr (static_shape) {
      if (global.ndim != Global.ndim) return fail(errc::shape_ndim, -1, -1, global.ndim, Global.ndim);
      for (int d = 0; d < global.ndim; ++d)
        if (Global.v[d] != dynamic_extent && Global.v[d] != global.v[d])
          return fail(errc::static_shape_mismatch, d, -1, global.v[d], Global.v[d]);
    }
    return {};
  }

  using layout_storage = std::conditional_t<static_layout, dynamic_t, tessera::layout>;
  static constexpr layout_storage store_layout(const tessera::layout& l) {
    if constexpr (static_layout) return dynamic;
    else return l;
  }

  // A form and whether the row-major shard is current beside it (made from the form
  // under the mutex, once, when it is not and a reader asks).
  struct form_slot {
    form_slot(std::unique_ptr<host_form<T>> f, bool plain_current) : form(std::move(f)), plain(plain_current) {}
    std::unique_ptr<host_form<T>> form;
    std::atomic<bool> plain;
    std::mutex m;
  };

  void make_plain() const {
    if (!form_ || form_->plain.load(std::memory_order_acquire)) return;
    const std::lock_guard<std::mutex> lock(form_->m);
    if (form_->plain.load(std::memory_order_relaxed)) return;
    if constexpr (std::same_as<D, cpu_device>) {
      const extents s = local_shape();
      if (index_t(local_.size()) != s.size()) local_ = storage_type::empty(s);
      form_->form->to_plain(local_.data());
    }
    form_->plain.store(true, std::memory_order_release);
  }
  void drop_form() {
    make_plain();
    form_.reset();
  }

  [[no_unique_address]] layout_storage layout_{};
  extents global_;
  int rank_ = 0;
  mutable array_type local_;  // made from form_ by a reader when not current
  mutable std::unique_ptr<form_slot> form_;
};

/// A distributed tensor whose layout and shape are run-time values, on device D: the
/// form operators take and return.
template <class T, class D = cpu_device>
using tensor_on = dist_tensor<T, dynamic, dynamic, D>;

}  // namespace tessera
