// Checkpoints of distributed tensors: saved whole (gathered, one file written by
// rank 0) or per rank (integrated_save off: each rank its shards), and loaded into
// any layout on any number of ranks, each rank reading only the pieces it needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/io/checkpoint_file.hpp>
#include <tessera/io/rotation.hpp>
#include <tessera/io/safetensors.hpp>
#include <tessera/tensor/copy_box.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::io {

/// A named distributed tensor as checkpoints see it: a view (no copy) of a host
/// dist_tensor<T, L, G> with its element type erased. The tensor must outlive the view
/// and keep its shard's storage. A view of a const tensor can be saved, not loaded.
///
///     std::vector<io::param_ref> params{{"fc1.weight", w1}, {"fc1.bias", b1}};
class param_ref {
 public:
  template <class T, auto L, auto G, class D>
  param_ref(std::string name, dist_tensor<T, L, G, D>& t)
      : param_ref(std::move(name), static_cast<const dist_tensor<T, L, G, D>&>(t)) {
    mutable_data_ = reinterpret_cast<std::byte*>(t.local().data());
  }
  template <class T, auto L, auto G, class D>
  param_ref(std::string name, const dist_tensor<T, L, G, D>& t)
      : name_(std::move(name)),
        type_(dtype_of<T>()),
        layout_(t.layout()),
        global_(t.global_shape()),
        rank_(t.rank()),
        data_(reinterpret_cast<const std::byte*>(t.local().data())),
        size_(std::size_t(t.local().size())) {
    static_assert(std::is_same_v<D, cpu_device>,
                  "param_ref: checkpoints read and write host tensors (cpu_device); copy a device tensor to "
                  "the host first");
  }

  const std::string& name() const { return name_; }
  dtype type() const { return type_; }
  const tessera::layout& layout() const { return layout_; }
  const extents& global_shape() const { return global_; }
  int rank() const { return rank_; }
  /// Elements of the local shard.
  std::size_t local_size() const { return size_; }
  param_spec spec() const { return {name_, type_, global_}; }

  template <class T>
  const T* local_data() const {
    return reinterpret_cast<const T*>(data_);
  }
  /// The shard for writing; throws for a view of a const tensor.
  template <class T>
  T* mutable_local_data() const {
    if (!mutable_data_) throw error("param_ref: '" + name_ + "' views a const tensor and cannot be loaded into");
    return reinterpret_cast<T*>(mutable_data_);
  }

 private:
  std::string name_;
  dtype type_;
  tessera::layout layout_;
  extents global_;
  int rank_ = 0;
  const std::byte* data_ = nullptr;
  std::byte* mutable_data_ = nullptr;
  std::size_t size_ = 0;
};

/// How save_checkpoint writes (MindSpore's CheckpointConfig).
struct save_options {
  /// true: gather every tensor and write one whole file (rank 0 writes it). false:
  /// every rank writes its own shards to rank_file(file, rank).
  bool integrated_save = true;
  /// Extra metadata (keys must not start with "tessera." or hold a ':').
  std::map<std::string, std::string> metadata;
};

/// Where rank R's shard file of checkpoint `file` lies: DIR/rank_R/NAME for file
/// DIR/NAME. `rank_file("ckpt/net-1_4.safetensors", 3)` is
/// "ckpt/rank_3/net-1_4.safetensors".
inline std::filesystem::path rank_file(const std::filesystem::path& file, int rank) {
  return file.parent_path() / ("rank_" + std::to_string(rank)) / file.filename();
}

namespace detail {

inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 1469598103934665603ull) {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// Checks that every rank passes the same tensor list to a collective save (else the
// gathers would not match up and the job would hang): a hash of names, dtypes,
// shapes and layouts, compared by max and min over the world.
template <class C>
void check_same_params(std::span<const param_ref> params, C& world, std::string_view fn) {
  std::uint64_t h = fnv1a("params");
  for (const param_ref& p : params)
    h = fnv1a(p.name() + "|" + std::string(dtype_name(p.type())) + "|" + to_string(p.global_shape()) + "|" +
                  to_string(p.layout().dev) + "|" + to_string(p.layout()) + ";",
              h);
  std::int64_t v[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};  // max and -min
  world.all_reduce(std::span<std::int64_t>(v, 2), reduce_op::max);
  if (v[0] != -v[1])
    throw error(std::string(fn) + ": the ranks passed different tensor lists (names, dtypes, shapes or layouts); "
                                  "every rank must save the same tensors in the same order");
}

inline void check_params_local(std::span<const param_ref> params, int rank, int nranks, std::string_view fn) {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const param_ref& p = params[i];
    if (p.name().empty()) throw error(std::string(fn) + ": tensor " + std::to_string(i) + " has an empty name");
    if (!names.insert(p.name()).second) throw error(std::string(fn) + ": the name '" + p.name() + "' is used twice");
    if (p.layout().dev.size() != nranks)
      throw error(fail(errc::mesh_size_mismatch, -1, -1, p.layout().dev.size(), nranks), fn,
                  "tensor '" + p.name() + "' on mesh " + to_string(p.layout().dev));
    if (p.rank() != rank)
      throw error(std::string(fn) + ": tensor '" + p.name() + "' belongs to rank " + std::to_string(p.rank()) +
                  ", this is rank " + std::to_string(rank));
  }
}

inline void check_user_metadata(const std::map<std::string, std::string>& md, std::string_view fn) {
  for (const auto& [k, v] : md)
    if (k.rfind("tessera.", 0) == 0 || k.find(':') != std::string::npos)
      throw error(std::string(fn) + ": metadata key \"" + k +
                  "\" is reserved (keys starting with \"tessera.\" or holding ':' describe the tensors)");
}

// Every rank learns whether any rank failed; the failing rank throws its own message,
// the others `what(rank)` for the highest failing rank.
template <class C, class What>
void agree_on_failure(C& world, const std::optional<std::string>& failure, What&& what) {
  int bad[1] = {failure ? world.rank() + 1 : 0};
  world.all_reduce(std::span<int>(bad, 1), reduce_op::max);
  if (failure) throw error(*failure);
  if (bad[0]) throw error(what(bad[0] - 1));
}

// Broadcasts root's failure message (if any) and throws it on every rank.
template <class C>
void share_failure(C& world, std::optional<std::string> failure, int root) {
  std::int64_t len[1] = {failure ? std::int64_t(failure->size()) + 1 : 0};
  world.broadcast(std::span<std::int64_t>(len, 1), root);
  if (len[0] == 0) return;
  std::vector<char> text(std::size_t(len[0] - 1));
  if (world.rank() == root) std::copy(failure->begin(), failure->end(), text.begin());
  if (!text.empty()) world.broadcast(std::span<char>(text), root);
  throw error(std::string(text.begin(), text.end()));
}

template <class T>
xt::xarray<T> shard_copy(const param_ref& p) {
  const extents ls = local_shape(p.layout(), p.global_shape());
  xt::xarray<T> a = xt::xarray<T>::from_shape(std::vector<std::size_t>(ls.v.begin(), ls.v.begin() + ls.ndim));
  std::copy_n(p.local_data<T>(), p.local_size(), a.data());
  return a;
}

// True when `rank` is the first member (coordinate 0) of every axis in `axes`.
inline bool first_on_axes(const mesh& m, axis_mask axes, int rank) {
  const mesh_coords c = m.coords(rank);
  for (int a = 0; a < m.ndim; ++a)
    if ((axes >> a & 1u) && c[a] != 0) return false;
  return true;
}

inline extents relative(const extents& off, const extents& base) {
  extents r = off;
  for (int d = 0; d < r.ndim; ++d) r.v[d] -= base.v[d];
  return r;
}

inline int parse_count(const std::map<std::string, std::string>& md, const std::string& key, std::string_view ctx) {
  auto it = md.find(key);
  if (it == md.end()) throw error(std::string(ctx) + ": the metadata lacks \"" + key + "\"");
  const std::string& s = it->second;
  long long v = -1;
  if (!s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    v = std::stoll(s);
  if (v < 0) throw error(std::string(ctx) + ": \"" + key + "\" is \"" + s + "\", expected a non-negative integer");
  return int(v);
}

}  // namespace detail

/// Saves named distributed tensors; collective: every rank calls it with the same
/// tensors in the same order (checked: a mismatch is an error on every rank, not a
/// hang).
///
/// - integrated_save (default): each tensor is redistributed to the replicated layout
///   (partial sums reduced) and rank 0 streams it into `file`, one tensor at a time.
/// - integrated_save off: each rank writes its shards to rank_file(file, rank), with
///   the global shape, layout and shard offset of each in the metadata
///   (checkpoint_file.hpp); no communication beyond agreeing on success.
///
/// Files are written atomically. If any rank fails, every rank throws (the failing
/// rank with its own message). Returns the file this rank wrote (or `file`).
template <communicator C>
std::filesystem::path save_checkpoint(const std::filesystem::path& file, std::span<const param_ref> params,
                                      device_context<C>& ctx, const save_options& opt = {}) {
  const char* fn = "save_checkpoint";
  C& world = ctx.world();
  const int me = world.rank();
  detail::check_user_metadata(opt.metadata, fn);
  detail::check_params_local(params, me, world.size(), fn);
  detail::check_same_params(params, world, fn);

  std::map<std::string, std::string> md = opt.metadata;
  md["tessera.format"] = std::string(checkpoint_format_version);
  std::vector<tensor_spec> specs;

  if (!opt.integrated_save) {
    const std::filesystem::path out = rank_file(file, me);
    md["tessera.kind"] = "shard";
    md["tessera.rank"] = std::to_string(me);
    md["tessera.ranks"] = std::to_string(world.size());
    for (const param_ref& p : params) {
      const extents ls = local_shape(p.layout(), p.global_shape());
      specs.push_back({p.name(), p.type(), std::vector<index_t>(ls.v.begin(), ls.v.begin() + ls.ndim)});
      write_placement(md, p.name(), {p.layout(), p.global_shape(), local_offset(p.layout(), p.global_shape(), me), true});
    }
    std::optional<std::string> failure;
    try {
      std::filesystem::create_directories(out.parent_path());
      safetensors_stream s(out, std::move(specs), md);
      for (const param_ref& p : params)
        s.write_host(std::span<const std::byte>(p.local_data<std::byte>(), p.local_size() * dtype_size(p.type())));
      s.commit();
    } catch (const std::exception& e) {
      failure = std::string(fn) + ": rank " + std::to_string(me) + ": " + e.what();
    }
    detail::agree_on_failure(world, failure, [&](int r) {
      return std::string(fn) + ": rank " + std::to_string(r) + " failed to write its shard file " +
             rank_file(file, r).string();
    });
    return out;
  }

  md["tessera.kind"] = "whole";
  for (const param_ref& p : params) {
    const extents& g = p.global_shape();
    specs.push_back({p.name(), p.type(), std::vector<index_t>(g.v.begin(), g.v.begin() + g.ndim)});
    write_placement(md, p.name(), {p.layout(), g, extents{}, false});
  }
  std::optional<std::string> failure;
  std::unique_ptr<safetensors_stream> out;
  if (me == 0) {
    try {
      if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
      out = std::make_unique<safetensors_stream>(file, std::move(specs), md);
    } catch (const std::exception& e) {
      failure = std::string(fn) + ": " + e.what();
    }
  }
  // Every rank takes part in every gather, even after rank 0 failed to write.
  for (const param_ref& p : params) {
    visit_dtype(
        p.type(),
        [&]<class T>(std::type_identity<T>) {
          dist_tensor<T> x(p.layout(), p.global_shape(), me, detail::shard_copy<T>(p));
          const dist_tensor<T> whole = redistribute(x, layout::replicated(p.layout().dev, p.global_shape().ndim), ctx);
          if (out && !failure) {
            try {
              out->write(std::span<const T>(whole.local().data(), whole.local().size()));
            } catch (const std::exception& e) {
              failure = std::string(fn) + ": " + e.what();
              out.reset();
            }
          }
        },
        fn);
  }
  if (out && !failure) {
    try {
      out->commit();
    } catch (const std::exception& e) {
      failure = std::string(fn) + ": " + e.what();
    }
  }
  out.reset();
  detail::share_failure(world, failure, 0);
  return file;
}

/// Copies each tensor's shard out of whole tensors held in memory (MindSpore's
/// load_param_into_net after load_checkpoint): for every parameter, the box of its
/// rank under its layout (shard_box). Checks names, dtypes and global shapes first
/// and reports every mismatch in one error (check_params); tensors the network does
/// not take are a mismatch only when `strict`. A parameter in a partial layout gets
/// the values on the first rank of its partial group and the reduction's identity on
/// the others, so that reducing gives the checkpoint's values.
inline void load_param_into_net(const checkpoint& c, std::span<const param_ref> params, bool strict = true) {
  const std::string ctx = "load_param_into_net: " + c.file.string();
  if (c.kind == checkpoint_kind::shard)
    throw error(ctx + ": the file holds one rank's shards (saved with integrated_save off); load it with "
                      "load_distributed_checkpoint");
  std::vector<param_spec> expected;
  for (const param_ref& p : params) expected.push_back(p.spec());
  check_params(specs_of(c), expected, strict, ctx);
  for (const param_ref& p : params) {
    const host_tensor& whole = c.at(p.name());
    const layout& l = p.layout();
    visit_dtype(
        p.type(),
        [&]<class T>(std::type_identity<T>) {
          T* dst = p.mutable_local_data<T>();
          if (!detail::first_on_axes(l.dev, l.partial, p.rank())) {
            std::fill_n(dst, p.local_size(), reduce_identity<T>(l.op));
            return;
          }
          const box b = shard_box(l, p.global_shape(), p.rank());
          tessera::detail::copy_box(whole.values<T>().data(), p.global_shape(), b.offset, dst, b.shape,
                                    tessera::detail::origin(b.shape.ndim), b.shape);
        },
        ctx);
  }
}

namespace detail {

// The shard files of a checkpoint saved with integrated_save off, opened on demand and
// validated against rank 0's file.
class shard_set {
 public:
  explicit shard_set(const std::filesystem::path& file) : file_(file) {
    first_ = std::make_unique<safetensors_reader>(rank_file(file, 0));
    const std::string ctx = "load_distributed_checkpoint: " + first_->path().string();
    if (read_kind(first_->metadata(), ctx) != checkpoint_kind::shard)
      throw error(ctx + ": \"tessera.kind\" is not \"shard\"");
    ranks_ = parse_count(first_->metadata(), "tessera.ranks", ctx);
    if (ranks_ < 1) throw error(ctx + ": \"tessera.ranks\" is 0");
    check_rank_fields(*first_, 0);
    for (const tensor_info& t : first_->tensors()) {
      auto p = read_placement(first_->metadata(), t.name, ctx);
      if (!p || !p->has_offset)
        throw error(ctx + ": tensor '" + t.name + "' has no recorded placement (mesh, layout, shape and offset)");
      if (p->placement.dev.size() != ranks_)
        throw error(ctx + ": tensor '" + t.name + "' is on mesh " + to_string(p->placement.dev) + " of " +
                    std::to_string(p->placement.dev.size()) + " ranks, the checkpoint was written by " +
                    std::to_string(ranks_));
      placements_.emplace(t.name, *p);
      spec_index_.emplace(t.name, specs_.size());
      specs_.push_back({t.name, t.type, p->global});
    }
  }

  int ranks() const { return ranks_; }
  const std::vector<param_spec>& specs() const { return specs_; }
  const tensor_placement& placement(const std::string& name) const { return placements_.at(name); }
  const std::filesystem::path& file() const { return file_; }

  /// Rank r's file, opened (once) and checked: its kind, rank and rank count.
  const safetensors_reader& reader(int r) {
    if (r == 0) return *first_;
    auto it = readers_.find(r);
    if (it != readers_.end()) return *it->second;
    auto rd = std::make_unique<safetensors_reader>(rank_file(file_, r));
    const std::string ctx = "load_distributed_checkpoint: " + rd->path().string();
    if (read_kind(rd->metadata(), ctx) != checkpoint_kind::shard)
      throw error(ctx + ": \"tessera.kind\" is not \"shard\"");
    check_rank_fields(*rd, r);
    return *readers_.emplace(r, std::move(rd)).first->second;
  }

  /// Tensor `name` in rank r's file, checked against the placement rank 0 recorded.
  const tensor_info& shard_info(int r, const std::string& name) {
    const safetensors_reader& rd = reader(r);
    const std::string ctx = "load_distributed_checkpoint: " + rd.path().string();
    const tensor_placement& want = placement(name);
    const tensor_info* t = rd.find(name);
    if (!t) throw error(ctx + ": no tensor named '" + name + "' (rank 0's file has it)");
    const param_spec& spec0 = specs_[spec_index_.at(name)];
    if (t->type != spec0.type)
      throw error(ctx + ": tensor '" + name + "' is " + std::string(dtype_name(t->type)) + ", rank 0's file says " +
                  std::string(dtype_name(spec0.type)));
    auto p = read_placement(rd.metadata(), name, ctx);
    if (!p || !p->has_offset) throw error(ctx + ": tensor '" + name + "' has no recorded placement");
    if (!(p->placement == want.placement) || !(p->global == want.global))
      throw error(ctx + ": tensor '" + name + "' has layout " + to_string(p->placement) + " on mesh " +
                  to_string(p->placement.dev) + ", shape " + to_string(p->global) + "; rank 0's file says " +
                  to_string(want.placement) + " on mesh " + to_string(want.placement.dev) + ", shape " +
                  to_string(want.global));
    const box b = shard_box(want.placement, want.global, r);
    if (!(p->offset == b.offset))
      throw error(ctx + ": tensor '" + name + "' records offset " + to_string(p->offset) + ", but layout " +
                  to_string(want.placement) + " on mesh " + to_string(want.placement.dev) + " puts rank " +
                  std::to_string(r) + "'s shard at " + to_string(b.offset));
    if (!(t->shape_extents() == b.shape))
      throw error(ctx + ": tensor '" + name + "' has shape " + to_string(t->shape_extents()) + ", rank " +
                  std::to_string(r) + "'s shard under its layout is " + to_string(b.shape));
    return *t;
  }

 private:
  void check_rank_fields(const safetensors_reader& rd, int r) const {
    const std::string ctx = "load_distributed_checkpoint: " + rd.path().string();
    const int rank = parse_count(rd.metadata(), "tessera.rank", ctx);
    const int ranks = parse_count(rd.metadata(), "tessera.ranks", ctx);
    if (rank != r) throw error(ctx + ": the file says it was written by rank " + std::to_string(rank) + ", expected " + std::to_string(r));
    if (ranks != ranks_)
      throw error(ctx + ": the file says " + std::to_string(ranks) + " ranks wrote the checkpoint, rank 0's file says " +
                  std::to_string(ranks_));
  }

  std::filesystem::path file_;
  std::unique_ptr<safetensors_reader> first_;
  std::map<int, std::unique_ptr<safetensors_reader>> readers_;
  std::map<std::string, tensor_placement> placements_;
  std::vector<param_spec> specs_;
  std::map<std::string, std::size_t> spec_index_;
  int ranks_ = 0;
};

}  // namespace detail

/// Loads a checkpoint into distributed tensors of any layout, on any number of ranks
/// (MindSpore's load_distributed_checkpoint). Needs no communication: each rank reads
/// what its own shards need.
///
/// - A whole file at `file`: each rank reads, of each tensor, only the box of its
///   shard (shard_box of the parameter's layout).
/// - Per-rank files rank_file(file, r) (integrated_save off), from N ranks under any
///   layouts: the re-sharding rule. Source rank r holds box B_r = shard_box(L_s, G, r)
///   of tensor G under its saved layout L_s. The target box T = shard_box(L_t, G, rank)
///   is assembled from B_r cap T over the source ranks r whose coordinates on L_s's
///   replica axes are all 0 (the other replicas hold the same values); pieces that
///   differ only in L_s's partial axes are reduced (summed, or max/min), so a partial
///   checkpoint loads as its reduced value. Only files with a non-empty intersection
///   are opened, and of each only the intersection's bytes are read.
///
/// Names, dtypes and global shapes are checked first; every mismatch is reported in
/// one error (tensors the network does not take count only when `strict`). Every file
/// opened is validated against rank 0's: kind, rank, rank count, dtype, layout, shape
/// and offset. A parameter in a partial layout is loaded as in load_param_into_net.
inline void load_distributed_checkpoint(const std::filesystem::path& file, std::span<const param_ref> params,
                                        bool strict = true) {
  const char* fn = "load_distributed_checkpoint";
  std::error_code ec;
  if (std::filesystem::is_regular_file(file, ec)) {
    safetensors_reader r(file);
    const std::string ctx = std::string(fn) + ": " + file.string();
    if (read_kind(r.metadata(), ctx) == checkpoint_kind::shard) {
      throw error(ctx + ": the file holds one rank's shards; pass the checkpoint's name without the rank_R "
                        "folder (DIR/NAME for DIR/rank_R/NAME)");
    }
    std::vector<param_spec> found, expected;
    for (const tensor_info& t : r.tensors()) found.push_back({t.name, t.type, t.shape_extents()});
    for (const param_ref& p : params) expected.push_back(p.spec());
    check_params(found, expected, strict, ctx);
    for (const param_ref& p : params) {
      const layout& l = p.layout();
      visit_dtype(
          p.type(),
          [&]<class T>(std::type_identity<T>) {
            T* dst = p.mutable_local_data<T>();
            if (!detail::first_on_axes(l.dev, l.partial, p.rank())) {
              std::fill_n(dst, p.local_size(), reduce_identity<T>(l.op));
              return;
            }
            r.read_box(p.name(), shard_box(l, p.global_shape(), p.rank()), std::span<T>(dst, p.local_size()));
          },
          ctx);
    }
    return;
  }
  if (!std::filesystem::is_regular_file(rank_file(file, 0), ec))
    throw error(std::string(fn) + ": neither " + file.string() + " (a whole checkpoint) nor " +
                rank_file(file, 0).string() + " (rank 0's shards) exists");
  detail::shard_set set(file);
  std::vector<param_spec> expected;
  for (const param_ref& p : params) expected.push_back(p.spec());
  check_params(set.specs(), expected, strict, std::string(fn) + ": " + file.string() + " (" + std::to_string(set.ranks()) + " shard files)");

  for (const param_ref& p : params) {
    const tensor_placement& src = set.placement(p.name());
    const layout& lt = p.layout();
    const extents& g = p.global_shape();
    visit_dtype(
        p.type(),
        [&]<class T>(std::type_identity<T>) {
          T* dst = p.mutable_local_data<T>();
          if (!detail::first_on_axes(lt.dev, lt.partial, p.rank())) {
            std::fill_n(dst, p.local_size(), reduce_identity<T>(lt.op));
            return;
          }
          const box target = shard_box(lt, g, p.rank());
          const layout& ls = src.placement;
          const bool reduce = ls.has_partial();
          if (reduce) std::fill_n(dst, p.local_size(), reduce_identity<T>(ls.op));
          std::vector<T> piece, cur;
          for (int r = 0; r < set.ranks(); ++r) {
            if (!detail::first_on_axes(ls.dev, ls.replica_axes(), r)) continue;
            const box b = shard_box(ls, g, r);
            const box in = intersect(b, target);
            if (in.shape.size() == 0) continue;
            const tensor_info& t = set.shard_info(r, p.name());
            piece.resize(std::size_t(in.shape.size()));
            set.reader(r).read_box_host_bytes(t, box{detail::relative(in.offset, b.offset), in.shape},
                                              std::as_writable_bytes(std::span<T>(piece)));
            const extents at = detail::relative(in.offset, target.offset);
            const extents zero = tessera::detail::origin(in.shape.ndim);
            if (!reduce) {
              tessera::detail::copy_box(piece.data(), in.shape, zero, dst, target.shape, at, in.shape);
              continue;
            }
            cur.resize(piece.size());
            tessera::detail::copy_box(static_cast<const T*>(dst), target.shape, at, cur.data(), in.shape, zero, in.shape);
            for (std::size_t k = 0; k < cur.size(); ++k) cur[k] = reduce_apply(ls.op, cur[k], piece[k]);
            tessera::detail::copy_box(static_cast<const T*>(cur.data()), in.shape, zero, dst, target.shape, at, in.shape);
          }
        },
        fn);
  }
}

/// The metadata of checkpoint `file` (DIR/NAME): the whole file's, or rank 0's shard
/// file's (DIR/rank_0/NAME) for a checkpoint saved per rank. Reads only the header.
inline std::map<std::string, std::string> checkpoint_metadata(const std::filesystem::path& file) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(file, ec)) return safetensors_reader(file).metadata();
  if (std::filesystem::is_regular_file(rank_file(file, 0), ec)) return safetensors_reader(rank_file(file, 0)).metadata();
  throw error("checkpoint_metadata: neither " + file.string() + " (a whole checkpoint) nor " +
              rank_file(file, 0).string() + " (rank 0's shards) exists");
}

/// The newest complete checkpoint of `prefix` under `dir`, as DIR/NAME (what
/// load_distributed_checkpoint and model.resume_from take), or nullopt when there is
/// none: a whole file DIR/NAME, or the shard files DIR/rank_R/NAME of every rank R of the
/// job that saved it ("tessera.ranks" of rank 0's). A job that died while saving leaves
/// the step's files of the ranks that finished, which do not count: the step before is
/// then the newest. Files are written atomically (a file present was written whole);
/// the header of each file counted is read, and a corrupt one is an error.
///
///     if (auto last = io::latest_complete_checkpoint("ckpt", "resnet")) model.resume_from(*last);
inline std::optional<std::filesystem::path> latest_complete_checkpoint(const std::filesystem::path& dir,
                                                                       std::string_view prefix) {
  std::vector<checkpoint_entry> all = list_checkpoints(dir, prefix);
  for (const checkpoint_entry& e : list_checkpoints(dir / "rank_0", prefix))
    all.push_back({dir / e.path.filename(), e.at});
  std::sort(all.begin(), all.end(), [](const checkpoint_entry& a, const checkpoint_entry& b) {
    return a.at != b.at ? b.at < a.at : a.path < b.path;  // newest first
  });
  std::error_code ec;
  for (const checkpoint_entry& e : all) {
    if (std::filesystem::is_regular_file(e.path, ec)) {
      safetensors_reader check(e.path);
      return e.path;
    }
    const std::filesystem::path first = rank_file(e.path, 0);
    safetensors_reader r0(first);
    const int ranks = detail::parse_count(r0.metadata(), "tessera.ranks", "latest_complete_checkpoint: " + first.string());
    bool complete = true;
    for (int r = 1; r < ranks && complete; ++r) {
      const std::filesystem::path f = rank_file(e.path, r);
      complete = std::filesystem::is_regular_file(f, ec);
      if (complete) safetensors_reader check(f);
    }
    if (complete) return e.path;
  }
  return std::nullopt;
}

}  // namespace tessera::io
