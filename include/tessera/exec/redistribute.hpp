// Runs redistribution plans: the one place that calls collectives to move a
// tensor's data from one layout to another. Written once for every device: shards are
// the device's arrays (tensor/device.hpp's storage trait packs, unpacks and fills
// them), and the communicator moves that device's memory.
#pragma once

#include <concepts>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/plan/cache.hpp>
#include <tessera/plan/planner.hpp>
#include <tessera/tensor/copy_box.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera {

namespace detail {

/// Shards of device D move through communicators of D's memory: a compile-time error
/// naming both for a typed communicator, a run-time one for any_communicator (whose
/// backend is chosen when the job starts). `fn` names the caller.
template <class D, class C>
void check_comm_memory(const C& c, const char* fn = "redistribute") {
  constexpr bool host = std::same_as<D, cpu_device>;
  if constexpr (requires { { c.device_buffers() } -> std::convertible_to<bool>; }) {
    if (c.device_buffers() == host)
      throw error(std::string(fn) +
                  (host ? ": host (cpu_device) tensors need a communicator of host memory, and the "
                        : ": cuda_device tensors need a communicator of device buffers, and the ") +
                  std::string(c.backend()) + " backend " + (host ? "takes device buffers" : "takes host memory"));
  } else if constexpr (host) {
    static_assert(!takes_device_buffers<C>,
                  "redistribute: host (cpu_device) tensors need a communicator of host memory "
                  "(mpi_communicator, local_communicator), not one of device buffers");
  } else {
    static_assert(takes_device_buffers<C>,
                  "redistribute: cuda_device tensors need a communicator of device buffers "
                  "(nccl_communicator, or staged_communicator over an MPI communicator)");
  }
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
template <class A, class C>
void run_exchange(const layout& from, const layout& to, const extents& global, const A& cur, A& next,
                  mesh_comm<C>& mc) {
  using T = typename A::value_type;
  using S = storage_of<A>;
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
  A sbuf = S::empty(extents{stotal}), rbuf = S::empty(extents{rtotal});
  auto rel = [](const box& b, const box& base) {
    extents o = b.offset;
    for (int d = 0; d < o.ndim; ++d) o.v[d] -= base.offset.v[d];
    return o;
  };
  for (int r = 0; r < p; ++r) {
    if (scount[r] == 0) continue;
    const box b = intersect(shard_box(to, global, r), src_me);
    S::copy_box(cur.data(), src_shape, rel(b, src_me), sbuf.data() + sdispl[r], b.shape,
                origin(b.shape.ndim), b.shape);
  }
  mc.world().all_to_all_v(std::span<const T>(sbuf.data(), sbuf.size()), std::span<const int>(scount),
                          std::span<const int>(sdispl), std::span<T>(rbuf.data(), rbuf.size()),
                          std::span<const int>(rcount), std::span<const int>(rdispl));
  const box own = intersect(dst_me, src_me);
  if (own.shape.size() > 0)
    S::copy_box(cur.data(), src_shape, rel(own, src_me), next.data(), dst_shape, rel(own, dst_me),
                own.shape);
  for (int r = 0; r < p; ++r) {
    if (rcount[r] == 0) continue;
    const box b = intersect(dst_me, shard_box(from, global, r));
    S::copy_box(rbuf.data() + rdispl[r], b.shape, origin(b.shape.ndim), next.data(), dst_shape,
                rel(b, dst_me), b.shape);
  }
}

}  // namespace detail

namespace detail {

// Runs the plan's steps on the shard laid out as p.from, which either `borrowed`
// points to (read in place; the first in-place step copies it) or `owned` holds (then
// in-place steps reuse its storage).
template <class A, class C>
A execute_steps(const plan& p, const A* borrowed, A owned, mesh_comm<C>& mc) {
  using T = typename A::value_type;
  using S = storage_of<A>;
  check_comm_memory<device_of_t<A>>(mc.world());
  A cur = std::move(owned);
  const A* src = borrowed ? borrowed : &cur;
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
    A next;
    const axis_list group{st.axis};
    const int g = st.axis >= 0 ? l.dev.dims[st.axis] : 1;
    const int idx = st.axis >= 0 ? group_index(l.dev, group, me) : 0;
    const int n = ls.ndim;
    switch (st.kind) {
      case step_kind::slice: {
        next = S::empty(ns);
        extents off = detail::origin(n);
        off.v[st.dim] = idx * ns.v[st.dim];
        S::copy_box(src->data(), ls, off, next.data(), ns, detail::origin(n), ns);
        break;
      }
      case step_kind::all_gather: {
        next = S::empty(ns);
        C& c = mc.group(group);
        if (detail::leading_dims_trivial(ls, st.dim)) {
          c.all_gather(std::span<const T>(src->data(), src->size()), std::span<T>(next.data(), next.size()));
        } else {
          A recv = S::empty(extents{index_t(next.size())});
          c.all_gather(std::span<const T>(src->data(), src->size()), std::span<T>(recv.data(), recv.size()));
          for (int j = 0; j < g; ++j) {
            extents off = detail::origin(n);
            off.v[st.dim] = j * ls.v[st.dim];
            S::copy_box(recv.data() + j * src->size(), ls, detail::origin(n), next.data(), ns, off, ls);
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
        next = S::empty(ns);
        C& c = mc.group(group);
        if (detail::leading_dims_trivial(ls, st.dim)) {
          c.reduce_scatter(std::span<const T>(src->data(), src->size()), std::span<T>(next.data(), next.size()), st.op);
        } else {
          A send = S::empty(extents{index_t(src->size())});
          for (int j = 0; j < g; ++j) {
            extents off = detail::origin(n);
            off.v[st.dim] = j * ns.v[st.dim];
            S::copy_box(src->data(), ls, off, send.data() + j * next.size(), ns, detail::origin(n), ns);
          }
          c.reduce_scatter(std::span<const T>(send.data(), send.size()), std::span<T>(next.data(), next.size()), st.op);
        }
        break;
      }
      case step_kind::all_to_all: {
        next = S::empty(ns);
        extents bs = ls;  // one block: ls with dim2 cut g ways
        bs.v[st.dim2] /= g;
        const index_t bsize = bs.size();
        // Blocks along a dim are contiguous when every dim before it has extent 1:
        // then the send side needs no packing, or the receive side no unpacking.
        const bool packed_in = detail::leading_dims_trivial(ls, st.dim2);
        const bool packed_out = detail::leading_dims_trivial(ns, st.dim);
        A send = S::empty(extents{packed_in ? 0 : index_t(src->size())});
        A recv = S::empty(extents{packed_out ? 0 : index_t(src->size())});
        if (!packed_in)
          for (int k = 0; k < g; ++k) {
            extents off = detail::origin(n);
            off.v[st.dim2] = k * bs.v[st.dim2];
            S::copy_box(src->data(), ls, off, send.data() + k * bsize, bs, detail::origin(n), bs);
          }
        mc.group(group).all_to_all(
            std::span<const T>(packed_in ? src->data() : send.data(), src->size()),
            std::span<T>(packed_out ? next.data() : recv.data(), src->size()));
        if (!packed_out)
          for (int k = 0; k < g; ++k) {
            extents off = detail::origin(n);
            off.v[st.dim] = k * bs.v[st.dim];
            S::copy_box(recv.data() + k * bsize, bs, detail::origin(n), next.data(), ns, off, bs);
          }
        break;
      }
      case step_kind::mask: {
        next = src == &cur ? std::move(cur) : *src;
        if (idx != 0) S::fill(next, reduce_identity<T>(st.op));
        break;
      }
      case step_kind::expand: {
        next = S::empty(ns);
        S::fill(next, reduce_identity<T>(st.op));
        extents off = detail::origin(n);
        off.v[st.dim] = idx * ls.v[st.dim];
        S::copy_box(src->data(), ls, detail::origin(n), next.data(), ns, off, ls);
        break;
      }
      case step_kind::exchange: {
        next = S::empty(ns);
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
/// first step that works in place (all_reduce, mask) copies it. `in` is any device's
/// array (xt::xarray<T> on the host); the communicator moves that device's memory.
template <class A, class C>
A execute(const plan& p, const A& in, mesh_comm<C>& mc) {
  return detail::execute_steps(p, &in, A{}, mc);
}

/// As above, taking over `in`'s storage (no copy even for in-place steps).
template <class A, class C>
  requires(!std::is_lvalue_reference_v<A>)
A execute(const plan& p, A&& in, mesh_comm<C>& mc) {
  return detail::execute_steps(p, static_cast<const A*>(nullptr), std::move(in), mc);
}

/// Redistributes `x` to the static layout `To`. With a static layout and shape on both
/// sides the plan is a compile-time constant (static_plan); otherwise it is planned at
/// run time by the same function, once per process (plan/cache.hpp).
template <layout To, class T, auto L, auto G, class D, class C>
dist_tensor<T, To, G, D> redistribute(const dist_tensor<T, L, G, D>& x, mesh_comm<C>& mc) {
  if constexpr (detail::is_static_layout<L> && detail::is_static_shape<G>) {
    if constexpr (G.is_static()) {
      constexpr const plan& p = static_plan<L, To, G, T>;
      dist_tensor<T, To, G, D> out(To, x.global_shape(), x.rank());
      out.assign_local(execute(p, x.local(), mc));
      return out;
    }
  }
  const auto rp = cached_plan(x.layout(), To, x.global_shape(), index_t(sizeof(T)));
  dist_tensor<T, To, G, D> out(To, x.global_shape(), x.rank());
  out.assign_local(execute(rp->p, x.local(), mc));
  return out;
}

/// Redistributes `x` to a layout known only at run time, on `mc`'s mesh (planned once
/// per process).
template <class T, auto L, auto G, class D, class C>
tensor_on<T, D> redistribute(const dist_tensor<T, L, G, D>& x, const layout& to, mesh_comm<C>& mc) {
  const auto rp = cached_plan(x.layout(), to, x.global_shape(), index_t(sizeof(T)));
  return tensor_on<T, D>(to, x.global_shape(), x.rank(), execute(rp->p, x.local(), mc));
}

/// Redistributes `x` to `to`, which may be on another device matrix of the same ranks
/// (each operator has its own): both layouts are written on the two meshes' common
/// refinement (core/refine.hpp), which leaves every shard where it is, and planned
/// there (plan_across_meshes, once per process: cached_plan).
template <class T, auto L, auto G, class D, class C>
tensor_on<T, D> redistribute(const dist_tensor<T, L, G, D>& x, const layout& to, device_context<C>& ctx) {
  const auto rp = cached_plan(x.layout(), to, x.global_shape(), index_t(sizeof(T)));
  return tensor_on<T, D>(to, x.global_shape(), x.rank(), execute(rp->p, x.local(), ctx.on(rp->fine)));
}

/// A tensor in a wanted layout, as an operator takes its inputs: the caller's own tensor
/// when it already was laid out so (borrowed: no copy), else its redistribution (owned).
/// Used like a pointer: `in->local()`.
template <class T, class D = cpu_device>
class laid_out {
 public:
  explicit laid_out(const tensor_on<T, D>& borrowed) : borrowed_(&borrowed) {}
  explicit laid_out(tensor_on<T, D>&& owned) : owned_(std::move(owned)) {}
  const tensor_on<T, D>& operator*() const { return owned_ ? *owned_ : *borrowed_; }
  const tensor_on<T, D>* operator->() const { return &**this; }
  /// The redistributed copy this holds, for the caller to write over or move from (it is
  /// nobody else's); null when this borrows.
  tensor_on<T, D>* owned() { return owned_ ? &*owned_ : nullptr; }

 private:
  const tensor_on<T, D>* borrowed_ = nullptr;
  std::optional<tensor_on<T, D>> owned_;
};

/// `x` laid out as `l`: x itself (borrowed, no copy) when it places the same shard on
/// every rank (same_placement: possibly on another device matrix of the same ranks,
/// then its layout() stays x's), else redistributed into `l`.
template <class T, class D, class C>
laid_out<T, D> in_layout(const tensor_on<T, D>& x, const layout& l, device_context<C>& ctx) {
  if (same_placement(x.layout(), l)) return laid_out<T, D>(x);
  return laid_out<T, D>(redistribute(x, l, ctx));
}

}  // namespace tessera
