// The price of every assignment of candidate strategies to a graph's unconfigured
// operators, computed here from the operators' rules and the planner (the searches'
// price, written again independently): what the searches' choices are checked against.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>
#include <tessera/core/refine.hpp>
#include <tessera/graph/parallel.hpp>

namespace tessera::graph::testing {


// Bytes of a redistribution, from the planner on the common refinement.
inline index_t price(const layout& from, const layout& to, const extents& shape) {
  static std::map<std::string, index_t> memo;
  const std::string k = to_string(from.dev) + to_string(from) + "|" + to_string(to.dev) + to_string(to) + "|" + to_string(shape);
  const auto it = memo.find(k);
  if (it != memo.end()) return it->second;
  index_t b;
  if (from.dev == to.dev) {
    b = plan_redistribution(from, to, shape, 4).bytes_per_rank();
  } else {
    const mesh fine = common_refinement(from.dev, to.dev);
    b = plan_redistribution(refine(from, fine), refine(to, fine), shape, 4).bytes_per_rank();
  }
  memo.emplace(k, b);
  return b;
}

// The number of nodes, as a vector size.
inline std::size_t node_count(const traced_graph& g) { return std::size_t(g.size()); }

struct brute_result {
  index_t best = infinite_bytes;
  index_t of_choice = -1;  // the price of the strategies parallelize chose
};

// The price (see graph/propagate.hpp) of every assignment of candidates to the
// operators without a strategy, and of `chosen`; data inputs are split by the batch
// over (n,). With flops_per_byte > 0, dynamic_programming's: each operator's work
// (three forwards where its backward runs) over flops_per_byte, in whole bytes, added.
inline brute_result brute_force_price(const traced_graph& g, int n, const std::vector<op_plan>& chosen,
                               double flops_per_byte = 0) {
  const int size = g.size();
  // needs_grad: depends on a parameter and receives a gradient.
  std::vector<bool> dep(node_count(g), false), rec(node_count(g), false);
  for (int id = 0; id < size; ++id) {
    const node& nd = g.at(id);
    dep[id] = nd.kind == node_kind::parameter;
    if (nd.kind == node_kind::op)
      for (std::size_t s = 0; s < nd.inputs.size(); ++s) dep[id] = dep[id] || (dep[nd.inputs[s]] && nd.op->differentiable(int(s)));
  }
  rec[g.loss()] = true;
  for (int id = size - 1; id >= 0; --id)
    if (g.at(id).kind == node_kind::op && rec[id] && dep[id])
      for (std::size_t s = 0; s < g.at(id).inputs.size(); ++s)
        if (g.at(id).op->differentiable(int(s))) rec[g.at(id).inputs[s]] = true;
  auto needs = [&](int id) { return dep[id] && rec[id]; };

  // Choices per operator, in node order: the user's strategy, or every candidate, each
  // preceded by its variants that keep the partial sums some choice of a producer gives
  // (graph::partial_variants).
  std::vector<std::vector<strategy>> options(node_count(g));
  std::vector<std::vector<op_layouts>> lays(node_count(g));
  std::vector<int> ops;
  for (int id = 0; id < size; ++id) {
    const node& nd = g.at(id);
    if (nd.kind != node_kind::op) continue;
    ops.push_back(id);
    const std::vector<strategy> base =
        nd.user_strategy ? std::vector<strategy>{*nd.user_strategy} : nd.op->candidates(n, g.input_shapes(id));
    std::vector<std::vector<layout>> arriving;
    for (int p : nd.inputs) {
      arriving.emplace_back();
      if (g.at(p).kind == node_kind::op)
        for (const op_layouts& l : lays[p]) arriving.back().push_back(l.out);
    }
    for (const strategy& st : base) {
      const op_layouts l = nd.op->layouts(st, n, g.input_shapes(id));
      for (const op_layouts& v : partial_variants(*nd.op, l, arriving)) {
        options[id].push_back(st);
        lays[id].push_back(v);
      }
      options[id].push_back(st);
      lays[id].push_back(l);
    }
  }
  // Into an operator input: a route, or infinite where it would make partial sums.
  auto into = [&](const layout& from, const layout& to, const extents& shape) {
    return creates_partial(from, to) ? infinite_bytes : price(from, to, shape);
  };
  auto total = [&](const std::vector<int>& pick) {
    index_t t = 0;
    auto add = [&](index_t b) { t = t + b >= infinite_bytes ? infinite_bytes : t + b; };
    auto lay = [&](int id) -> const op_layouts& { return lays[id][pick[id]]; };
    for (int c : ops) {
      const node& nd = g.at(c);
      if (flops_per_byte > 0)
        add(index_t((needs(c) ? 3.0 : 1.0) * nd.op->forward_work(lay(c), g.input_shapes(c), nd.shape) / flops_per_byte +
                    0.5));
      for (const internal_collective& ic : nd.op->collectives(options[c][pick[c]], n, g.input_shapes(c), 4))
        if (!ic.backward || needs(c)) add(ic.bytes);
      for (std::size_t s = 0; s < nd.inputs.size(); ++s) {
        const int p = nd.inputs[s];
        const node& pn = g.at(p);
        const bool back = needs(p) && nd.op->differentiable(int(s));
        const layout& in = lay(c).in[s];
        if (pn.kind == node_kind::input) {
          layout l = layout::replicated(mesh{n}, pn.shape.ndim);
          l.split[0] = axis_list{0};
          add(into(l, in, pn.shape));
        } else if (pn.kind == node_kind::parameter) {
          const auto [c0, s0] = g.consumers(p).front();
          const layout& pl = lay(c0).in[s0];
          if (!same_placement(pl, in) || in.has_partial()) add(infinite_bytes);
          if (back) add(price(lay(c).in_grad[s], pl, pn.shape));
        } else {
          add(into(lay(p).out, in, pn.shape));
          if (back) add(price(lay(c).in_grad[s], lay(p).out_grad, pn.shape));
        }
      }
    }
    const layout& loss = lay(g.loss()).out;
    add(price(loss, layout::replicated(loss.dev, 0), g.at(g.loss()).shape));
    return t;
  };
  brute_result r;
  std::vector<int> pick(node_count(g), 0);
  while (true) {
    r.best = std::min(r.best, total(pick));
    std::size_t i = 0;
    while (i < ops.size() && ++pick[ops[i]] == int(options[ops[i]].size())) pick[ops[i++]] = 0;
    if (i == ops.size()) break;
  }
  for (int c : ops) {
    int k = 0;
    while (!(options[c][k] == chosen[c].st && lays[c][k] == chosen[c].lay)) ++k;
    pick[c] = k;
  }
  r.of_choice = total(pick);
  return r;
}

}  // namespace tessera::graph::testing
