// The recursive_programming search: MindSpore's double-recursive strategy search
// (SAPP; Wang et al., "Efficient and Systematic Partitioning of Large and Deep Neural
// Networks for Parallelization", Euro-Par 2021), for device counts that are powers of
// two. Standard library only; graph/parallel.hpp calls it for
// search_mode::recursive_programming.
//
// The two recursions. The outer one cuts the devices: P = 2^R devices are reached in R
// rounds, each doubling the devices every operator uses. The inner one walks the
// operators: in each round, every operator the user did not configure is cut in two
// once, in order of decreasing weight (its stand-alone work, op_def::forward_work),
// along the cut that costs least given the cuts already made. A cut of an operator
// using d devices is a candidate strategy (op_def::candidates) using 2d devices whose
// every split equals the current one or doubles it: MatMul ((2, 1), (1, 1)) may go to
// ((4, 1), (1, 1)) (rows), ((2, 2), (2, 1)) (the inner dim, both operands' splits
// doubled together) or ((2, 1), (1, 2)) (columns). An operator without such a cut (its
// dims do not divide further) keeps its strategy that round; after the last round,
// each operator using fewer than P devices, and each reader of a shared parameter
// laid out unlike the parameter's first reader, is completed by sharding propagation:
// among all its candidates, the one that costs least given its neighbours (for a
// shared parameter's reader, among those that lay the parameter out alike).
//
// The symbolic cost of a cut: the operator's own collectives (op_def::collectives,
// its backward's too when it runs), its work (three forwards when its backward runs)
// over flops_per_byte as in dynamic_programming, and the symbolic bytes of every
// redistribution it takes part in with its neighbours as they stand (cut in this
// round already, or as the last round left them; configured operators as configured):
// its inputs' routes in, its output's routes out, their gradients' routes back, a
// parameter gradient's reduction, the loss's fetch. Symbolic bytes (symbolic_bytes
// below) are a closed form in the layouts, without the planner's search: the pending
// partial sums' reduce-scatter or all-reduce, then every byte a rank's new shard holds
// that its old shard does not. Each cut is priced in O(edges) lookups; the whole search
// in O(R x edges x cuts), so a graph of 10,000 operators on 1024 devices takes well under
// a second (bench_search). The chosen layouts are then planned exactly, as every mode's
// are (graph/parallel.hpp).
//
// Worked example: x (64, 1024) -> MatMul w1 (1024, 4096) -> ReLU -> MatMul w2 (4096, 16)
// -> ReduceMean, on 4 devices (2 rounds), flops_per_byte 10. Weights: w1's MatMul
// (537 MFLOP), then w2's (8.4 MFLOP), ReLU, ReduceMean. Round 1: w1's MatMul cut by rows
// would all-reduce w1's 16 MiB gradient (16 MiB received on 2 ranks); cut by columns,
// each half of w1 stays put and only the input, 256 KiB split by the batch, is gathered
// (128 KiB): it takes ((1, 1), (1, 2)). w2's MatMul then sees a column-split input: cut
// by its inner dim, ((1, 2), (2, 1)), it reads that split as it is and leaves a partial
// output of 64 x 16 floats (4 KiB); by rows it would exchange half of its 512 KiB shard
// of the hidden value (an all-to-all). ReLU follows the columns; ReduceMean splits the
// partial output's rows (a reduce-scatter of 2 KiB). Round 2 doubles the same cuts:
// w1's MatMul ((1, 1), (1, 4)), ReLU ((1, 4)), w2's ((1, 4), (4, 1)), ReduceMean
// ((4, 1)). tests/graph/test_recursive.cpp checks these choices, and that the plan's
// step cost is within 1 % of dynamic programming's.
//
// The same price drives sharding propagation on problems too large to price exactly
// (symbolic_propagation, at the end of this header).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/graph/op_def.hpp>
#include <tessera/graph/propagate.hpp>

namespace tessera::graph {

namespace detail {

// A layout written on the bits of the rank (the device count a power of two): mesh
// axis a of size 2^k and stride 2^m is bits m + k - 1 down to m. Per tensor dim, the
// bits that cut it, major to minor; the bits holding partial values.
struct bit_layout {
  int ndim = 0;
  std::array<std::array<std::int8_t, 32>, max_tensor_ndim> bits{};
  std::array<int, max_tensor_ndim> n{};
  std::uint32_t partial = 0;

  std::uint32_t split_mask() const {
    std::uint32_t m = 0;
    for (int d = 0; d < ndim; ++d)
      for (int i = 0; i < n[d]; ++i) m |= 1u << bits[d][i];
    return m;
  }
};

inline bit_layout to_bits(const layout& l) {
  std::array<int, max_mesh_ndim + 1> low{};  // per axis, its lowest bit
  std::array<int, max_mesh_ndim> width{};
  int b = 0;
  for (int a = l.dev.ndim - 1; a >= 0; --a) {
    low[a] = b;
    width[a] = std::countr_zero(unsigned(l.dev.dims[a]));
    b += width[a];
  }
  bit_layout out;
  out.ndim = l.ndim;
  for (int d = 0; d < l.ndim; ++d)
    for (int i = 0; i < l.split[d].n; ++i) {
      const int a = l.split[d].v[i];
      for (int k = width[a] - 1; k >= 0; --k) out.bits[d][out.n[d]++] = std::int8_t(low[a] + k);
    }
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.is_partial(a))
      for (int k = 0; k < width[a]; ++k) out.partial |= 1u << (low[a] + k);
  return out;
}

}  // namespace detail

/// The recursive_programming search's symbolic price of moving a tensor of `shape`
/// from `from` to `to` (device matrices of the same 2^k ranks): the bytes a rank
/// receives, estimated in closed form. Partial sums `to` does not hold are reduced
/// first: by a reduce-scatter ((g - 1) / g of the shard) when `to` splits the value
/// over all of their mesh axes, else by an all-reduce (2 (g - 1) / g); then a rank
/// receives its new shard less the part its old shard already holds: per dim, the
/// extent over 2 to the number of rank bits either layout cuts it by, a bit both use
/// counted once whatever its place (SAPP's view of a cut: an operator whose dim was
/// cut in two and is then cut in four keeps the first cut, though its device matrix
/// now orders that bit differently). Exact for the single collectives (all-gather,
/// all-to-all, reduce-scatter, all-reduce, slicing); an average over the ranks where
/// two layouts cut one dim by different bits; an underestimate where they cut it by
/// the same bits in another order. Throws when the device count is not a power of two
/// or the two device matrices hold different numbers of ranks.
inline double symbolic_bytes(const layout& from, const layout& to, const extents& shape, index_t elem_bytes) {
  const int ranks = from.dev.size();
  if (ranks != to.dev.size() || !std::has_single_bit(unsigned(ranks)))
    throw error("symbolic_bytes: device matrices " + to_string(from.dev) + " and " + to_string(to.dev) +
                " must hold the same power-of-two number of ranks");
  detail::bit_layout f = detail::to_bits(from);
  const detail::bit_layout t = detail::to_bits(to);
  auto local = [&](const detail::bit_layout& l) {
    double s = double(elem_bytes);
    for (int d = 0; d < l.ndim; ++d) s *= double(shape.v[d]) / double(std::uint64_t(1) << l.n[d]);
    return s;
  };
  double bytes = 0;
  if (const std::uint32_t pending = f.partial & ~t.partial) {
    const double g = double(std::uint64_t(1) << std::popcount(pending));
    if ((pending & t.split_mask()) == pending && (pending & f.split_mask()) == 0) {
      bytes += local(f) * (g - 1) / g;  // reduce-scatter: the sums arrive split as `to` splits them
      for (int d = 0; d < t.ndim; ++d)
        for (int i = 0; i < t.n[d]; ++i)
          if (pending >> t.bits[d][i] & 1u) f.bits[d][f.n[d]++] = t.bits[d][i];
    } else {
      bytes += 2 * local(f) * (g - 1) / g;  // all-reduce
    }
    f.partial &= ~pending;
  }
  double overlap = double(elem_bytes);
  for (int d = 0; d < t.ndim; ++d) {
    std::uint32_t both = 0;
    for (int i = 0; i < f.n[d]; ++i) both |= 1u << f.bits[d][i];
    for (int i = 0; i < t.n[d]; ++i) both |= 1u << t.bits[d][i];
    overlap *= double(shape.v[d]) / double(std::uint64_t(1) << std::popcount(both));
  }
  return bytes + std::max(0.0, local(t) - overlap);
}

/// What the recursive search needs to know about a graph: the import layout of each
/// data input, the layouts of each configured operator (the others are searched), and
/// whether each value needs a gradient.
struct recursive_input {
  const traced_graph* g = nullptr;
  int device_num = 1;                            ///< a power of two
  index_t elem_bytes = 4;
  double flops_per_byte = 10;                    ///< as parallel_config's
  std::vector<layout> input_layout;              ///< per node (data inputs)
  std::vector<std::optional<op_layouts>> fixed;  ///< per node (configured operators)
  std::vector<strategy> fixed_strategy;          ///< per node (configured operators)
  std::vector<bool> needs_grad;                  ///< per node
  /// The price of a byte of memory per device, in the cost's units: each candidate
  /// also costs memory_weight times the bytes it holds (op_memory: its output, the
  /// parameters it reads first with their gradients and optimizer state). 0: memory is
  /// free. parallelize raises it until the plan fits parallel_config::memory_budget.
  double memory_weight = 0;
  int optimizer_slots = 1;  ///< as parallel_config's
};

/// An unconfigured operator's strategy as the search chose it.
struct recursive_choice {
  strategy st;
  op_layouts lay;
  bool propagated = false;  ///< completed by sharding propagation (see the top of this header)
};

/// The search's outcome.
struct recursive_result {
  std::vector<std::optional<recursive_choice>> choice;  ///< per node: each unconfigured operator
  int rounds = 0;                                       ///< log2 of the device count
  int propagated = 0;                                   ///< operators completed by propagation
  double symbolic_cost = 0;  ///< the chosen assignment's symbolic cost (bytes' time, as step_cost)
};

namespace detail {

inline void require_power_of_two(int device_num, const char* who = "search recursive_programming") {
  if (device_num < 1 || !std::has_single_bit(unsigned(device_num)))
    throw error(std::string("parallelize: ") + who + " needs a device count that is a power of two, got " +
                std::to_string(device_num));
}

class recursive_search {
 public:
  explicit recursive_search(const recursive_input& in) : in_(in), g_(*in.g), N_(in.device_num) {
    table_of_.assign(std::size_t(g_.size()), -1);
    cur_.assign(std::size_t(g_.size()), 0);
    for (int id = 0; id < g_.size(); ++id) {
      const node& nd = g_.at(id);
      shape_id_.push_back(intern(nd.shape));
      if (nd.kind != node_kind::op) continue;
      if (in_.fixed[id]) {
        table_of_[id] = int(tables_.size());
        tables_.push_back(make_table(id, {in_.fixed_strategy[id]}, {*in_.fixed[id]}));
      } else {
        table_of_[id] = table_for(id);
        free_.push_back(id);
      }
    }
    for (int id = 0; id < g_.size(); ++id)
      if (g_.at(id).kind == node_kind::input) input_id_[id] = intern(in_.input_layout[id]);
  }

  recursive_result run() {
    decided_.assign(std::size_t(g_.size()), true);
    recursive_result r;
    r.rounds = std::countr_zero(unsigned(N_));
    r.choice.resize(std::size_t(g_.size()));
    // Start whole: each operator on one device (the candidate using fewest devices).
    for (int id : free_) {
      const op_table& t = tables_[table_of_[id]];
      cur_[id] = int(std::min_element(t.devices.begin(), t.devices.end()) - t.devices.begin());
    }
    std::vector<double> weight(std::size_t(g_.size()), 0.0);  // stand-alone work
    for (int id : free_) weight[id] = tables_[table_of_[id]].work[cur_[id]];
    std::vector<int> order = free_;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
    std::vector<int> cut_in(std::size_t(g_.size()), -1);  // the round that last cut an operator
    for (int round = 0; round < r.rounds; ++round)
      for (int id : order) {
        std::vector<int> cuts = children(table_of_[id], cur_[id]);
        if (cuts.empty()) continue;
        // A parameter shared with a reader cut this round is laid out as that reader
        // lays it out, where some cut can.
        keep_shared_alike(id, cuts, [&](int u) { return cut_in[u] == round; });
        cur_[id] = cheapest(id, cuts);
        cut_in[id] = round;
      }
    // Completion by sharding propagation.
    std::vector<bool> propagated(std::size_t(g_.size()), false);
    for (int id : order) {
      const op_table& t = tables_[table_of_[id]];
      if (t.devices[cur_[id]] == N_) continue;
      std::vector<int> all(t.st.size());
      for (std::size_t k = 0; k < all.size(); ++k) all[k] = int(k);
      cur_[id] = cheapest(id, all);
      propagated[id] = true;
    }
    align_shared_parameters(propagated);
    for (int id : free_) {
      const op_table& t = tables_[table_of_[id]];
      r.choice[id] = recursive_choice{t.st[cur_[id]], t.lay[cur_[id]], bool(propagated[id])};
      r.propagated += propagated[id] ? 1 : 0;
    }
    for (int id = 0; id < g_.size(); ++id)
      if (g_.at(id).kind == node_kind::op) r.symbolic_cost += cost(id, cur_[id], false);
    return r;
  }

  // Sharding propagation under the symbolic price (see symbolic_propagation).
  recursive_result propagate() {
    count_work_ = false;
    decided_.assign(std::size_t(g_.size()), false);
    for (int id = 0; id < g_.size(); ++id)
      if (g_.at(id).kind == node_kind::op && in_.fixed[id]) decided_[id] = true;
    // The operators linked to an operator: its producers, its consumers, and the other
    // readers of the parameters it reads.
    auto linked = [&](int id, auto&& f) {
      for (int p : g_.at(id).inputs) {
        if (g_.at(p).kind == node_kind::op) f(p);
        if (g_.at(p).kind == node_kind::parameter)
          for (const auto& [u, su] : g_.consumers(p))
            if (u != id) f(u);
      }
      for (const auto& [u, su] : g_.consumers(id)) f(u);
    };
    std::vector<int> queue;
    std::vector<bool> queued(std::size_t(g_.size()), false);
    auto reach = [&](int u) {
      if (!queued[u] && !decided_[u]) {
        queued[u] = true;
        queue.push_back(u);
      }
    };
    for (int id = 0; id < g_.size(); ++id)
      if (decided_[id]) linked(id, reach);
    std::vector<bool> reached(std::size_t(g_.size()), false);
    auto drain = [&] {
      for (std::size_t i = 0; i < queue.size(); ++i) {
        const int id = queue[i];
        const op_table& t = tables_[table_of_[id]];
        std::vector<int> options(t.st.size());
        for (std::size_t k = 0; k < options.size(); ++k) options[k] = int(k);
        // A parameter shared with a decided reader is laid out as that reader lays it
        // out, where some candidate can.
        keep_shared_alike(id, options, [&](int u) { return bool(decided_[u]); });
        cur_[id] = cheapest(id, options);
        decided_[id] = reached[id] = true;
        linked(id, reach);
      }
      queue.clear();
    };
    drain();
    // With memory priced, every operator is a choice: the unreached ones start more
    // propagations, in node order.
    if (in_.memory_weight > 0)
      for (int id : free_)
        if (!decided_[id]) {
          reach(id);
          drain();
        }
    recursive_result r;
    r.choice.resize(std::size_t(g_.size()));
    for (int id : free_)
      if (reached[id]) {
        const op_table& t = tables_[table_of_[id]];
        r.choice[id] = recursive_choice{t.st[cur_[id]], t.lay[cur_[id]], true};
        ++r.propagated;
      }
    for (int id = 0; id < g_.size(); ++id)
      if (g_.at(id).kind == node_kind::op && decided_[id]) r.symbolic_cost += cost(id, cur_[id], false);
    return r;
  }

 private:
  // An operator's candidates, evaluated once per (type, attributes, shapes).
  struct op_table {
    std::vector<strategy> st;
    std::vector<op_layouts> lay;
    std::vector<std::vector<int>> in, in_grad;  // layout ids per candidate and slot
    std::vector<int> out, out_grad, fetch;      // layout ids per candidate
    std::vector<int> devices;                   // the devices a candidate's mesh axes use
    std::vector<double> work;
    std::vector<std::optional<std::pair<double, double>>> collectives;  // forward, backward (when priced)
    std::vector<std::optional<std::vector<int>>> cuts;  // per candidate, its cuts (computed when reached)
  };

  int intern(const layout& l) {
    std::string k = to_string(l.dev) + to_string(l) + std::to_string(int(l.op));
    const auto [it, added] = layout_ids_.try_emplace(std::move(k), int(layouts_.size()));
    if (added) layouts_.push_back(l);
    return it->second;
  }
  int intern(const extents& e) {
    const auto [it, added] = shape_ids_.try_emplace(to_string(e), int(shapes_.size()));
    if (added) shapes_.push_back(e);
    return it->second;
  }

  // The devices a candidate uses: the product of the mesh axes that cut an input or the
  // output or hold its partial sums (the others replicate the work).
  static int devices_used(const op_layouts& l) {
    axis_mask used = l.out.partial;
    auto add = [&](const layout& x) {
      for (int d = 0; d < x.ndim; ++d) used |= x.split[d].mask();
    };
    for (const layout& x : l.in) add(x);
    add(l.out);
    int n = 1;
    for (int a = 0; a < l.dev.ndim; ++a)
      if (used >> a & 1u) n *= l.dev.dims[a];
    return n;
  }

  op_table make_table(int id, const std::vector<strategy>& st, const std::vector<op_layouts>& lay) {
    const node& nd = g_.at(id);
    const shape_list shapes = g_.input_shapes(id);
    op_table t;
    for (std::size_t k = 0; k < st.size(); ++k) {
      const op_layouts& l = lay[k];
      t.st.push_back(st[k]);
      t.lay.push_back(l);
      t.in.emplace_back();
      t.in_grad.emplace_back();
      for (std::size_t s = 0; s < l.in.size(); ++s) {
        t.in.back().push_back(intern(l.in[s]));
        t.in_grad.back().push_back(intern(l.in_grad[s]));
      }
      t.out.push_back(intern(l.out));
      t.out_grad.push_back(intern(l.out_grad));
      t.fetch.push_back(intern(layout::replicated(l.out.dev, 0)));
      t.devices.push_back(devices_used(l));
      t.work.push_back(nd.op->forward_work(l, shapes, nd.shape));
    }
    t.cuts.resize(t.st.size());
    t.collectives.resize(t.st.size());
    return t;
  }

  int table_for(int id) {
    const node& nd = g_.at(id);
    const shape_list shapes = g_.input_shapes(id);
    std::string key = signature(g_, id);
    const auto it = table_ids_.find(key);
    if (it != table_ids_.end()) return it->second;
    std::vector<strategy> st;
    std::vector<op_layouts> lay;
    for (const strategy& c : nd.op->candidates(N_, shapes)) {
      evaluation e = evaluate(g_, id, c, N_);
      if (!e.lay) continue;
      st.push_back(c);
      lay.push_back(std::move(*e.lay));
    }
    if (st.empty()) throw error("parallelize: " + g_.describe(id) + " has no strategy on " + std::to_string(N_) + " devices");
    tables_.push_back(make_table(id, st, lay));
    table_ids_.emplace(std::move(key), int(tables_.size()) - 1);
    return int(tables_.size()) - 1;
  }

  // The cuts of candidate k: the candidates on twice its devices whose every split
  // equals or doubles its own.
  const std::vector<int>& children(int table, int k) {
    op_table& t = tables_[table];
    if (t.cuts[k]) return *t.cuts[k];
    std::vector<int> out;
    const strategy& a = t.st[k];
    for (std::size_t j = 0; j < t.st.size(); ++j) {
      if (t.devices[j] != 2 * t.devices[k]) continue;
      const strategy& b = t.st[j];
      bool ok = b.n == a.n;
      for (int i = 0; ok && i < a.n; ++i) {
        ok = a.in[i].n == b.in[i].n;
        for (int d = 0; ok && d < a.in[i].n; ++d) ok = b.in[i].v[d] == a.in[i].v[d] || b.in[i].v[d] == 2 * a.in[i].v[d];
      }
      if (ok) out.push_back(int(j));
    }
    t.cuts[k] = std::move(out);
    return *t.cuts[k];
  }

  double sym(int from, int to, int shape) {
    const std::uint64_t key = std::uint64_t(from) << 42 | std::uint64_t(to) << 21 | std::uint64_t(shape);
    const auto it = sym_cache_.find(key);
    if (it != sym_cache_.end()) return it->second;
    const double b = symbolic_bytes(layouts_[from], layouts_[to], shapes_[shape], in_.elem_bytes);
    sym_cache_.emplace(key, b);
    return b;
  }

  // The symbolic cost of operator `id` taking candidate k given its neighbours as they
  // stand: its own, its inputs' edges, and (with `outputs`) its output's edges.
  double cost(int id, int k, bool outputs) {
    const node& nd = g_.at(id);
    op_table& t = tables_[table_of_[id]];
    const bool back = in_.needs_grad[id];
    if (!t.collectives[k]) {
      std::pair<double, double> fb{0, 0};
      for (const internal_collective& ic : nd.op->collectives(t.st[k], N_, g_.input_shapes(id), in_.elem_bytes))
        (ic.backward ? fb.second : fb.first) += double(ic.bytes);
      t.collectives[k] = fb;
    }
    double c = t.collectives[k]->first + (back ? t.collectives[k]->second : 0.0) +
               (count_work_ ? (back ? 3.0 : 1.0) * t.work[k] / in_.flops_per_byte : 0.0);
    if (in_.memory_weight > 0)
      c += in_.memory_weight * double(op_memory(g_, id, t.lay[k], in_.elem_bytes, in_.optimizer_slots));
    if (id == g_.loss()) c += sym(t.out[k], t.fetch[k], shape_id_[id]);
    for (std::size_t s = 0; s < nd.inputs.size(); ++s) {
      const int p = nd.inputs[s];
      const node& pn = g_.at(p);
      const bool grad = in_.needs_grad[p] && nd.op->differentiable(int(s));
      if (pn.kind == node_kind::input) {
        c += sym(input_id_.at(p), t.in[k][s], shape_id_[p]);
      } else if (pn.kind == node_kind::parameter) {
        if (grad) c += sym(t.in_grad[k][s], t.in[k][s], shape_id_[p]);
      } else if (pn.kind == node_kind::op && decided_[p]) {
        const op_table& pt = tables_[table_of_[p]];
        c += sym(pt.out[cur_[p]], t.in[k][s], shape_id_[p]);
        if (grad) c += sym(t.in_grad[k][s], pt.out_grad[cur_[p]], shape_id_[p]);
      }
    }
    if (outputs)
      for (const auto& [u, s] : g_.consumers(id)) {
        if (!decided_[u]) continue;
        const op_table& ut = tables_[table_of_[u]];
        c += sym(t.out[k], ut.in[cur_[u]][s], shape_id_[id]);
        if (back && g_.at(u).op->differentiable(s)) c += sym(ut.in_grad[cur_[u]][s], t.out_grad[k], shape_id_[id]);
      }
    return c;
  }

  int cheapest(int id, const std::vector<int>& options) {
    int best = options.front();
    double m = cost(id, best, true);
    for (std::size_t i = 1; i < options.size(); ++i)
      if (const double c = cost(id, options[i], true); c < m) {
        m = c;
        best = options[i];
      }
    return best;
  }

  // Every reader of a parameter lays it out as its first configured reader does (its
  // first reader when none is configured): the others that do not are re-chosen among
  // the candidates that do. A configured reader that disagrees is parallelize's error.
  void align_shared_parameters(std::vector<bool>& propagated) {
    for (int p : g_.parameters()) {
      const auto readers = g_.consumers(p);
      if (readers.size() < 2) continue;
      auto ref = readers.front();
      for (const auto& rd : readers)
        if (in_.fixed[rd.first]) {
          ref = rd;
          break;
        }
      const layout want = layout_of(ref.first, ref.second);
      for (const auto& [c, s] : readers) {
        if (in_.fixed[c] || same_placement(layout_of(c, s), want)) continue;
        const op_table& t = tables_[table_of_[c]];
        std::vector<int> alike;
        for (std::size_t k = 0; k < t.st.size(); ++k)
          if (same_placement(t.lay[k].in[s], want)) alike.push_back(int(k));
        if (alike.empty()) continue;
        cur_[c] = cheapest(c, alike);
        propagated[c] = true;
      }
    }
  }
  // Narrows `options` (candidates of `id`) to those that lay out each parameter `id`
  // reads as every other reader `settled(reader)` accepts lays it out, one reader at a
  // time, skipping a reader none of the options agrees with.
  template <class Settled>
  void keep_shared_alike(int id, std::vector<int>& options, Settled settled) const {
    const op_table& t = tables_[table_of_[id]];
    for (std::size_t s = 0; s < g_.at(id).inputs.size(); ++s) {
      const int p = g_.at(id).inputs[s];
      if (g_.at(p).kind != node_kind::parameter) continue;
      for (const auto& [u, su] : g_.consumers(p)) {
        if (u == id || !settled(u)) continue;
        std::vector<int> alike;
        for (int k : options)
          if (same_placement(t.lay[k].in[s], layout_of(u, su))) alike.push_back(k);
        if (!alike.empty()) options = std::move(alike);
      }
    }
  }
  const layout& layout_of(int op, int slot) const { return layouts_[tables_[table_of_[op]].in[cur_[op]][slot]]; }

  const recursive_input& in_;
  const traced_graph& g_;
  int N_;
  std::vector<op_table> tables_;
  std::unordered_map<std::string, int> table_ids_, layout_ids_, shape_ids_;
  std::vector<layout> layouts_;
  std::vector<extents> shapes_;
  std::vector<int> table_of_, cur_, free_, shape_id_;
  std::unordered_map<int, int> input_id_;
  std::unordered_map<std::uint64_t, double> sym_cache_;
  std::vector<bool> decided_;  // per node: whether the costs count its edges
  bool count_work_ = true;     // whether an operator's work is part of its cost
};

}  // namespace detail

/// Runs the recursive search (see the top of this header) on the unconfigured
/// operators of `in`. Throws tessera::error when the device count is not a power of
/// two, or an operator has no valid strategy on it.
inline recursive_result recursive_programming(const recursive_input& in) {
  detail::require_power_of_two(in.device_num);
  return detail::recursive_search(in).run();
}

/// Sharding propagation under the symbolic price, for problems too large to price
/// every pair of candidates exactly (graph/parallel.hpp chooses it beyond
/// parallel_config::exact_pricing_limit): as MindSpore's propagation, breadth-first from
/// the configured operators, each unconfigured operator reached takes the candidate of
/// least symbolic cost given the operators decided before it (bytes only, no work; a
/// parameter laid out as its decided readers lay it out, where a candidate can).
/// Operators no configured one reaches get no choice (data parallel), unless memory is
/// priced (memory_weight > 0): then each starts a propagation of its own, in node
/// order. Every choice is marked propagated. Throws as recursive_programming does.
inline recursive_result symbolic_propagation(const recursive_input& in) {
  detail::require_power_of_two(in.device_num, "symbolic sharding propagation");
  return detail::recursive_search(in).propagate();
}

}  // namespace tessera::graph
