// Runs redistribution plans: the one place that calls collectives to move a
// tensor's data from one layout to another.
#pragma once

#include <optional>
#include <span>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/exec/pack.hpp>
#include <tessera/plan/planner.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera {

namespace detail {

template <class T>
xt::xarray<T> empty_local(const extents& shape) {
  std::vector<std::size_t> s(shape.v.begin(), shape.v.begin() + shape.ndim);
  return xt::xarray<T>::from_shape(s);
}

// True when the blocks of dim `d` are contiguous: every dim before it has extent 1.
inline bool leading_dims_trivial(const extents& shape, int d) {
  for (int i = 0; i < d; ++i)
    if (shape.v[i] != 1) return false;
  return true;
}

// Point-to-point exchange from non-partial `from` to `to`: rank s sends rank r the part
// of r's target shard that s's source shard holds, when s != r and both have the same
// coordinates on from's replica axes (those sources tile the tensor once).
template <class T, class C>
void run_exchange(const layout& from, const layout& to, const extents& global,
                  const xt::xarray<T>& cur, xt::xarray<T>& next, mesh_comm<C>& mc) {
  const mesh& m = from.dev;
  const int me = mc.rank(), p = m.size();
  const axis_mask replicas = from.replica_axes();
  const mesh_coords my = m.coords(me);
  auto same_replica = [&](int r) {
    const mesh_coords c = m.coords(r);
    for (int a = 0; a < m.ndim; ++a)
      if ((replicas >> a & 1u) && c[a] != my[a]) return false;
    return true;
  };
  const box src_me = shard_box(from, global, me), dst_me = shard_box(to, global, me);
  const extents src_shape = src_me.shape, dst_shape = dst_me.shape;
  std::vector<int> scount(p, 0), sdispl(p, 0), rcount(p, 0), rdispl(p, 0);
  index_t stotal = 0, rtotal = 0;
  for (int r = 0; r < p; ++r) {
    if (r == me || !same_replica(r)) continue;
    scount[r] = int(intersect(shard_box(to, global, r), src_me).shape.size());
    rcount[r] = int(intersect(dst_me, shard_box(from, global, r)).shape.size());
    sdispl[r] = int(stotal);
    rdispl[r] = int(rtotal);
    stotal += scount[r];
    rtotal += rcount[r];
  }
  std::vector<T> sbuf(stotal), rbuf(rtotal);
  auto rel = [](const box& b, const box& base) {
    extents o = b.offset;
    for (int d = 0; d < o.ndim; ++d) o.v[d] -= base.offset.v[d];
    return o;
  };
  for (int r = 0; r < p; ++r) {
    if (scount[r] == 0) continue;
    const box b = intersect(shard_box(to, global, r), src_me);
    copy_box(cur.data(), src_shape, rel(b, src_me), sbuf.data() + sdispl[r], b.shape,
             origin(b.shape.ndim), b.shape);
  }
  mc.world().all_to_all_v(std::span<const T>(sbuf), std::span<const int>(scount),
                          std::span<const int>(sdispl), std::span<T>(rbuf),
                          std::span<const int>(rcount), std::span<const int>(rdispl));
  const box own = intersect(dst_me, src_me);
  if (own.shape.size() > 0)
    copy_box(cur.data(), src_shape, rel(own, src_me), next.data(), dst_shape, rel(own, dst_me),
             own.shape);
  for (int r = 0; r < p; ++r) {
    if (rcount[r] == 0) continue;
    const box b = intersect(dst_me, shard_box(from, global, r));
    copy_box(rbuf.data() + rdispl[r], b.shape, origin(b.shape.ndim), next.data(), dst_shape,
             rel(b, dst_me), b.shape);
  }
}

}  // namespace detail

namespace detail {

// Runs the plan's steps on the shard laid out as p.from, which either `borrowed`
// points to (read in place; the first in-place step copies it) or `owned` holds (then
// in-place steps reuse its storage).
template <class T, class C>
xt::xarray<T> execute_steps(const plan& p, const xt::xarray<T>* borrowed, xt::xarray<T> owned,
                            mesh_comm<C>& mc) {
  xt::xarray<T> cur = std::move(owned);
  const xt::xarray<T>* src = borrowed ? borrowed : &cur;
  if (!(mc.mesh() == p.from.dev))
    throw error(fail(errc::plan_mesh_mismatch), "execute: plan mesh " + to_string(p.from.dev) +
                                                    ", communicator mesh " + to_string(mc.mesh()));
  const index_t need = local_size(p.from, p.global);
  if (index_t(src->size()) != need)
    throw error(fail(errc::buffer_size, -1, -1, index_t(src->size()), need), "execute");
  if (p.empty()) return borrowed ? *borrowed : std::move(cur);
  const int me = mc.rank();
  layout l = p.from;
  for (const plan_step& st : p) {
    const extents ls = local_shape(l, p.global);
    const extents ns = local_shape(st.after, p.global);
    xt::xarray<T> next;
    const axis_list group{st.axis};
    const int g = st.axis >= 0 ? l.dev.dims[st.axis] : 1;
    const int idx = st.axis >= 0 ? group_index(l.dev, group, me) : 0;
    const int n = ls.ndim;
    switch (st.kind) {
      case step_kind::slice: {
        next = detail::empty_local<T>(ns);
        extents off = detail::origin(n);
        off.v[st.dim] = idx * ns.v[st.dim];
        detail::copy_box(src->data(), ls, off, next.data(), ns, detail::origin(n), ns);
        break;
      }
      case step_kind::all_gather: {
        next = detail::empty_local<T>(ns);
        C& c = mc.group(group);
        if (detail::leading_dims_trivial(ls, st.dim)) {
          c.all_gather(std::span<const T>(src->data(), src->size()), std::span<T>(next.data(), next.size()));
        } else {
          std::vector<T> recv(next.size());
          c.all_gather(std::span<const T>(src->data(), src->size()), std::span<T>(recv));
          for (int j = 0; j < g; ++j) {
            extents off = detail::origin(n);
            off.v[st.dim] = j * ls.v[st.dim];
            detail::copy_box(recv.data() + j * src->size(), ls, detail::origin(n), next.data(), ns, off, ls);
          }
        }
        break;
      }
      case step_kind::all_reduce: {
        next = src == &cur ? std::move(cur) : *src;
        mc.group(group).all_reduce(std::span<T>(next.data(), next.size()), st.op);
        break;
      }
      case step_kind::reduce_scatter: {
        next = detail::empty_local<T>(ns);
        C& c = mc.group(group);
        if (detail::leading_dims_trivial(ls, st.dim)) {
          c.reduce_scatter(std::span<const T>(src->data(), src->size()), std::span<T>(next.data(), next.size()), st.op);
        } else {
          std::vector<T> send(src->size());
          for (int j = 0; j < g; ++j) {
            extents off = detail::origin(n);
            off.v[st.dim] = j * ns.v[st.dim];
            detail::copy_box(src->data(), ls, off, send.data() + j * next.size(), ns, detail::origin(n), ns);
          }
          c.reduce_scatter(std::span<const T>(send), std::span<T>(next.data(), next.size()), st.op);
        }
        break;
      }
      case step_kind::all_to_all: {
        next = detail::empty_local<T>(ns);
        extents bs = ls;  // one block: ls with dim2 cut g ways
        bs.v[st.dim2] /= g;
        const index_t bsize = bs.size();
        // Blocks along a dim are contiguous when every dim before it has extent 1:
        // then the send side needs no packing, or the receive side no unpacking.
        const bool packed_in = detail::leading_dims_trivial(ls, st.dim2);
        const bool packed_out = detail::leading_dims_trivial(ns, st.dim);
        std::vector<T> send(packed_in ? 0 : src->size()), recv(packed_out ? 0 : src->size());
        if (!packed_in)
          for (int k = 0; k < g; ++k) {
            extents off = detail::origin(n);
            off.v[st.dim2] = k * bs.v[st.dim2];
            detail::copy_box(src->data(), ls, off, send.data() + k * bsize, bs, detail::origin(n), bs);
          }
        mc.group(group).all_to_all(
            std::span<const T>(packed_in ? src->data() : send.data(), src->size()),
            std::span<T>(packed_out ? next.data() : recv.data(), src->size()));
        if (!packed_out)
          for (int k = 0; k < g; ++k) {
            extents off = detail::origin(n);
            off.v[st.dim] = k * bs.v[st.dim];
            detail::copy_box(recv.data() + k * bsize, bs, detail::origin(n), next.data(), ns, off, bs);
          }
        break;
      }
      case step_kind::mask: {
        next = src == &cur ? std::move(cur) : *src;
        if (idx != 0) next.fill(reduce_identity<T>(st.op));
        break;
      }
      case step_kind::expand: {
        next = detail::empty_local<T>(ns);
        next.fill(reduce_identity<T>(st.op));
        extents off = detail::origin(n);
        off.v[st.dim] = idx * ls.v[st.dim];
        detail::copy_box(src->data(), ls, detail::origin(n), next.data(), ns, off, ls);
        break;
      }
      case step_kind::exchange: {
        next = detail::empty_local<T>(ns);
        detail::run_exchange(l, st.after, p.global, *src, next, mc);
        break;
      }
    }
    cur = std::move(next);
    src = &cur;
    l = st.after;
  }
  return cur;
}

}  // namespace detail

/// Runs `p` on this rank's shard `in` (laid out as p.from) and returns the shard of
/// p.to. Every rank of the mesh must call it with the same plan. The bytes the
/// communicators count equal p.bytes_for_rank(rank). `in` is read in place; only a
/// first step that works in place (all_reduce, mask) copies it.
template <class T, class C>
xt::xarray<T> execute(const plan& p, const xt::xarray<T>& in, mesh_comm<C>& mc) {
  return detail::execute_steps(p, &in, xt::xarray<T>{}, mc);
}

/// As above, taking over `in`'s storage (no copy even for in-place steps).
template <class T, class C>
xt::xarray<T> execute(const plan& p, xt::xarray<T>&& in, mesh_comm<C>& mc) {
  return detail::execute_steps(p, static_cast<const xt::xarray<T>*>(nullptr), std::move(in), mc);
}

/// Redistributes `x` to the static layout `To`. With a static layout and shape on both
/// sides the plan is a compile-time constant (static_plan); otherwise it is planned at
/// run time by the same function.
template <layout To, class T, auto L, auto G, class C>
dist_tensor<T, To, G> redistribute(const dist_tensor<T, L, G>& x, mesh_comm<C>& mc) {
  if constexpr (detail::is_static_layout<L> && detail::is_static_shape<G>) {
    if constexpr (G.is_static()) {
      constexpr const plan& p = static_plan<L, To, G, T>;
      dist_tensor<T, To, G> out(To, x.global_shape(), x.rank());
      out.assign_local(execute(p, x.local(), mc));
      return out;
    }
  }
  const plan p = plan_redistribution(x.layout(), To, x.global_shape(), index_t(sizeof(T)));
  dist_tensor<T, To, G> out(To, x.global_shape(), x.rank());
  out.assign_local(execute(p, x.local(), mc));
  return out;
}

/// Redistributes `x` to a layout known only at run time.
template <class T, auto L, auto G, class C>
dist_tensor<T> redistribute(const dist_tensor<T, L, G>& x, const layout& to, mesh_comm<C>& mc) {
  const plan p = plan_redistribution(x.layout(), to, x.global_shape(), index_t(sizeof(T)));
  dist_tensor<T> out(to, x.global_shape(), x.rank());
  out.assign_local(execute(p, x.local(), mc));
  return out;
}

/// Redistributes `x` to `to`, which may be on another device matrix of the same ranks
/// (each operator has its own): both layouts are written on the two meshes' common
/// refinement (core/refine.hpp), which leaves every shard where it is, and planned
/// there.
template <class T, auto L, auto G, class C>
dist_tensor<T> redistribute(const dist_tensor<T, L, G>& x, const layout& to, device_context<C>& ctx) {
  const layout& from = x.layout();
  xt::xarray<T> local;
  if (from.dev == to.dev) {
    const plan p = plan_redistribution(from, to, x.global_shape(), index_t(sizeof(T)));
    local = execute(p, x.local(), ctx.on(from.dev));
  } else {
    require(check_refinement(from.dev, to.dev), "redistribute");
    const mesh fine = common_refinement(from.dev, to.dev);
    const plan p =
        plan_redistribution(refine(from, fine), refine(to, fine), x.global_shape(), index_t(sizeof(T)));
    local = execute(p, x.local(), ctx.on(fine));
  }
  dist_tensor<T> out(to, x.global_shape(), x.rank());
  out.assign_local(std::move(local));
  return out;
}

/// A tensor in a wanted layout, as an operator takes its inputs: the caller's own tensor
/// when it already was laid out so (borrowed: no copy), else its redistribution (owned).
/// Used like a pointer: `in->local()`.
template <class T>
class laid_out {
 public:
  explicit laid_out(const dist_tensor<T>& borrowed) : borrowed_(&borrowed) {}
  explicit laid_out(dist_tensor<T>&& owned) : owned_(std::move(owned)) {}
  const dist_tensor<T>& operator*() const { return owned_ ? *owned_ : *borrowed_; }
  const dist_tensor<T>* operator->() const { return &**this; }

 private:
  const dist_tensor<T>* borrowed_ = nullptr;
  std::optional<dist_tensor<T>> owned_;
};

/// `x` laid out as `l`: x itself when it already is, else redistributed (possibly from
/// another device matrix of the same ranks).
template <class T, class C>
laid_out<T> in_layout(const dist_tensor<T>& x, const layout& l, device_context<C>& ctx) {
  if (x.layout() == l) return laid_out<T>(x);
  return laid_out<T>(redistribute(x, l, ctx));
}

}  // namespace tessera
