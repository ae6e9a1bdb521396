// What the oneDNN kernels share: the engine (one per process) and stream (one per
// thread), the primitive cache (one per thread, keyed by shapes and attributes, so a
// repeated call creates nothing), dnnl_tensor (a 4-D tensor kept in the memory format
// oneDNN chose, to pass between layers without reordering), the reorders between
// layouts (cached primitives; weights from a two-block layout back to plain by a loop of
// their own), dnnl_form (convolution weights kept in oneDNN's layout as a dist_tensor's
// host form), and oneDNN's errors as tessera::error. Link
// tessera::dnnl.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/cnn_table.hpp>
#include <tessera/kernels/cpu/parallel.hpp>
#include <tessera/tensor/host_form.hpp>

namespace tessera::kernels::cpu {

/// oneDNN's CPU engine, created on first use and kept for the life of the process.
inline const dnnl::engine& dnnl_engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

/// The calling thread's oneDNN stream on dnnl_engine(). oneDNN's CPU streams run
/// in order and synchronously; each thread has its own, so threads never share one.
inline dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream s(dnnl_engine());
  return s;
}

/// A 4-D float tensor (N, C, H, W) in a memory format oneDNN chose (a blocked one such
/// as nChw16c on AVX-512, or plain NCHW). Every kernel of kernels/cpu/conv.hpp,
/// batch_norm.hpp and pool.hpp takes and returns these as it does xt::xarray<float>; in
/// this form a layer's output is passed to the next one in the format its primitive
/// wrote, without the reorders to and from NCHW around every call (at ResNet-50's
/// CIFAR-10 shapes the 1x1 convolutions are about a quarter faster; see
/// benchmarks/bench_conv.cpp). Copies share the buffer (a dnnl::memory handle).
class dnnl_tensor {
 public:
  dnnl_tensor() = default;
  /// Takes a 4-D oneDNN memory object (any format).
  explicit dnnl_tensor(dnnl::memory m) : mem_(std::move(m)) {
    if (mem_.get_desc().dims().size() != 4)
      throw error("dnnl_tensor: the memory must be 4-D (N, C, H, W), it has " +
                  std::to_string(mem_.get_desc().dims().size()) + " dims");
  }
  /// A copy of x (N, C, H, W) in plain NCHW.
  static dnnl_tensor from_xarray(const xt::xarray<float>& x);
  /// The values in plain NCHW.
  xt::xarray<float> to_xarray() const;
  /// A copy in the layout `tag` (dnnl::memory::format_tag::nChw16c, nhwc, nchw, ...).
  dnnl_tensor in_format(dnnl::memory::format_tag tag) const;

  std::vector<std::size_t> shape() const {
    const auto d = mem_.get_desc().dims();
    return std::vector<std::size_t>(d.begin(), d.end());
  }
  const dnnl::memory& memory() const { return mem_; }
  dnnl::memory::desc desc() const { return mem_.get_desc(); }
  /// Whether the values are laid out as plain NCHW.
  bool is_plain() const;
  explicit operator bool() const { return bool(mem_); }

 private:
  dnnl::memory mem_;
};

/// The channel-blocked layout oneDNN computes activations in on this CPU: nChw16c with
/// AVX-512, else nChw8c (oneDNN runs nChw16c by its reference code without AVX-512).
inline dnnl::memory::format_tag channel_blocked_tag() {
  static const dnnl::memory::format_tag tag = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core
                                                  ? dnnl::memory::format_tag::nChw16c
                                                  : dnnl::memory::format_tag::nChw8c;
  return tag;
}

/// Convolution weights (O, C / groups, KH, KW) in a layout oneDNN chose (OIhw16i16o on
/// AVX-512; 5-D, groups first, for grouped convolutions), as a dist_tensor's host form:
/// the convolutions keep the weights they reordered in it, read it as it is at their
/// next call, and write the weights' gradient in the layout their primitive chose; the
/// optimizers update weights, gradient and state in it when all are alike
/// (optim/optimizer.hpp). Copies share the buffer.
class dnnl_form final : public host_form<float> {
 public:
  /// The kind() of these forms.
  static constexpr std::uint32_t tag = 0x4c4e4e44;  // "DNNL"

  dnnl_form() = default;
  /// Takes `m` (any layout) holding weights of shape `shape` (4-D).
  dnnl_form(dnnl::memory m, std::vector<std::size_t> shape) : mem_(std::move(m)), shape_(std::move(shape)) {}

  const dnnl::memory& memory() const { return mem_; }
  /// The weights' shape (O, C / groups, KH, KW).
  const std::vector<std::size_t>& shape() const { return shape_; }
  explicit operator bool() const { return bool(mem_); }

  std::uint32_t kind() const override { return tag; }
  std::span<float> values() override { return {static_cast<float*>(mem_.get_data_handle()), buffer_elements()}; }
  std::span<const float> values() const override {
    return {static_cast<const float*>(mem_.get_data_handle()), buffer_elements()};
  }
  bool is_permutation() const override;
  bool same_layout(const host_form<float>& other) const override {
    return other.kind() == tag && static_cast<const dnnl_form&>(other).mem_.get_desc() == mem_.get_desc();
  }
  void to_plain(float* dst) const override;
  void from_plain(const float* src) override;
  std::unique_ptr<host_form<float>> empty_like() const override;
  std::unique_ptr<host_form<float>> layout_only() const override {
    return std::make_unique<dnnl_form>(dnnl::memory(mem_.get_desc(), dnnl_engine(), DNNL_MEMORY_NONE), shape_);
  }

 private:
  std::size_t buffer_elements() const { return mem_.get_desc().get_size() / sizeof(float); }

  dnnl::memory mem_;
  std::vector<std::size_t> shape_;
};

/// The operand types of the oneDNN kernels: plain NCHW xarrays, and dnnl_tensor.
template <class X>
concept dnnl_operand = std::same_as<X, xt::xarray<float>> || std::same_as<X, dnnl_tensor>;

namespace detail {

using dnnl_dims = dnnl::memory::dims;
using dnnl_tag = dnnl::memory::format_tag;
using dnnl_md = dnnl::memory::desc;

inline dnnl_dims to_dims(std::span<const std::size_t> s) {
  dnnl_dims d;
  for (std::size_t e : s) d.push_back(dnnl::memory::dim(e));
  return d;
}

/// The plain row-major descriptor of float dims (a, ab, abc, abcd, abcde).
inline dnnl_md plain_desc(const dnnl_dims& d) {
  static constexpr dnnl_tag tags[] = {dnnl_tag::a, dnnl_tag::a, dnnl_tag::ab, dnnl_tag::abc, dnnl_tag::abcd,
                                      dnnl_tag::abcde};
  return dnnl_md(d, dnnl::memory::data_type::f32, tags[std::min<std::size_t>(d.size(), 5)]);
}

/// A oneDNN memory over an array's own buffer (no copy), as plain `dims` (default: the
/// array's shape). The array must outlive the memory object; oneDNN only reads it
/// where it is an input.
inline dnnl::memory wrap(const xt::xarray<float>& x, const dnnl_dims& dims) {
  return dnnl::memory(plain_desc(dims), dnnl_engine(), const_cast<float*>(x.data()));
}
inline dnnl::memory wrap(const xt::xarray<float>& x) {
  return wrap(x, to_dims(std::span<const std::size_t>(x.shape().data(), x.shape().size())));
}

inline std::vector<std::size_t> shape_of(const xt::xarray<float>& x) {
  return std::vector<std::size_t>(x.shape().begin(), x.shape().end());
}
inline std::vector<std::size_t> shape_of(const dnnl_tensor& x) { return x.shape(); }

// ---- the primitive cache ------------------------------------------------------------

/// A cache key: the kind of primitive, then its shapes and attributes as integers.
struct primitive_key {
  std::vector<std::int64_t> v;

  primitive_key& add(std::int64_t x) {
    v.push_back(x);
    return *this;
  }
  primitive_key& add(float x) { return add(std::int64_t(std::bit_cast<std::uint32_t>(x))); }
  primitive_key& add(bool x) { return add(std::int64_t(x)); }
  primitive_key& add(const dnnl_dims& d) {
    add(std::int64_t(d.size()));
    v.insert(v.end(), d.begin(), d.end());
    return *this;
  }
  /// A memory descriptor: its dims and its layout (the blocking of a blocked format).
  primitive_key& add(const dnnl_md& md) {
    const dnnl_memory_desc_t& c = md.data;
    add(std::int64_t(c.ndims));
    for (int i = 0; i < c.ndims; ++i) add(std::int64_t(c.dims[i]));
    add(std::int64_t(c.data_type)).add(std::int64_t(c.format_kind));
    if (c.format_kind == dnnl_blocked) {
      const auto& b = c.format_desc.blocking;
      for (int i = 0; i < c.ndims; ++i) add(std::int64_t(b.strides[i]));
      add(std::int64_t(b.inner_nblks));
      for (int i = 0; i < b.inner_nblks; ++i) add(std::int64_t(b.inner_blks[i])).add(std::int64_t(b.inner_idxs[i]));
    }
    return *this;
  }
  primitive_key& add(const pad2d& p) { return add(p.top).add(p.bottom).add(p.left).add(p.right); }
  friend bool operator==(const primitive_key&, const primitive_key&) = default;
};

struct primitive_key_hash {
  std::size_t operator()(const primitive_key& k) const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    for (std::int64_t x : k.v) h = (h ^ std::uint64_t(x)) * 1099511628211ull;
    return std::size_t(h);
  }
};

/// Entries kept per thread and entry type before the cache starts over (a program with
/// that many distinct shapes recreates primitives rather than growing without bound).
inline constexpr std::size_t primitive_cache_capacity = 1024;

/// The calling thread's cached Entry for `key`, made by `make()` on the first call.
template <class Entry, class Make>
const Entry& cached(const primitive_key& key, Make&& make) {
  thread_local std::unordered_map<primitive_key, Entry, primitive_key_hash> cache;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= primitive_cache_capacity) cache.clear();
  return cache.emplace(key, make()).first->second;
}

/// The number of primitives each kernel family created on this thread (tests check that
/// a repeated call creates none).
inline std::size_t& primitives_created() {
  thread_local std::size_t n = 0;
  return n;
}

// ---- errors -------------------------------------------------------------------------

/// Runs f, turning oneDNN's errors into tessera::error naming the kernel:
/// "conv2d_forward: oneDNN: could not create a primitive descriptor (status 3)".
template <class F>
decltype(auto) dnnl_call(const char* fn, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const dnnl::error& e) {
    throw error(std::string(fn) + ": oneDNN: " + e.what() + " (status " + std::to_string(int(e.status)) + ")");
  }
}

// ---- reorders, inputs and outputs -----------------------------------------------------

/// A blocked layout of the kind oneDNN gives convolution weights (OIhw16i16o, IOhw16o16i,
/// gOIhw8i8o, ...): 4-D (O, I, KH, KW), or 5-D with the groups first, whose output- and
/// input-channel dims are both blocked by `block`; every other dim, and the blocks
/// themselves, at the outer `strides` (in elements).
struct two_block_weights {
  int ndims = 0;
  dnnl::memory::dim block = 0;
  bool o_innermost = true;  // O's block is the innermost (ABcd16b16a), else I's (ABcd16a16b)
  std::array<dnnl::memory::dim, 5> dims{}, strides{};
};

/// `md` as a two_block_weights, or nothing for any other layout.
inline std::optional<two_block_weights> as_two_block_weights(const dnnl_md& md) {
  const dnnl_memory_desc_t& c = md.data;
  if (c.format_kind != dnnl_blocked || c.data_type != dnnl_f32 || c.offset0 != 0 || c.extra.flags != 0 ||
      (c.ndims != 4 && c.ndims != 5))
    return std::nullopt;
  const auto& b = c.format_desc.blocking;
  const int o = c.ndims - 4, i = o + 1;  // the channel dims
  if (b.inner_nblks != 2 || b.inner_blks[0] != b.inner_blks[1]) return std::nullopt;
  const bool o_innermost = b.inner_idxs[0] == i && b.inner_idxs[1] == o;
  if (!o_innermost && !(b.inner_idxs[0] == o && b.inner_idxs[1] == i)) return std::nullopt;
  two_block_weights w;
  w.ndims = c.ndims;
  w.block = b.inner_blks[0];
  w.o_innermost = o_innermost;
  for (int d = 0; d < c.ndims; ++d) {
    if (c.padded_offsets[d] != 0) return std::nullopt;
    w.dims[std::size_t(d)] = c.dims[d];
    w.strides[std::size_t(d)] = b.strides[d];
  }
  return w;
}

/// dst (plain row-major, w's dims) = src laid out as w: each block x block tile of
/// (O, I) read across and written in place, on the kernels' threads. oneDNN 2.6's
/// reorder of these layouts to plain runs 6 to 7 times slower than this loop where I is
/// 1024 or more (the 1 x 1 weights of ResNet-50's last two stages), and within 15% of it
/// on the other shapes (benchmarks/bench_conv.cpp, weights_to_plain).
inline void two_block_weights_to_plain(const two_block_weights& w, const float* src, float* dst) {
  using dim = dnnl::memory::dim;
  const int o = w.ndims - 4;
  const dim groups = o ? w.dims[0] : 1, gstride = o ? w.strides[0] : 0;
  const dim oc = w.dims[std::size_t(o)], ic = w.dims[std::size_t(o) + 1], kw = w.dims[std::size_t(o) + 3];
  const dim k = w.dims[std::size_t(o) + 2] * kw;
  const dim so = w.strides[std::size_t(o)], si = w.strides[std::size_t(o) + 1];
  const dim sh = w.strides[std::size_t(o) + 2], sw = w.strides[std::size_t(o) + 3];
  const dim bs = w.block, ob_n = (oc + bs - 1) / bs, ib_n = (ic + bs - 1) / bs;
  // Element (a, b) of a tile (a in O's block, b in I's) is at a + b * bs where O's block
  // is the innermost, else at a * bs + b.
  const dim step_a = w.o_innermost ? 1 : bs, step_b = w.o_innermost ? bs : 1;
  const std::size_t tiles = std::size_t(groups * ob_n * ib_n);
  const std::size_t grain = std::max<std::size_t>(1, parallel_grain / std::size_t(bs * bs * k));
  parallel_ranges(tiles, grain, [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) {
      const dim g = dim(t) / (ob_n * ib_n), ob = dim(t) / ib_n % ob_n, ib = dim(t) % ib_n;
      const dim na = std::min(bs, oc - ob * bs), nb = std::min(bs, ic - ib * bs);
      for (dim kk = 0; kk < k; ++kk) {
        const float* tile = src + g * gstride + ob * so + ib * si + kk / kw * sh + kk % kw * sw;
        for (dim a = 0; a < na; ++a) {
          float* out = dst + ((g * oc + ob * bs + a) * ic + ib * bs) * k + kk;
          const float* in = tile + a * step_a;
          for (dim bi = 0; bi < nb; ++bi) out[bi * k] = in[bi * step_b];
        }
      }
    }
  });
}

struct reorder_entry {
  dnnl::reorder prim;
};

/// dst = src with the layout of dst (a cached reorder primitive; convolution weights
/// from a two-block layout to plain by two_block_weights_to_plain).
inline void reorder_into(const dnnl::memory& src, const dnnl::memory& dst) {
  const dnnl_md s = src.get_desc(), d = dst.get_desc();
  // The layout test first: it reads the descriptor's fields, and fails at once for
  // activations' layouts, the most reorders.
  if (const auto w = as_two_block_weights(s); w && s.dims() == d.dims() && d == plain_desc(d.dims())) {
    two_block_weights_to_plain(*w, static_cast<const float*>(src.get_data_handle()),
                               static_cast<float*>(dst.get_data_handle()));
    return;
  }
  primitive_key key;
  key.add(std::int64_t(0x5245)).add(s).add(d);
  const auto& e = cached<reorder_entry>(key, [&] {
    ++primitives_created();
    return reorder_entry{dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), s, dnnl_engine(), d))};
  });
  e.prim.execute(dnnl_stream(), const_cast<dnnl::memory&>(src), const_cast<dnnl::memory&>(dst));
}

// ---- scratch memory ------------------------------------------------------------------

/// Bytes of freed scratch buffers each thread keeps for reuse (set_dnnl_scratch_budget).
inline std::atomic<std::size_t>& scratch_budget() {
  static std::atomic<std::size_t> bytes{std::size_t(64) << 20};
  return bytes;
}

/// The calling thread's free scratch buffers, by descriptor, and their bytes: the
/// reordered copies and blocked intermediates a kernel needs only during its call.
/// Reusing them saves the page faults of fresh allocations (a reorder into fresh memory
/// costs several times one into memory already touched); the budget keeps the large
/// ones of large shapes from being held between calls (unbounded, they held 0.55 GB in
/// ResNet-50's 224x224 step).
struct scratch_pool_state {
  std::unordered_map<primitive_key, std::vector<dnnl::memory>, primitive_key_hash> free;
  std::size_t bytes = 0;
};
inline scratch_pool_state& scratch_pool() {
  thread_local scratch_pool_state pool;
  return pool;
}

/// A memory a kernel uses during its call: either an operand's own memory (not owned
/// here) or a scratch buffer, handed back to the thread's pool when this is destroyed
/// if the pool stays within the budget, else freed.
class scratch_memory {
 public:
  explicit scratch_memory(dnnl::memory m, bool pooled = false) : mem_(std::move(m)), pooled_(pooled) {}
  scratch_memory(scratch_memory&& o) noexcept : mem_(std::move(o.mem_)), pooled_(std::exchange(o.pooled_, false)) {}
  scratch_memory(const scratch_memory&) = delete;
  scratch_memory& operator=(const scratch_memory&) = delete;
  scratch_memory& operator=(scratch_memory&&) = delete;
  ~scratch_memory() {
    if (!pooled_) return;
    scratch_pool_state& pool = scratch_pool();
    const std::size_t bytes = mem_.get_desc().get_size();
    if (pool.bytes + bytes > scratch_budget().load(std::memory_order_relaxed)) return;
    primitive_key k;
    k.add(mem_.get_desc());
    pool.free[k].push_back(std::move(mem_));
    pool.bytes += bytes;
  }
  const dnnl::memory& get() const { return mem_; }
  operator const dnnl::memory&() const { return mem_; }

 private:
  dnnl::memory mem_;
  bool pooled_ = false;
};

/// A scratch buffer of descriptor `md` (from the pool, else new).
inline scratch_memory scratch(const dnnl_md& md) {
  scratch_pool_state& pool = scratch_pool();
  primitive_key k;
  k.add(md);
  if (const auto it = pool.free.find(k); it != pool.free.end() && !it->second.empty()) {
    dnnl::memory m = std::move(it->second.back());
    it->second.pop_back();
    pool.bytes -= md.get_size();
    return scratch_memory(std::move(m), true);
  }
  return scratch_memory(dnnl::memory(md, dnnl_engine()), true);
}

/// `m` as a memory of descriptor `want`: itself when the layouts agree, else a reordered
/// copy in scratch memory (keep the result alive while the primitive runs).
inline scratch_memory as_desc(const dnnl::memory& m, const dnnl_md& want) {
  if (m.get_desc() == want) return scratch_memory(m);
  scratch_memory out = scratch(want);
  reorder_into(m, out.get());
  return out;
}

inline dnnl::memory memory_of(const xt::xarray<float>& x) { return wrap(x); }
inline dnnl::memory memory_of(const dnnl_tensor& x) { return x.memory(); }

/// An operand's memory in the layout `want` (reordered when it is in another).
template <dnnl_operand X>
scratch_memory input_as(const X& x, const dnnl_md& want) {
  return as_desc(memory_of(x), want);
}

/// Where a primitive writes a result of type X whose layout it chose (`chosen`): an
/// xarray gets plain `dims` (written in place when `chosen` is plain, else into scratch
/// memory and reordered after the primitive ran), a dnnl_tensor keeps `chosen` (in
/// memory of its own).
template <class X>
class output_slot;

template <>
class output_slot<xt::xarray<float>> {
 public:
  output_slot(const dnnl_md& chosen, const dnnl_dims& dims, std::span<const std::size_t> shape)
      : out_(xt::xarray<float>::from_shape(std::vector<std::size_t>(shape.begin(), shape.end()))),
        plain_(wrap(out_, dims)),
        mem_(chosen == plain_.get_desc() ? scratch_memory(plain_) : scratch(chosen)) {}
  const dnnl::memory& memory() const { return mem_.get(); }
  xt::xarray<float> take() {
    if (mem_.get().get_data_handle() != plain_.get_data_handle()) reorder_into(mem_.get(), plain_);
    return std::move(out_);
  }

 private:
  xt::xarray<float> out_;
  dnnl::memory plain_;
  scratch_memory mem_;
};

template <>
class output_slot<dnnl_tensor> {
 public:
  output_slot(const dnnl_md& chosen, const dnnl_dims&, std::span<const std::size_t>)
      : mem_(chosen, dnnl_engine()) {}
  const dnnl::memory& memory() const { return mem_; }
  dnnl_tensor take() { return dnnl_tensor(mem_); }

 private:
  dnnl::memory mem_;
};

template <>
class output_slot<dnnl_form> {
 public:
  output_slot(const dnnl_md& chosen, const dnnl_dims&, std::span<const std::size_t> shape)
      : mem_(chosen, dnnl_engine()), shape_(shape.begin(), shape.end()) {}
  const dnnl::memory& memory() const { return mem_; }
  dnnl_form take() { return dnnl_form(mem_, std::move(shape_)); }

 private:
  dnnl::memory mem_;
  std::vector<std::size_t> shape_;
};

/// A 1-D float array of n elements.
inline xt::xarray<float> vector_of(std::size_t n) { return xt::xarray<float>::from_shape({n}); }

/// Throws unless v is 1-D of n elements: "batch_norm_forward_training: gamma must be
/// (64,), gamma is (32,)".
inline void require_vector(const char* fn, const char* name, const xt::xarray<float>& v, std::size_t n) {
  if (v.dimension() != 1 || v.shape()[0] != n)
    throw error(std::string(fn) + ": " + name + " must be (" + std::to_string(n) + ",), " + name + " is " +
                tessera::detail::dims_text(std::span<const std::size_t>(v.shape().data(), v.shape().size())));
}

/// Throws unless `got` equals `want`: "max_pool2d_backward: dy must be (2, 3, 4, 4), dy
/// is (2, 3, 4, 5)".
inline void require_dims(const char* fn, const char* name, std::span<const std::size_t> got,
                         std::span<const std::size_t> want) {
  if (!std::ranges::equal(got, want))
    throw error(std::string(fn) + ": " + name + " must be " + tessera::detail::dims_text(want) + ", " + name +
                " is " + tessera::detail::dims_text(got));
}

}  // namespace detail

/// Sets how many bytes of freed scratch buffers (the reordered copies and blocked
/// intermediates of the kernels' calls) each thread keeps for the next calls: 64 MiB
/// unless set, 0 keeps none. The calling thread's kept buffers are freed now.
inline void set_dnnl_scratch_budget(std::size_t bytes) {
  detail::scratch_budget().store(bytes, std::memory_order_relaxed);
  detail::scratch_pool() = {};
}

inline dnnl_tensor dnnl_tensor::from_xarray(const xt::xarray<float>& x) {
  tessera::detail::require_nchw("dnnl_tensor::from_xarray", "x",
                                std::span<const std::size_t>(x.shape().data(), x.shape().size()));
  dnnl::memory m(detail::plain_desc(detail::to_dims(std::span<const std::size_t>(x.shape().data(), x.shape().size()))),
                 dnnl_engine());
  std::memcpy(m.get_data_handle(), x.data(), x.size() * sizeof(float));
  return dnnl_tensor(std::move(m));
}

inline bool dnnl_form::is_permutation() const {
  const dnnl_memory_desc_t& c = mem_.get_desc().data;
  if (c.offset0 != 0) return false;
  std::size_t n = 1;
  for (int d = 0; d < c.ndims; ++d) {
    if (c.padded_dims[d] != c.dims[d]) return false;
    n *= std::size_t(c.dims[d]);
  }
  return buffer_elements() == n;
}

inline void dnnl_form::to_plain(float* dst) const {
  detail::reorder_into(mem_, dnnl::memory(detail::plain_desc(mem_.get_desc().dims()), dnnl_engine(), dst));
}

inline void dnnl_form::from_plain(const float* src) {
  detail::reorder_into(
      dnnl::memory(detail::plain_desc(mem_.get_desc().dims()), dnnl_engine(), const_cast<float*>(src)), mem_);
}

inline std::unique_ptr<host_form<float>> dnnl_form::empty_like() const {
  return std::make_unique<dnnl_form>(dnnl::memory(mem_.get_desc(), dnnl_engine()), shape_);
}

inline bool dnnl_tensor::is_plain() const { return desc() == detail::plain_desc(desc().dims()); }

inline dnnl_tensor dnnl_tensor::in_format(dnnl::memory::format_tag tag) const {
  dnnl::memory out(dnnl::memory::desc(desc().dims(), dnnl::memory::data_type::f32, tag), dnnl_engine());
  detail::reorder_into(mem_, out);
  return dnnl_tensor(std::move(out));
}

inline xt::xarray<float> dnnl_tensor::to_xarray() const {
  const auto s = shape();
  xt::xarray<float> out = xt::xarray<float>::from_shape(s);
  detail::reorder_into(mem_, detail::wrap(out));
  return out;
}

}  // namespace tessera::kernels::cpu
