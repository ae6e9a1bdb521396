// Sharding propagation: the strategies of the operators the user did not configure,
// chosen so that the redistributions around them move the fewest bytes per rank,
// priced by the planner (plan/planner.hpp). Standard library only.
//
// The price of a strategy assignment is the bytes per rank of every redistribution a
// training step runs because of it, each priced by plan_redistribution:
//
// - forward, on each edge (a value read by an operator input): the producer's output
//   layout (a data input's import layout) -> the layout the consumer's rule wants;
// - backward, on each edge whose producer needs a gradient: the gradient of the input
//   as the consumer's backward returns it (possibly partial) -> the layout in which
//   the producer's backward takes its output's gradient; for a parameter, its
//   layout: this is the reduction of its gradient (the AllReduce of data parallelism);
// - the collectives an operator runs inside itself (op_def::collectives);
// - the loss's fetch: its layout -> replicated, every rank reading it whole.
//
// A parameter read by several operators must be laid out alike by all of them.
//
// Partial sums. An operator linear in some inputs (op_def::linear: Neg, Transpose,
// Reshape, StridedSlice, ReduceSum and ReduceMean in their input; Add, Sub, BiasAdd and
// Concat in all inputs together; Mul, MatMul and BatchMatMul in either operand; RealDiv
// in its numerator) has, besides each strategy's layouts, variants that keep the
// partial sums its producers may give it partial (op_def.hpp: partial_variants; the
// output is then partial too, and its gradient taken whole), listed before the
// strategy's own layouts so that ties keep partial sums partial. A variant is a choice
// like a candidate (a configured operator with variants chooses among them too), and
// its input edges are priced as any other: the route from the producer's partial
// output moves nothing when the placements agree, and the sums are resolved at the
// first operator that takes the value whole, by the cheapest plan into its layout
// (a ReduceScatter when it wants it split), or at the loss's fetch. An input that
// would have to be made partial (masked) costs infinite_bytes: partial sums come from
// producers only.
//
// The search. The unconfigured operators (and configured ones with partial variants)
// are the variables; an edge to a configured
// operator or a data input prices one variable, an edge between two unconfigured
// operators a pair. Unconfigured operators linked by edges form components; a
// component linked to some configured operator takes strategies that minimise the
// total price exactly: by dynamic programming from its first operator reached by
// propagation when its links form a tree, by enumeration when they do not and it has
// at most 2^20 assignments, else greedily in breadth-first order from the configured
// operators (each operator the cheapest given the ones decided before it). Ties go to
// the first candidate in the operator's order (op_def::candidates: more devices
// first, then larger splits of earlier dims). A component no configured operator
// reaches gets the data-parallel strategies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/graph/op_def.hpp>
#include <tessera/plan/cache.hpp>
#include <tessera/plan/planner.hpp>

namespace tessera::graph {

/// The price of something that cannot be done (layouts of device matrices that share
/// no refinement; a parameter laid out two ways). Sums saturate at this value.
inline constexpr index_t infinite_bytes = std::numeric_limits<index_t>::max() / 4;

/// A redistribution between layouts on two device matrices of the same ranks: both
/// written on the matrices' common refinement `fine` (core/refine.hpp), where every
/// shard stays put, and planned there. Equal layouts give an empty plan.
struct route {
  layout from, to;       ///< the layouts joined, as given
  mesh fine;             ///< the device matrix the plan runs on
  plan p;                ///< the cheapest plan on `fine`
  bool feasible = true;  ///< false when the device matrices share no refinement
  /// Bytes per rank (infinite_bytes when not feasible).
  index_t bytes() const { return feasible ? p.bytes_per_rank() : infinite_bytes; }
  bool empty() const { return feasible && p.empty(); }
};

/// The route of a tensor of shape `shape` from `from` to `to`: plan/cache.hpp's
/// plan_across_meshes, planned once per process (cached_plan). Example: the seed's
/// first MatMul output ([0, 2] partial sum {1} on (2, 4, 1)) to ReLU (2, 4) ([0, 1] on
/// (2, 4)): refinement (2, 4), one reduce_scatter over mesh axis 1, 384 bytes for
/// (16, 16) floats. Whether two layouts place a value alike is core/refine.hpp's
/// same_placement.
inline route plan_route(const layout& from, const layout& to, const extents& shape, index_t elem_bytes) {
  route r;
  r.from = from;
  r.to = to;
  if (!(from.dev == to.dev) && !check_refinement(from.dev, to.dev).ok()) {
    r.feasible = false;
    return r;
  }
  const auto rp = cached_plan(from, to, shape, elem_bytes);
  r.fine = rp->fine;
  r.p = rp->p;
  return r;
}

/// "[1, 2] on device matrix (2, 4, 1)": a layout as the graph's errors and dumps print
/// it, without the axes of size 1 (MatMul ((8, 1), (1, 1))'s weight: "[-, -] on device
/// matrix (8, 1, 1)", whole on every rank).
inline std::string describe(const layout& l) {
  return to_string(refine(l, l.dev)) + " on device matrix " + to_string(l.dev);
}

/// Whether moving a value from `from` to `to` would create partial sums `from` does not
/// hold (the planner's mask step). An operator that keeps partial sums (pass_layouts)
/// takes them from its producer only: such an edge is priced infinite_bytes.
inline bool creates_partial(const layout& from, const layout& to) {
  if (!to.has_partial()) return false;
  if (from.dev == to.dev)
    return (to.partial & ~from.partial) != 0 || (from.has_partial() && from.op != to.op);
  if (from.dev.size() != to.dev.size() || !check_refinement(from.dev, to.dev).ok()) return true;
  const mesh fine = common_refinement(from.dev, to.dev);
  const layout f = refine(from, fine), t = refine(to, fine);
  return (t.partial & ~f.partial) != 0 || (f.has_partial() && f.op != t.op);
}

namespace detail {

constexpr index_t add_bytes(index_t a, index_t b) { return a + b >= infinite_bytes ? infinite_bytes : a + b; }

// Plans computed once per (from, to, shape).
class route_cache {
 public:
  explicit route_cache(index_t elem_bytes) : elem_bytes_(elem_bytes) {}
  const route& get(const layout& from, const layout& to, const extents& shape) {
    std::string key = text(from) + '|' + text(to) + '|' + to_string(shape);
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(std::move(key), plan_route(from, to, shape, elem_bytes_)).first;
    return it->second;
  }
  index_t bytes(const layout& from, const layout& to, const extents& shape) { return get(from, to, shape).bytes(); }
  /// The bytes of a value's way into an operator input: infinite when it would create
  /// partial sums (creates_partial).
  index_t forward_bytes(const layout& from, const layout& to, const extents& shape) {
    return creates_partial(from, to) ? infinite_bytes : bytes(from, to, shape);
  }

 private:
  static std::string text(const layout& l) {
    return to_string(l.dev) + to_string(l) + std::to_string(int(l.op));
  }
  index_t elem_bytes_;
  std::map<std::string, route> cache_;
};

// The layouts of operator `id` under `st`, or a failed status with the message's
// context; no exception.
struct evaluation {
  std::optional<op_layouts> lay;
  status s;
  std::string context;
};

// What an operator's candidates and their layouts depend on: its type, attributes and
// input and output shapes ("MatMul|transpose_a: false, ...|(16, 8)|(16, 32)|(32, 8)").
// Operators with equal signatures (the layers of a stack) share their evaluation.
inline std::string signature(const traced_graph& g, int id) {
  const node& nd = g.at(id);
  std::string key = nd.op->type() + '|' + nd.op->attributes() + '|' + to_string(nd.shape);
  const shape_list shapes = g.input_shapes(id);
  for (int i = 0; i < shapes.n; ++i) key += '|' + to_string(shapes[i]);
  return key;
}

// The bytes one device holds for operator `id` under layouts `l`, as
// parallel_graph::memory_per_device counts them: its output (kept for the backward),
// and each parameter it is the first reader of, with the parameter's gradient and
// `optimizer_slots` tensors of optimizer state.
inline index_t op_memory(const traced_graph& g, int id, const op_layouts& l, index_t elem_bytes, int optimizer_slots) {
  const node& nd = g.at(id);
  index_t b = local_size(l.out, nd.shape) * elem_bytes;
  for (std::size_t s = 0; s < nd.inputs.size(); ++s) {
    const int p = nd.inputs[s];
    if (g.at(p).kind == node_kind::parameter && g.consumers(p).front() == std::pair<int, int>{id, int(s)})
      b += local_size(l.in[s], g.at(p).shape) * elem_bytes * (2 + optimizer_slots);
  }
  return b;
}

inline evaluation evaluate(const traced_graph& g, int id, const strategy& st, int device_num) {
  const node& n = g.at(id);
  const shape_list shapes = g.input_shapes(id);
  const std::string who = "parallelize: " + g.describe(id);
  if (const status s = n.op->check(st, device_num, shapes); !s.ok()) return {std::nullopt, s, who};
  op_layouts l = n.op->layouts(st, device_num, shapes);
  for (int i = 0; i < shapes.n; ++i)
    if (const status s = check(l.in[i], shapes[i]); !s.ok())
      return {std::nullopt, s, who + ": input " + std::to_string(i) + " " + to_string(shapes[i])};
  if (const status s = check(l.out, n.shape); !s.ok()) return {std::nullopt, s, who + ": output " + to_string(n.shape)};
  return {std::move(l), {}, {}};
}

}  // namespace detail

// ---- the min-sum problem and its solver ----------------------------------------------

/// Variables with finitely many choices (candidate indices), a cost per choice, and a
/// cost per pair of choices of two linked variables: minimise the total.
struct search_problem {
  struct pair_cost {
    int u = 0, v = 0;             ///< u < v
    std::vector<index_t> cost;    ///< cost[su * choices[v] + sv]
  };
  std::vector<int> choices;                  ///< per variable, the number of candidates (>= 1)
  std::vector<std::vector<index_t>> unary;   ///< per variable and candidate
  std::vector<pair_cost> pairs;              ///< at most one per pair of variables
  std::vector<bool> anchored;                ///< linked to a configured operator

  /// The pair cost between u and v (u != v), created on first use.
  pair_cost& link(int u, int v) {
    if (u > v) std::swap(u, v);
    for (pair_cost& p : pairs)
      if (p.u == u && p.v == v) return p;
    pairs.push_back({u, v, std::vector<index_t>(choices[u] * choices[v], 0)});
    return pairs.back();
  }
  /// Adds c to the cost of (u chooses su, v chooses sv).
  void add_pair(int u, int su, int v, int sv, index_t c) {
    if (u > v) {
      std::swap(u, v);
      std::swap(su, sv);
    }
    pair_cost& p = link(u, v);
    index_t& x = p.cost[su * choices[v] + sv];
    x = detail::add_bytes(x, c);
  }
  /// The total cost of a full assignment.
  index_t total(const std::vector<int>& pick) const {
    index_t t = 0;
    for (std::size_t v = 0; v < choices.size(); ++v) t = detail::add_bytes(t, unary[v][pick[v]]);
    for (const pair_cost& p : pairs)
      t = detail::add_bytes(t, p.cost[pick[p.u] * choices[p.v] + pick[p.v]]);
    return t;
  }
};

/// How a component of the problem was solved.
enum class search_method { dynamic_programming, enumeration, greedy, unanchored };

/// The choices of every variable of anchored components (-1 for the variables of
/// components with no anchor) and how each variable's component was solved.
struct search_result {
  std::vector<int> pick;
  std::vector<search_method> method;
};

namespace detail {

struct solver {
  const search_problem& pb;
  int n;
  std::vector<std::vector<std::pair<int, int>>> adj;  // (neighbour, pair index)

  explicit solver(const search_problem& p) : pb(p), n(int(p.choices.size())), adj(std::size_t(n)) {
    for (std::size_t i = 0; i < pb.pairs.size(); ++i) {
      adj[pb.pairs[i].u].emplace_back(pb.pairs[i].v, int(i));
      adj[pb.pairs[i].v].emplace_back(pb.pairs[i].u, int(i));
    }
  }
  // Pair cost between v choosing sv and w choosing sw, through pair index k.
  index_t pc(int k, int v, int sv, int sw) const {
    const search_problem::pair_cost& p = pb.pairs[k];
    const int su = p.u == v ? sv : sw, s2 = p.u == v ? sw : sv;
    return p.cost[su * pb.choices[p.v] + s2];
  }
  int nc(int v) const { return pb.choices[v]; }

  // Tree: dynamic programming rooted at `root`.
  void tree(const std::vector<int>& comp, int root, std::vector<int>& pick) const {
    std::vector<int> order{root}, parent(std::size_t(n), -1), via(std::size_t(n), -1);
    std::vector<bool> seen(std::size_t(n), false);
    seen[root] = true;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (auto [w, k] : adj[order[i]])
        if (!seen[w]) {
          seen[w] = true;
          parent[w] = order[i];
          via[w] = k;
          order.push_back(w);
        }
    (void)comp;
    // local[v][s]: v's cost and its subtree's for choice s.
    std::vector<std::vector<index_t>> local(pick.size());
    std::vector<std::vector<int>> best(pick.size());  // best[v][s_parent]
    for (int v : order) local[v] = pb.unary[v];
    for (std::size_t i = order.size(); i-- > 1;) {
      const int v = order[i], p = parent[v], k = via[v];
      best[v].assign(std::size_t(nc(p)), 0);
      for (int sp = 0; sp < nc(p); ++sp) {
        index_t m = infinite_bytes + 1;
        int arg = 0;
        for (int s = 0; s < nc(v); ++s) {
          const index_t c = add_bytes(local[v][s], pc(k, v, s, sp));
          if (c < m) {
            m = c;
            arg = s;
          }
        }
        best[v][sp] = arg;
        local[p][sp] = add_bytes(local[p][sp], m);
      }
    }
    int arg = 0;
    for (int s = 1; s < nc(root); ++s)
      if (local[root][s] < local[root][arg]) arg = s;
    pick[root] = arg;
    for (std::size_t i = 1; i < order.size(); ++i) {
      const int v = order[i];
      pick[v] = best[v][pick[parent[v]]];
    }
  }

  // Every assignment of the component's variables (in id order, candidates in order).
  void enumerate(const std::vector<int>& comp, std::vector<int>& pick) const {
    std::vector<int> cur(std::size_t(n), 0), best_pick;
    index_t best = infinite_bytes + 1;
    auto cost = [&] {
      index_t t = 0;
      for (int v : comp) {
        t = add_bytes(t, pb.unary[v][cur[v]]);
        for (auto [w, k] : adj[v])
          if (w > v) t = add_bytes(t, pc(k, v, cur[v], cur[w]));
      }
      return t;
    };
    while (true) {
      const index_t c = cost();
      if (c < best) {
        best = c;
        best_pick = cur;
      }
      std::size_t i = comp.size();
      while (i-- > 0) {
        const int v = comp[i];
        if (++cur[v] < nc(v)) break;
        cur[v] = 0;
      }
      if (i == std::size_t(-1)) break;
    }
    for (int v : comp) pick[v] = best_pick[v];
  }

  // Breadth-first from the anchored variables; each the cheapest given those before.
  void greedy(const std::vector<int>& comp, std::vector<int>& pick) const {
    std::vector<int> order;
    std::vector<bool> seen(std::size_t(n), false);
    for (int v : comp)
      if (pb.anchored[v]) {
        order.push_back(v);
        seen[v] = true;
      }
    for (std::size_t i = 0; i < order.size(); ++i)
      for (auto [w, k] : adj[order[i]])
        if (!seen[w]) {
          seen[w] = true;
          order.push_back(w);
        }
    for (int v : order) {
      index_t m = infinite_bytes + 1;
      int arg = 0;
      for (int s = 0; s < nc(v); ++s) {
        index_t c = pb.unary[v][s];
        for (auto [w, k] : adj[v])
          if (pick[w] >= 0) c = add_bytes(c, pc(k, v, s, pick[w]));
        if (c < m) {
          m = c;
          arg = s;
        }
      }
      pick[v] = arg;
    }
  }
};

}  // namespace detail

/// Solves `pb` component by component (see the top of this header). Components with no
/// anchored variable are left at -1.
inline search_result solve(const search_problem& pb, std::size_t enumeration_limit = std::size_t(1) << 20) {
  const detail::solver s(pb);
  const int n = s.n;
  search_result r{std::vector<int>(std::size_t(n), -1), std::vector<search_method>(std::size_t(n))};
  std::vector<int> comp_of(std::size_t(n), -1);
  for (int start = 0; start < n; ++start) {
    if (comp_of[start] >= 0) continue;
    std::vector<int> comp{start};
    comp_of[start] = start;
    for (std::size_t i = 0; i < comp.size(); ++i)
      for (auto [w, k] : s.adj[comp[i]])
        if (comp_of[w] < 0) {
          comp_of[w] = start;
          comp.push_back(w);
        }
    std::sort(comp.begin(), comp.end());
    int root = -1;
    for (int v : comp)
      if (pb.anchored[v]) {
        root = v;
        break;
      }
    search_method how = search_method::unanchored;
    if (root >= 0) {
      std::size_t links = 0;
      for (int v : comp) links += s.adj[v].size();
      links /= 2;
      std::size_t space = 1;
      bool small = true;
      for (int v : comp) {
        space *= std::size_t(s.nc(v));
        if (space > enumeration_limit) small = false;
        if (!small) break;
      }
      if (links + 1 == comp.size()) {
        how = search_method::dynamic_programming;
        s.tree(comp, root, r.pick);
      } else if (small) {
        how = search_method::enumeration;
        s.enumerate(comp, r.pick);
      } else {
        how = search_method::greedy;
        s.greedy(comp, r.pick);
      }
    }
    for (int v : comp) r.method[v] = how;
  }
  return r;
}

// ---- the graph's problem ------------------------------------------------------------

/// The strategies an operator may take and their layouts (those that pass every check).
struct op_candidates {
  std::vector<strategy> st;
  std::vector<op_layouts> lay;
};

/// What sharding propagation needs to know about a graph: per node, the import layout
/// of a data input, the layouts of a configured operator, the candidates of an
/// unconfigured one, and whether its value needs a gradient.
struct propagation_input {
  const traced_graph* g = nullptr;
  int device_num = 1;
  index_t elem_bytes = 4;
  std::vector<layout> input_layout;                 ///< per node (inputs)
  std::vector<std::optional<op_layouts>> fixed;     ///< per node (configured operators)
  std::vector<op_candidates> free;                  ///< per node (unconfigured operators, and
                                                    ///< configured ones with partial variants)
  std::vector<bool> anchor;                         ///< per node: a configured operator in `free`
                                                    ///< (it chooses among its strategy's variants)
  std::vector<bool> needs_grad;                     ///< per node
};

namespace detail {

// The bytes one edge (producer p -> slot `slot` of consumer c) moves, given the
// producer's value and gradient layouts and the consumer's layouts.
inline index_t edge_bytes(route_cache& rc, const extents& shape, const layout& p_value,
                          const std::optional<layout>& p_grad, const op_layouts& c, int slot) {
  index_t b = rc.forward_bytes(p_value, c.in[slot], shape);
  if (p_grad) b = add_bytes(b, rc.bytes(c.in_grad[slot], *p_grad, shape));
  return b;
}

}  // namespace detail

/// The search problem of a graph: one variable per unconfigured operator (in node
/// order) over its candidates. The i-th variable is node `vars[i]`.
struct graph_problem {
  search_problem pb;
  std::vector<int> vars;
  std::vector<int> var_of;  ///< per node, its variable or -1
};

/// Builds the priced problem (see the top of this header).
inline graph_problem build_problem(const propagation_input& in, detail::route_cache& rc) {
  const traced_graph& g = *in.g;
  graph_problem gp;
  gp.var_of.assign(std::size_t(g.size()), -1);
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op && !in.fixed[id]) {
      gp.var_of[id] = int(gp.vars.size());
      gp.vars.push_back(id);
      gp.pb.choices.push_back(int(in.free[id].st.size()));
    }
  search_problem& pb = gp.pb;
  pb.unary.resize(gp.vars.size());
  pb.anchored.assign(gp.vars.size(), false);
  for (std::size_t v = 0; v < gp.vars.size(); ++v) {
    const int id = gp.vars[v];
    const op_candidates& c = in.free[id];
    pb.unary[v].assign(c.st.size(), 0);
    if (id < int(in.anchor.size()) && in.anchor[id]) pb.anchored[v] = true;
    // The loss's fetch: every rank reads it whole.
    if (id == g.loss())
      for (std::size_t s = 0; s < c.st.size(); ++s) {
        const layout& out = c.lay[s].out;
        pb.unary[v][s] =
            detail::add_bytes(pb.unary[v][s], rc.bytes(out, layout::replicated(out.dev, 0), g.at(id).shape));
      }
    // Collectives inside the operator.
    for (std::size_t s = 0; s < c.st.size(); ++s)
      for (const internal_collective& ic :
           g.at(id).op->collectives(c.st[s], in.device_num, g.input_shapes(id), in.elem_bytes))
        if (!ic.backward || in.needs_grad[id]) pb.unary[v][s] = detail::add_bytes(pb.unary[v][s], ic.bytes);
  }
  auto lay = [&](int id, int s) -> const op_layouts& {
    return in.fixed[id] ? *in.fixed[id] : in.free[id].lay[s];
  };
  auto count = [&](int id) { return in.fixed[id] ? 1 : int(in.free[id].st.size()); };

  for (int c = 0; c < g.size(); ++c) {
    const node& cn = g.at(c);
    if (cn.kind != node_kind::op) continue;
    for (std::size_t slot = 0; slot < cn.inputs.size(); ++slot) {
      const int p = cn.inputs[slot];
      const node& pn = g.at(p);
      const bool back = in.needs_grad[p] && cn.op->differentiable(int(slot));
      const int vc = gp.var_of[c], vp = gp.var_of[p];
      if (pn.kind == node_kind::constant) {
        continue;  // a replicated scalar, made where it is read
      } else if (pn.kind == node_kind::input) {
        if (vc < 0) continue;
        for (int s = 0; s < count(c); ++s)
          pb.unary[vc][s] = detail::add_bytes(
              pb.unary[vc][s],
              rc.forward_bytes(in.input_layout[p], lay(c, s).in[slot], pn.shape));
      } else if (pn.kind == node_kind::parameter) {
        // The gradient's reduction into the parameter's layout, which is the consumer's
        // input layout (the parameter constraints below keep them one).
        if (vc < 0) continue;
        for (int s = 0; s < count(c); ++s) {
          if (lay(c, s).in[slot].has_partial()) pb.unary[vc][s] = infinite_bytes;  // a parameter is whole
          if (back)
            pb.unary[vc][s] = detail::add_bytes(
                pb.unary[vc][s],
                rc.bytes(lay(c, s).in_grad[slot], lay(c, s).in[slot], pn.shape));
        }
      } else {
        if (vc < 0 && vp < 0) continue;
        for (int sp = 0; sp < count(p); ++sp)
          for (int sc = 0; sc < count(c); ++sc) {
            const op_layouts& lp = lay(p, sp);
            const index_t b = detail::edge_bytes(rc, pn.shape, lp.out,
                                                 back ? std::optional<layout>(lp.out_grad) : std::nullopt,
                                                 lay(c, sc), int(slot));
            if (vc >= 0 && vp >= 0) {
              pb.add_pair(vp, sp, vc, sc, b);
            } else if (vc >= 0) {
              pb.unary[vc][sc] = detail::add_bytes(pb.unary[vc][sc], b);
              pb.anchored[vc] = true;
            } else {
              pb.unary[vp][sp] = detail::add_bytes(pb.unary[vp][sp], b);
              pb.anchored[vp] = true;
            }
          }
      }
    }
  }
  // A parameter read by several inputs must be laid out alike: every reader against
  // the first.
  for (int p : g.parameters()) {
    const auto readers = g.consumers(p);
    if (readers.size() < 2) continue;
    const auto [c0, s0] = readers[0];
    for (std::size_t k = 1; k < readers.size(); ++k) {
      const auto [ck, sk] = readers[k];
      const int v0 = gp.var_of[c0], vk = gp.var_of[ck];
      if (v0 < 0 && vk < 0) continue;
      for (int a = 0; a < count(c0); ++a)
        for (int b = 0; b < count(ck); ++b) {
          if (c0 == ck && a != b) continue;
          const bool same = same_placement(lay(c0, a).in[s0], lay(ck, b).in[sk]);
          if (same) continue;
          if (c0 == ck) {
            pb.unary[v0][a] = infinite_bytes;
          } else if (v0 >= 0 && vk >= 0) {
            pb.add_pair(v0, a, vk, b, infinite_bytes);
          } else if (v0 >= 0) {
            pb.unary[v0][a] = infinite_bytes;
            pb.anchored[v0] = true;
          } else {
            pb.unary[vk][b] = infinite_bytes;
            pb.anchored[vk] = true;
          }
        }
      // A link to a configured reader anchors even when every candidate agrees.
      if (v0 < 0 && vk >= 0) pb.anchored[vk] = true;
      if (vk < 0 && v0 >= 0) pb.anchored[v0] = true;
      if (v0 >= 0 && vk >= 0 && v0 != vk) pb.link(v0, vk);
    }
  }
  return gp;
}

}  // namespace tessera::graph
