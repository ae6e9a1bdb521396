// The redistribution planner: the cheapest sequence of steps (plan/step.hpp) from one
// layout to another, by bytes received per rank. A constexpr function, so a plan
// between static layouts is a compile-time constant and the same code plans
// layouts that exist only at run time.
#pragma once

#include <array>
#include <cstdint>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/plan/step.hpp>

namespace tessera {

inline constexpr int max_plan_steps = 24;

/// A redistribution plan: `steps` turn a tensor of shape `global` laid out as `from`
/// into `to`. `bytes_per_rank()` is its price: the sum over steps of the bytes each
/// rank receives (for an exchange step, the most any rank receives).
struct plan {
  layout from;
  layout to;
  extents global;
  index_t elem_bytes = 0;
  int n = 0;
  std::array<plan_step, max_plan_steps> steps{};

  constexpr int size() const { return n; }
  constexpr bool empty() const { return n == 0; }
  constexpr const plan_step& operator[](int i) const { return steps[i]; }
  constexpr const plan_step* begin() const { return steps.data(); }
  constexpr const plan_step* end() const { return steps.data() + n; }

  constexpr index_t bytes_per_rank() const {
    index_t b = 0;
    for (int i = 0; i < n; ++i) b += steps[i].bytes;
    return b;
  }
  /// The bytes `rank` receives over the whole plan (equal to bytes_per_rank() except
  /// where exchange steps load ranks unevenly).
  constexpr index_t bytes_for_rank(int rank) const {
    index_t b = 0;
    layout cur = from;
    for (int i = 0; i < n; ++i) {
      const plan_step& s = steps[i];
      b += s.kind == step_kind::exchange
               ? detail::exchange_elements(cur, s.after, global, rank) * elem_bytes
               : s.bytes;
      cur = s.after;
    }
    return b;
  }
  friend constexpr bool operator==(const plan&, const plan&) = default;
};

/// Checks that a redistribution is well posed: both layouts valid for `global`, on the
/// same mesh, of the same rank, every extent known, and partial states that agree on
/// their reduction.
constexpr status check_redistribution(const layout& from, const layout& to, const extents& global) {
  if (status s = check(from, global); !s.ok()) return s;
  if (status s = check(to, global); !s.ok()) return s;
  if (!(from.dev == to.dev)) return fail(errc::plan_mesh_mismatch);
  if (from.ndim != to.ndim) return fail(errc::plan_ndim_mismatch, -1, -1, from.ndim, to.ndim);
  for (int d = 0; d < global.ndim; ++d)
    if (global.v[d] == dynamic_extent) return fail(errc::negative_extent, d, -1, global.v[d]);
  if (from.has_partial() && to.has_partial() && from.op != to.op) return fail(errc::plan_partial_op);
  return {};
}

namespace detail {

inline constexpr int max_plan_states = 2048;
inline constexpr int plan_hash_size = 4096;  // power of two, twice the states

// A layout's placement packed into 6 bits per mesh axis: 0 replica, 1 partial,
// 2 + 8 * dim + position for a split.
constexpr std::uint64_t placement_key(const layout& l) {
  std::uint64_t key = 0;
  for (int a = 0; a < l.dev.ndim; ++a) {
    std::uint64_t code = l.is_partial(a) ? 1 : 0;
    for (int d = 0; d < l.ndim; ++d)
      for (int i = 0; i < l.split[d].n; ++i)
        if (l.split[d].v[i] == a) code = 2 + 8 * std::uint64_t(d) + std::uint64_t(i);
    key |= code << (6 * a);
  }
  return key;
}

// The layout whose placement is `key`, on the mesh and rank of `base`.
constexpr layout placement_layout(std::uint64_t key, const layout& base, reduce_op op) {
  layout l = layout::replicated(base.dev, base.ndim);
  // Splits are listed by position: fill position 0 of every dim first, then 1, ...
  for (int pos = 0; pos < max_mesh_ndim; ++pos)
    for (int a = 0; a < base.dev.ndim; ++a) {
      const std::uint64_t code = key >> (6 * a) & 63u;
      if (code >= 2 && int((code - 2) % 8) == pos) l.split[(code - 2) / 8].push_back(a);
    }
  for (int a = 0; a < base.dev.ndim; ++a)
    if ((key >> (6 * a) & 63u) == 1) l.partial |= 1u << a;
  if (l.partial) l.op = op;
  return l;
}

struct search_node {
  std::uint64_t key = 0;
  index_t bytes = 0;  // cost so far: bytes, then exchanges, then steps
  int exchanges = 0;
  int steps = 0;
  int prev = -1;
  step_kind kind = step_kind::slice;
  int axis = -1, dim = -1, dim2 = -1;
  bool done = false;
};

constexpr bool cheaper(index_t b1, int e1, int s1, index_t b2, int e2, int s2) {
  if (b1 != b2) return b1 < b2;
  if (e1 != e2) return e1 < e2;
  return s1 < s2;
}

struct search {
  std::array<search_node, max_plan_states> nodes{};
  std::array<int, plan_hash_size> table{};  // node index + 1; 0 = empty
  int count = 0;
  bool overflow = false;

  constexpr int find(std::uint64_t key) const {
    std::uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 52;
    for (;; h = (h + 1) & (plan_hash_size - 1)) {
      const int slot = table[h];
      if (slot == 0) return -1;
      if (nodes[slot - 1].key == key) return slot - 1;
    }
  }
  constexpr int insert(std::uint64_t key) {
    if (count == max_plan_states) {
      overflow = true;
      return -1;
    }
    std::uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 52;
    while (table[h] != 0) h = (h + 1) & (plan_hash_size - 1);
    table[h] = count + 1;
    nodes[count] = search_node{};
    nodes[count].key = key;
    return count++;
  }
};

// Appends a step to a plan, recomputing its layout and bytes from the one before.
constexpr void push_step(plan& p, const layout& cur, step_kind kind, int axis, int dim, int dim2,
                         reduce_op op) {
  plan_step s;
  s.kind = kind;
  s.axis = axis;
  s.dim = dim;
  s.dim2 = dim2;
  s.op = op;
  s.after = apply_step(cur, kind, axis, dim, dim2, op, p.to.without_partial());
  s.bytes = step_bytes(cur, p.global, p.elem_bytes, kind, axis, s.after);
  p.steps[p.n++] = s;
}

// Always valid, not always cheapest: reduce every partial axis, exchange into the
// target's placement, then mark the target's partial axes.
constexpr plan fallback_plan(plan p, reduce_op op) {
  layout cur = p.from;
  for (int a = 0; a < cur.dev.ndim; ++a)
    if (cur.is_partial(a)) {
      push_step(p, cur, step_kind::all_reduce, a, -1, -1, cur.op);
      cur = p.steps[p.n - 1].after;
    }
  if (!(cur == p.to.without_partial())) {
    push_step(p, cur, step_kind::exchange, -1, -1, -1, op);
    cur = p.steps[p.n - 1].after;
  }
  for (int a = 0; a < cur.dev.ndim; ++a)
    if (p.to.is_partial(a)) {
      push_step(p, cur, step_kind::mask, a, -1, -1, op);
      cur = p.steps[p.n - 1].after;
    }
  return p;
}

}  // namespace detail

/// The plan that moves the fewest bytes per rank from `from` to `to` for a tensor of
/// shape `global` with elements of `elem_bytes` bytes; ties go to fewer point-to-point
/// exchanges, then fewer steps. The search runs over layouts (Dijkstra); steps that
/// would split a dim unevenly are never taken. Example, mesh{4}, (64, 64) floats:
/// split dim 0 -> split dim 1 is one all_to_all of 3/4 of the 4 KiB shard, 3072 bytes.
/// @pre check_redistribution(from, to, global).ok() (throws tessera::error otherwise)
constexpr plan plan_redistribution(const layout& from, const layout& to, const extents& global,
                                   index_t elem_bytes) {
  require(check_redistribution(from, to, global), "plan_redistribution");
  plan p;
  p.from = from;
  p.to = to;
  p.global = global;
  p.elem_bytes = elem_bytes;
  if (from == to) return p;

  const reduce_op op = from.has_partial() ? from.op : to.op;
  const layout target_placement = to.without_partial();
  const std::uint64_t goal = detail::placement_key(to);
  const int k = from.dev.ndim;

  detail::search s;
  s.insert(detail::placement_key(from));
  int reached = -1;
  while (true) {
    // The open node of least cost.
    int u = -1;
    for (int i = 0; i < s.count; ++i)
      if (!s.nodes[i].done &&
          (u < 0 || detail::cheaper(s.nodes[i].bytes, s.nodes[i].exchanges, s.nodes[i].steps,
                                    s.nodes[u].bytes, s.nodes[u].exchanges, s.nodes[u].steps)))
        u = i;
    if (u < 0) break;
    s.nodes[u].done = true;
    if (s.nodes[u].key == goal) {
      reached = u;
      break;
    }
    const layout cur = detail::placement_layout(s.nodes[u].key, from, op);
    auto relax = [&](step_kind kind, int axis, int dim, int dim2) {
      if (!step_applies(cur, global, kind, axis, dim, dim2)) return;
      const layout next = apply_step(cur, kind, axis, dim, dim2, op, target_placement);
      const index_t b = s.nodes[u].bytes + step_bytes(cur, global, elem_bytes, kind, axis, next);
      const int e = s.nodes[u].exchanges + (kind == step_kind::exchange ? 1 : 0);
      const int st = s.nodes[u].steps + 1;
      const std::uint64_t key = detail::placement_key(next);
      int v = s.find(key);
      if (v < 0) {
        v = s.insert(key);
        if (v < 0) return;
      } else if (s.nodes[v].done ||
                 !detail::cheaper(b, e, st, s.nodes[v].bytes, s.nodes[v].exchanges, s.nodes[v].steps)) {
        return;
      }
      detail::search_node& n = s.nodes[v];
      n.bytes = b;
      n.exchanges = e;
      n.steps = st;
      n.prev = u;
      n.kind = kind;
      n.axis = axis;
      n.dim = dim;
      n.dim2 = dim2;
    };
    for (int a = 0; a < k; ++a) {
      for (int d = 0; d < from.ndim; ++d) {
        relax(step_kind::slice, a, d, -1);
        relax(step_kind::reduce_scatter, a, d, -1);
        relax(step_kind::all_gather, a, d, -1);
        for (int d2 = 0; d2 < from.ndim; ++d2) relax(step_kind::all_to_all, a, d, d2);
        if (to.is_partial(a)) relax(step_kind::expand, a, d, -1);
      }
      relax(step_kind::all_reduce, a, -1, -1);
      if (to.is_partial(a) && (!cur.has_partial() || cur.op == op)) relax(step_kind::mask, a, -1, -1);
    }
    if (!(cur == target_placement)) relax(step_kind::exchange, -1, -1, -1);
    if (s.overflow) break;
  }
  if (reached < 0 || s.overflow) return detail::fallback_plan(p, op);

  // Walk back from the goal, then replay forward to fill in layouts and bytes.
  std::array<int, max_plan_steps> path{};
  int len = 0;
  for (int v = reached; s.nodes[v].prev >= 0; v = s.nodes[v].prev) {
    if (len == max_plan_steps) return detail::fallback_plan(p, op);
    path[len++] = v;
  }
  layout cur = from;
  for (int i = len - 1; i >= 0; --i) {
    const detail::search_node& n = s.nodes[path[i]];
    detail::push_step(p, cur, n.kind, n.axis, n.dim, n.dim2, op);
    cur = p.steps[p.n - 1].after;
  }
  // The search tracks placements; the final layout also carries the target's reduction.
  if (p.n > 0) p.steps[p.n - 1].after = to;
  return p;
}

/// The plan between two static layouts, computed by the compiler. Invalid input fails
/// to compile with the rule as the message and the numbers in the instantiation note.
template <layout From, layout To, extents Global, class T>
inline constexpr plan static_plan = [] {
  constexpr status s = check_redistribution(From, To, Global);
  detail::static_require<s>();
  if constexpr (s.ok()) return plan_redistribution(From, To, Global, index_t(sizeof(T)));
  else return plan{};  // not reached: the static_assert above has failed
}();

}  // namespace tessera
