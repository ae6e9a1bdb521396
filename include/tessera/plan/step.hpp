// The primitive steps of a redistribution, what each does to a layout, and what it
// costs. The planner searches over these; the executor runs them.
#pragma once

#include <string>
#include <string_view>
#include <tessera/core/extents.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/plan/cost.hpp>

namespace tessera {

/// A redistribution step over the group of one mesh axis `axis` (g = its size), or
/// over the whole mesh for `exchange`. Local shard = S bytes before the step.
///
/// | kind           | before -> after on `axis`              | bytes received per rank |
/// |----------------|-----------------------------------------|--------------------------|
/// | slice          | replica -> splits `dim` (minor-most)    | 0                        |
/// | all_gather     | minor-most split of `dim` -> replica    | (g - 1) S                |
/// | all_reduce     | partial -> replica                      | 2 (g - 1) / g S          |
/// | reduce_scatter | partial -> splits `dim` (minor-most)    | (g - 1) / g S            |
/// | all_to_all     | minor-most split of `dim` -> of `dim2`  | (g - 1) / g S            |
/// | mask           | replica -> partial (member 0 keeps the values, the others hold the identity) | 0 |
/// | expand         | minor-most split of `dim` -> partial (the shard placed in a tensor of the reduction identity) | 0 |
/// | exchange       | any non-partial layout -> `to` (point to point, each rank receives exactly what it lacks) | per rank |
enum class step_kind : unsigned char {
  slice,
  all_gather,
  all_reduce,
  reduce_scatter,
  all_to_all,
  mask,
  expand,
  exchange,
};

constexpr std::string_view to_string(step_kind k) {
  switch (k) {
    case step_kind::slice: return "slice";
    case step_kind::all_gather: return "all_gather";
    case step_kind::all_reduce: return "all_reduce";
    case step_kind::reduce_scatter: return "reduce_scatter";
    case step_kind::all_to_all: return "all_to_all";
    case step_kind::mask: return "mask";
    case step_kind::expand: return "expand";
    case step_kind::exchange: return "exchange";
  }
  return "?";
}

/// One step of a plan and the layout it leaves.
struct plan_step {
  step_kind kind = step_kind::slice;
  int axis = -1;  ///< the mesh axis whose groups communicate (-1 for exchange)
  int dim = -1;   ///< the tensor dim split, gathered or scattered (source dim of all_to_all)
  int dim2 = -1;  ///< all_to_all: the dim that becomes split
  reduce_op op = reduce_op::sum;  ///< reduction of all_reduce, reduce_scatter, mask, expand
  layout after;   ///< the layout after this step
  index_t bytes = 0;  ///< bytes received per rank (exchange: the most any rank receives)

  friend constexpr bool operator==(const plan_step&, const plan_step&) = default;
};

namespace detail {

/// Bytes `rank` receives when an exchange turns non-partial `from` into `to`: the part
/// of its target shard that its own source shard lacks (sources with the same replica
/// coordinates tile the tensor, so exactly that much arrives).
constexpr index_t exchange_elements(const layout& from, const layout& to, const extents& global,
                                    int rank) {
  const box target = shard_box(to, global, rank);
  const box overlap = intersect(target, shard_box(from, global, rank));
  return target.shape.size() - overlap.shape.size();
}

constexpr index_t exchange_max_elements(const layout& from, const layout& to,
                                        const extents& global) {
  index_t most = 0;
  for (int r = 0; r < from.dev.size(); ++r) {
    const index_t e = exchange_elements(from, to, global, r);
    if (e > most) most = e;
  }
  return most;
}

}  // namespace detail

/// Whether `kind` may act on mesh axis `axis` (dims `dim`, `dim2`) of layout `cur`,
/// for a tensor of shape `global` (new splits must divide the local extent).
constexpr bool step_applies(const layout& cur, const extents& global, step_kind kind, int axis,
                            int dim, int dim2) {
  if (kind == step_kind::exchange) return !cur.has_partial();
  if (axis < 0 || axis >= cur.dev.ndim) return false;
  const int g = cur.dev.dims[axis];
  const bool replica = (cur.replica_axes() >> axis & 1u) != 0;
  const bool partial = cur.is_partial(axis);
  if (kind == step_kind::all_reduce) return partial;
  if (kind == step_kind::mask) return replica;
  if (dim < 0 || dim >= cur.ndim) return false;
  const axis_list& on_dim = cur.split[dim];
  const bool minor_of_dim = on_dim.n > 0 && on_dim.v[on_dim.n - 1] == axis;
  auto divides = [&](int d) { return global.v[d] % (index_t(cur.pieces(d)) * g) == 0; };
  switch (kind) {
    case step_kind::slice: return replica && divides(dim);
    case step_kind::all_gather: return minor_of_dim;
    case step_kind::reduce_scatter: return partial && divides(dim);
    case step_kind::all_to_all:
      return minor_of_dim && dim2 >= 0 && dim2 < cur.ndim && dim2 != dim && divides(dim2);
    case step_kind::expand: return minor_of_dim;
    default: return false;
  }
}

/// The layout after a step. For exchange, `to` is the result.
/// @pre step_applies(cur, global, kind, axis, dim, dim2)
constexpr layout apply_step(const layout& cur, step_kind kind, int axis, int dim, int dim2,
                            reduce_op op, const layout& to) {
  const bool uses_dim = kind == step_kind::slice || kind == step_kind::all_gather ||
                        kind == step_kind::reduce_scatter || kind == step_kind::all_to_all ||
                        kind == step_kind::expand;
  if ((uses_dim && (dim < 0 || dim >= cur.ndim)) ||
      (kind == step_kind::all_to_all && (dim2 < 0 || dim2 >= cur.ndim)))
    throw error("apply_step: " + std::string(to_string(kind)) + " needs tensor dims in range");
  layout l = cur;
  switch (kind) {
    case step_kind::slice: l.split[dim].push_back(axis); break;
    case step_kind::all_gather: l.split[dim].pop_back(); break;
    case step_kind::all_reduce: l.partial &= ~(1u << axis); break;
    case step_kind::reduce_scatter:
      l.partial &= ~(1u << axis);
      l.split[dim].push_back(axis);
      break;
    case step_kind::all_to_all:
      l.split[dim].pop_back();
      l.split[dim2].push_back(axis);
      break;
    case step_kind::mask: l.partial |= 1u << axis; break;
    case step_kind::expand:
      l.split[dim].pop_back();
      l.partial |= 1u << axis;
      break;
    case step_kind::exchange: return to;
  }
  if (l.partial == 0) l.op = reduce_op::sum;
  else l.op = op;
  return l;
}

/// Bytes per rank that a step moves, from the layout before it (exchange: the most
/// any rank receives, see step_bytes_for_rank).
constexpr index_t step_bytes(const layout& cur, const extents& global, index_t elem_bytes,
                             step_kind kind, int axis, const layout& after) {
  const index_t s = local_size(cur, global) * elem_bytes;
  const int g = axis >= 0 ? cur.dev.dims[axis] : 1;
  switch (kind) {
    case step_kind::all_gather: return cost::all_gather(s, g);
    case step_kind::all_reduce: return cost::all_reduce(s, g);
    case step_kind::reduce_scatter: return cost::reduce_scatter(s, g);
    case step_kind::all_to_all: return cost::all_to_all(s, g);
    case step_kind::exchange: return detail::exchange_max_elements(cur, after, global) * elem_bytes;
    default: return 0;
  }
}

}  // namespace tessera
