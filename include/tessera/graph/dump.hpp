// save_graphs: a parallel graph as plain text, per rank, as MindSpore's save_graphs
// writes its IR. Standard library only.
//
// save_graphs(pg, dir, rank) writes dir/rank_<rank>/ with three files:
//
// step_parallel_begin.ir: the traced graph with the strategy each operator runs, before
// the pass inserts anything. Global shapes. A header of `#` lines (the configuration),
// then one entry per node, in node order:
//
//     %4(matmul) = MatMul(%0, %2) {transpose_a: false, transpose_b: false} {in_strategy: ((2, 4), (4, 1)), source: user}
//         : (<Tensor[Float32], (16, 32)>, <Tensor[Float32], (32, 16)>) -> (<Tensor[Float32], (16, 16)>)
//
// (`%id` is the node id; source is user, sharding_propagation, dynamic_programming,
// recursive_programming, data_parallel or stand_alone. Inputs show their dataset
// strategy, parameters their flags.) The last line is `return %<loss id>`.
//
// execute.ir: the graph this rank runs in one training step, with the communication
// the pass inserted. Shapes are this rank's local shapes. Sections `# forward`,
// `# backward` and `# loss`; entries are numbered anew (%0, %1, ...). An operator:
//
//     %5(matmul) = MatMul(%4, %2) {transpose_a: false, transpose_b: false} {in_strategy: ((2, 4), (4, 1)), device_matrix: (2, 4, 1), output: [0, -] partial sum {1}}
//         : (<Tensor[Float32], (8, 8)>, <Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 16)>)
//
// (output: the output's layout on the operator's device matrix, axes of size 1 left out.)
// With pipeline stages: this rank's stage's part of one micro-batch, the values crossing
// stages as Send and Receive (their gradients too), and the bytes per micro-batch.
//
// A communication step (one step of a redistribution plan, or a collective an
// operator runs inside itself), with its kind (StridedSlice, AllGather, AllReduce,
// ReduceScatter, AllToAll, Mask, Expand, Exchange), the device matrix and mesh axis
// whose groups run it, this rank's group (rank_list) and the bytes each rank receives
// (an Exchange: this rank's; a StridedSlice also shows the begin and end of the piece it
// keeps), then the purpose of the step as a `#` line:
//
//     %6 = ReduceScatter(%5) {op: sum, mesh: (2, 4), axis: 1, dim: 1, rank_list: (0, 1, 2, 3), bytes: 384}
//         : (<Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 4)>)
//         # redistribution: matmul -> relu (input 0)
//
// The backward section starts from the loss's gradient (OnesLike) and lists, in the
// order the tape runs them, each operator's gradient (`<Type>Grad`, taking its output's
// gradient and giving its inputs'), the redistributions of the gradients, their sums
// (Add) where a value has several readers, and hybrid_parallel's gradient all-reduces.
// The loss section reads the loss on every rank; `return` names the loss so read. The
// last line sums the bytes:
//
//     # bytes received by rank 0 in one step: forward 896, backward 1408, loss 10, total 2314
//
// A collective an operator runs inside itself has no shapes line:
//
//     %9 = AllReduce(%8) {op: max, mesh: (2, 4), axes: (1,), rank_list: (0, 1, 2, 3), bytes: 48}
//         # inside SoftmaxCrossEntropyWithLogits 'softmax_cross_entropy': row maxima
//
// execute.dot: the same graph for Graphviz (`dot -Tsvg execute.dot`): boxes for
// operators, ellipses for inputs and parameters, filled orange boxes for communication,
// edges labelled with local shapes, the backward in a cluster.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/graph/parallel.hpp>
#include <tessera/plan/step.hpp>

namespace tessera::graph {

/// "Float32" for 4-byte elements, "Float64" for 8, "Float16" for 2.
inline std::string dtype_name(index_t elem_bytes) {
  if (elem_bytes == 4) return "Float32";
  if (elem_bytes == 8) return "Float64";
  if (elem_bytes == 2) return "Float16";
  return "Bytes" + std::to_string(elem_bytes);
}

/// "<Tensor[Float32], (16, 32)>"
inline std::string tensor_text(const extents& shape, index_t elem_bytes) {
  return "<Tensor[" + dtype_name(elem_bytes) + "], " + to_string(shape) + ">";
}

/// The IR name of a redistribution step: StridedSlice, AllGather, AllReduce,
/// ReduceScatter, AllToAll, Mask, Expand, Exchange.
constexpr std::string_view ir_name(step_kind k) {
  switch (k) {
    case step_kind::slice: return "StridedSlice";
    case step_kind::all_gather: return "AllGather";
    case step_kind::all_reduce: return "AllReduce";
    case step_kind::reduce_scatter: return "ReduceScatter";
    case step_kind::all_to_all: return "AllToAll";
    case step_kind::mask: return "Mask";
    case step_kind::expand: return "Expand";
    case step_kind::exchange: return "Exchange";
  }
  return "?";
}

namespace detail {

inline std::string tuple_text(const std::vector<int>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

// `rank`'s group over `axes` of m, in group order.
inline std::vector<int> rank_list(const mesh& m, const axis_list& axes, int rank) {
  std::vector<int> v;
  for (int i = 0; i < group_size(m, axes); ++i) v.push_back(group_member(m, axes, rank, i));
  return v;
}

inline std::string preamble(const parallel_graph& pg, int rank) {
  const parallel_config& c = pg.config();
  std::string s = "# parallel_mode: " + std::string(to_string(c.mode));
  if (c.mode == parallel_mode::auto_parallel) s += ", search_mode: " + std::string(to_string(c.search));
  s += ", dataset_strategy: " + c.dataset.to_string() + ", device_num: " + std::to_string(c.device_num) +
       ", rank: " + std::to_string(rank) + "\n";
  if (c.mode == parallel_mode::hybrid_parallel)
    s += "# hybrid_parallel: every shape is each rank's own; operators run whole on each rank\n";
  if (pg.pipelined())
    s += "# pipeline_stages: " + std::to_string(c.pipeline_stages) + " of " + std::to_string(pg.stage_device_num()) +
         " ranks (rank " + std::to_string(rank) + " on stage " + std::to_string(pg.stage_of_rank(rank)) +
         "), chunks: " + std::to_string(pg.pipeline_chunks()) + ", micro_size: " + std::to_string(c.micro_size) +
         ", schedule: " + std::string(to_string(c.schedule)) +
         "; shapes are a micro-batch's, rank lists number the stage's ranks from 0\n";
  return s;
}

// One entry of the executed graph.
struct exec_node {
  int key = 0;
  std::string name;               // "" for communication
  std::string type;
  std::vector<int> args;          // keys
  std::string attrs;              // "{...}" groups
  std::vector<extents> in, out;   // local shapes (none: not shown)
  bool shapes = true;
  bool comm = false;
  bool leaf = false;              // input or parameter
  std::string note;               // "# ..." line
  index_t bytes = 0;              // bytes this rank receives (communication)
  int section = 0;                // 0 forward, 1 backward, 2 loss
};

struct exec_graph {
  std::vector<exec_node> nodes;
  int result = -1;  // the loss as every rank reads it
  index_t bytes[3] = {0, 0, 0};
  index_t once_bytes = 0;  // with micro-batches: the gradients reduced once a step (in bytes[1] too)

  int add(exec_node n) {
    n.key = int(nodes.size());
    bytes[n.section] += n.bytes;
    nodes.push_back(std::move(n));
    return nodes.back().key;
  }
};

// Appends the steps of route r for `rank`, starting from key `from`; returns the key of
// the last (from itself when the plan is empty).
inline int add_route(exec_graph& eg, const route& r, const extents& global, index_t eb, int rank, int from,
                     int section, const std::string& note) {
  layout cur = r.p.from;
  int k = from;
  for (int i = 0; i < r.p.size(); ++i) {
    const plan_step& st = r.p[i];
    exec_node n;
    n.type = std::string(ir_name(st.kind));
    n.args = {k};
    n.comm = true;
    n.section = section;
    const extents ls = local_shape(cur, global), ns = local_shape(st.after, global);
    n.in = {ls};
    n.out = {ns};
    std::string a = "{";
    if (st.kind == step_kind::all_reduce || st.kind == step_kind::reduce_scatter || st.kind == step_kind::mask ||
        st.kind == step_kind::expand)
      a += "op: " + std::string(to_string(st.op)) + ", ";
    a += "mesh: " + to_string(r.fine);
    if (st.kind == step_kind::exchange) {
      std::vector<int> all;
      for (int q = 0; q < r.fine.size(); ++q) all.push_back(q);
      n.bytes = tessera::detail::exchange_elements(cur, st.after, global, rank) * eb;
      a += ", point to point, rank_list: " + tuple_text(all);
    } else {
      a += ", axis: " + std::to_string(st.axis);
      if (st.kind == step_kind::all_to_all) a += ", dims: " + std::to_string(st.dim) + " -> " + std::to_string(st.dim2);
      else if (st.dim >= 0) a += ", dim: " + std::to_string(st.dim);
      if (st.kind == step_kind::slice) {
        std::vector<int> begin(std::size_t(ns.ndim), 0), end;
        for (int d = 0; d < ns.ndim; ++d) end.push_back(int(ns[d]));
        const int idx = group_index(r.fine, axis_list{st.axis}, rank);
        begin[std::size_t(st.dim)] = int(idx * ns[st.dim]);
        end[std::size_t(st.dim)] += begin[std::size_t(st.dim)];
        a += ", begin: " + tuple_text(begin) + ", end: " + tuple_text(end);
      }
      a += ", rank_list: " + tuple_text(rank_list(r.fine, axis_list{st.axis}, rank));
      n.bytes = st.bytes;
    }
    a += ", bytes: " + std::to_string(n.bytes) + "}";
    n.attrs = a;
    n.note = note;
    k = eg.add(std::move(n));
    cur = st.after;
  }
  return k;
}

// Appends the collectives operator `id` runs inside itself after its entry `from`;
// returns the key of the one that gives the operator's result, else `from`.
inline int add_collectives(exec_graph& eg, const parallel_graph& pg, int id, int rank, int from, bool backward) {
  int result = from;
  for (const internal_collective& c : pg.op(id).collectives) {
    if (c.backward != backward) continue;
    exec_node n;
    n.type = c.kind;
    n.args = {from};
    n.comm = true;
    n.shapes = false;
    n.section = backward ? 1 : 0;
    std::vector<int> axes;
    for (int i = 0; i < c.axes.n; ++i) axes.push_back(c.axes[i]);
    n.attrs = "{op: " + std::string(to_string(c.op)) + ", mesh: " + to_string(c.dev) + ", axes: " + tuple_text(axes) +
              ", rank_list: " + tuple_text(rank_list(c.dev, c.axes, rank)) +
              ", bytes: " + std::to_string(c.bytes_on(rank)) + "}";
    n.bytes = c.bytes_on(rank);
    n.note = "# inside " + pg.traced().describe(id) + (backward ? " (backward): " : ": ") + c.purpose;
    const int k = eg.add(std::move(n));
    if (c.gives_output) result = k;
  }
  return result;
}

// With pipeline stages the graph a rank runs is its stage's part of one micro-batch:
// the values from earlier stages arrive by Receive, those for later ones leave by Send,
// and their gradients come back the same way.
inline exec_graph build_exec_graph(const parallel_graph& pg, int job_rank) {
  const traced_graph& g = pg.traced();
  const index_t eb = pg.config().elem_bytes;
  const bool piped = pg.pipeline_stages() > 1;
  const int my_stage = piped ? pg.stage_of_rank(job_rank) : 0;
  const int rank = piped ? job_rank % pg.stage_device_num() : job_rank;  // within the stage
  auto here = [&](int id) { return !piped || g.at(id).kind != node_kind::op || pg.physical_stage(pg.stage(id)) == my_stage; };
  auto read_here = [&](int id) {
    for (const auto& [c, slot] : g.consumers(id))
      if (here(c)) return true;
    return false;
  };
  exec_graph eg;
  // A Send (arg >= 0) or Receive of node `id`'s value (section 0) or gradient (1) in
  // layout `l`, to or from virtual stage `other`.
  auto transfer = [&](int arg, const layout& l, int id, int other, int section) {
    const bool receive = arg < 0;
    exec_node n;
    n.type = receive ? "Receive" : "Send";
    if (!receive) n.args = {arg};
    n.comm = true;
    n.leaf = receive;
    n.section = section;
    const extents ls = local_shape(l, g.at(id).shape);
    n.in = n.out = {ls};
    n.bytes = receive ? ls.size() * eb : 0;
    const int st = pg.physical_stage(other);
    n.attrs = std::string("{") + (receive ? "from" : "to") + ": pipeline stage " + std::to_string(st) + " (rank " +
              std::to_string(st * pg.stage_device_num() + rank) + "), layout: " + describe(l) +
              ", bytes: " + std::to_string(n.bytes) + "}";
    n.note = "# " + std::string(section == 0 ? "the value of " : "the gradient of ") + g.describe(id);
    return eg.add(std::move(n));
  };
  std::vector<int> key(std::size_t(g.size()), -1);
  for (int id = 0; id < g.size(); ++id) {
    const node& nd = g.at(id);
    if (!here(id) || (piped && nd.kind != node_kind::op && !read_here(id))) {
      if (nd.kind == node_kind::op && read_here(id)) key[std::size_t(id)] = transfer(-1, pg.value_layout(id), id, pg.stage(id), 0);
      continue;
    }
    exec_node n;
    n.name = nd.name;
    n.out = {pg.local_shape(id)};
    if (nd.kind != node_kind::op) {
      n.leaf = true;
      n.type = nd.kind == node_kind::input ? "Input" : nd.kind == node_kind::parameter ? "Parameter" : "Constant";
      n.attrs = "{layout: " + describe(pg.value_layout(id)) + "}";
      key[std::size_t(id)] = eg.add(std::move(n));
      continue;
    }
    const op_plan& o = pg.op(id);
    for (std::size_t s = 0; s < nd.inputs.size(); ++s) {
      const edge_plan& e = pg.edge(id, int(s));
      const int p = nd.inputs[s];
      n.args.push_back(add_route(eg, e.forward, g.at(p).shape, eb, rank, key[std::size_t(p)], 0,
                                 "# redistribution: " + g.at(p).name + " -> " + nd.name + " (input " + std::to_string(s) + ")"));
      n.in.push_back(local_shape(o.lay.in[s], g.at(p).shape));
    }
    n.type = nd.op->type();
    const std::string at = nd.op->attributes();
    n.attrs = (at.empty() ? "" : "{" + at + "} ") + "{in_strategy: " + to_string(o.st) + ", device_matrix: " +
              to_string(o.lay.dev) + ", output: " + to_string(refine(o.lay.out, o.lay.dev)) + "}";
    key[std::size_t(id)] = add_collectives(eg, pg, id, rank, eg.add(std::move(n)), false);
  }
  for (const pipeline_boundary& b : pg.boundaries())
    if (here(b.producer) && pg.physical_stage(b.to_stage) != my_stage)
      transfer(key[std::size_t(b.producer)], pg.value_layout(b.producer), b.producer, b.to_stage, 0);

  // Backward, in the tape's order: from the loss down.
  const bool any_param = pg.needs_grad(g.loss());
  std::vector<int> grad(std::size_t(g.size()), -1);
  for (const pipeline_boundary& b : pg.boundaries())  // gradients from later stages
    if (any_param && b.has_backward && here(b.producer) && pg.physical_stage(b.to_stage) != my_stage) {
      const int k = transfer(-1, pg.grad_layout(b.producer), b.producer, b.to_stage, 1);
      if (grad[std::size_t(b.producer)] < 0) {
        grad[std::size_t(b.producer)] = k;
      } else {
        exec_node sum;
        sum.name = g.at(b.producer).name + " grad";
        sum.type = "Add";
        sum.args = {grad[std::size_t(b.producer)], k};
        const extents ls = local_shape(pg.grad_layout(b.producer), g.at(b.producer).shape);
        sum.in = {ls, ls};
        sum.out = {ls};
        sum.section = 1;
        grad[std::size_t(b.producer)] = eg.add(std::move(sum));
      }
    }
  if (any_param && here(g.loss())) {
    exec_node seed;
    seed.name = g.at(g.loss()).name + " grad";
    seed.type = "OnesLike";
    seed.args = {key[std::size_t(g.loss())]};
    seed.in = {pg.local_shape(g.loss())};
    seed.out = {local_shape(pg.grad_layout(g.loss()), g.at(g.loss()).shape)};
    seed.section = 1;
    if (pg.config().mode == parallel_mode::hybrid_parallel && pg.device_num() > 1)
      seed.attrs = "{value: 1/" + std::to_string(pg.device_num()) + ": the objective is the mean of the ranks' losses}";
    if (pg.micro_size() > 1)
      seed.attrs = "{value: 1/" + std::to_string(pg.micro_size()) + ": the loss is the mean of the micro-batches'}";
    grad[std::size_t(g.loss())] = eg.add(std::move(seed));
  }
  for (int id = g.size() - 1; any_param && id >= 0; --id) {
    const node& nd = g.at(id);
    if (nd.kind != node_kind::op || !here(id) || !pg.needs_grad(id) || grad[std::size_t(id)] < 0) continue;
    const op_plan& o = pg.op(id);
    exec_node n;
    n.name = nd.name + " grad";
    n.type = nd.op->type() + "Grad";
    n.args = {grad[std::size_t(id)]};
    n.in = {local_shape(o.lay.out_grad, nd.shape)};
    n.section = 1;
    for (std::size_t s = 0; s < nd.inputs.size(); ++s)
      if (pg.edge(id, int(s)).has_backward) n.out.push_back(local_shape(o.lay.in_grad[s], g.at(nd.inputs[s]).shape));
    n.attrs = "{in_strategy: " + to_string(o.st) + "}";
    const int k = add_collectives(eg, pg, id, rank, eg.add(std::move(n)), true);
    for (std::size_t s = 0; s < nd.inputs.size(); ++s) {
      const edge_plan& e = pg.edge(id, int(s));
      if (!e.has_backward) continue;
      const int p = nd.inputs[s];
      // With micro-batches, a parameter read once has its gradient summed over them
      // first and reduced once a step.
      const bool once = pg.reduces_gradient_once(p);
      const index_t before = eg.bytes[1];
      const int last = add_route(eg, e.backward, g.at(p).shape, eb, rank, k, 1,
                                 "# gradient: " + nd.name + " (input " + std::to_string(s) + ") -> " + g.at(p).name +
                                     (once ? ", once a step" : ""));
      if (once) eg.once_bytes += eg.bytes[1] - before;
      if (grad[std::size_t(p)] < 0) {
        grad[std::size_t(p)] = last;
      } else {
        exec_node sum;
        sum.name = g.at(p).name + " grad";
        sum.type = "Add";
        sum.args = {grad[std::size_t(p)], last};
        const extents ls = local_shape(pg.grad_layout(p), g.at(p).shape);
        sum.in = {ls, ls};
        sum.out = {ls};
        sum.section = 1;
        grad[std::size_t(p)] = eg.add(std::move(sum));
      }
    }
  }
  for (const pipeline_boundary& b : pg.boundaries())  // gradients to earlier stages
    if (b.has_backward && !here(b.producer) && pg.physical_stage(b.to_stage) == my_stage && grad[std::size_t(b.producer)] >= 0)
      transfer(grad[std::size_t(b.producer)], pg.grad_layout(b.producer), b.producer, b.from_stage, 1);
  for (const gradient_reduction& r : pg.gradient_reductions()) {
    exec_node n;
    n.type = "AllReduce";
    n.args = {grad[std::size_t(r.parameter)]};
    n.comm = true;
    n.section = 1;
    n.in = n.out = {pg.local_shape(r.parameter)};
    n.attrs = "{op: sum, mesh: " + to_string(r.dev) + ", axis: 0, rank_list: " + tuple_text(rank_list(r.dev, axis_list{0}, rank)) +
              ", bytes: " + std::to_string(r.bytes) + "}";
    n.bytes = r.bytes;
    n.note = "# gradient of parameter '" + g.at(r.parameter).name + "' (not layer-wise parallel): summed over the ranks";
    grad[std::size_t(r.parameter)] = eg.add(std::move(n));
  }
  eg.result = here(g.loss()) ? add_route(eg, pg.loss_fetch(), g.at(g.loss()).shape, eb, rank, key[std::size_t(g.loss())], 2,
                                         "# the loss, read by every rank")
                              : int(eg.nodes.size()) - 1;
  return eg;
}

inline std::string ir_entry(const exec_node& n, index_t eb) {
  std::string s = "%" + std::to_string(n.key) + (n.name.empty() ? "" : "(" + n.name + ")") + " = " + n.type + "(";
  for (std::size_t i = 0; i < n.args.size(); ++i) s += (i ? ", %" : "%") + std::to_string(n.args[i]);
  s += ")" + (n.attrs.empty() ? std::string() : " " + n.attrs) + "\n";
  if (n.shapes) {
    s += "    : (";
    for (std::size_t i = 0; i < n.in.size(); ++i) s += (i ? ", " : "") + tensor_text(n.in[i], eb);
    s += ") -> (";
    for (std::size_t i = 0; i < n.out.size(); ++i) s += (i ? ", " : "") + tensor_text(n.out[i], eb);
    s += ")\n";
  }
  if (!n.note.empty()) s += "    " + n.note + "\n";
  return s;
}

inline std::string dot_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

}  // namespace detail

/// step_parallel_begin.ir's text (see the top of this header).
inline std::string step_parallel_begin_ir(const parallel_graph& pg, int rank) {
  const traced_graph& g = pg.traced();
  const index_t eb = pg.config().elem_bytes;
  std::string s = "# step_parallel_begin: the traced graph, every operator with the strategy it runs; global shapes\n" +
                  detail::preamble(pg, rank);
  for (int id = 0; id < g.size(); ++id) {
    const node& nd = g.at(id);
    std::string line = "%" + std::to_string(id) + "(" + nd.name + ") = ";
    std::string sig = "    : (";
    if (nd.kind == node_kind::input) {
      line += "Input() {dataset_strategy: " + to_string(to_split_tuple(pg.value_layout(id))) + "}";
    } else if (nd.kind == node_kind::parameter) {
      line += std::string("Parameter() {layerwise_parallel: ") + (nd.layerwise_parallel ? "true" : "false") + "}";
    } else if (nd.kind == node_kind::constant) {
      char v[32];
      std::snprintf(v, sizeof v, "%.17g", nd.constant);
      line += std::string("Constant() {value: ") + v + "}";
    } else {
      const op_plan& o = pg.op(id);
      line += nd.op->type() + "(";
      for (std::size_t i = 0; i < nd.inputs.size(); ++i) {
        line += (i ? ", %" : "%") + std::to_string(nd.inputs[i]);
        sig += (i ? ", " : "") + tensor_text(g.at(nd.inputs[i]).shape, eb);
      }
      const std::string at = nd.op->attributes();
      line += ")" + (at.empty() ? std::string() : " {" + at + "}") + " {in_strategy: " + to_string(o.st) +
              ", source: " + std::string(to_string(o.source)) +
              (pg.pipeline_stages() > 1 ? ", pipeline_stage: " + std::to_string(pg.stage(id)) : std::string()) + "}";
    }
    s += line + "\n" + sig + ") -> (" + tensor_text(nd.shape, eb) + ")\n";
  }
  return s + "return %" + std::to_string(g.loss()) + "\n";
}

/// execute.ir's text for `rank` (see the top of this header).
inline std::string execute_ir(const parallel_graph& pg, int rank) {
  const detail::exec_graph eg = detail::build_exec_graph(pg, rank);
  const index_t eb = pg.config().elem_bytes;
  std::string s = "# execute: the graph rank " + std::to_string(rank) + " of " + std::to_string(pg.device_num()) +
                  " runs in one training step, with the communication the parallel pass inserted; local shapes\n" +
                  detail::preamble(pg, rank);
  const char* titles[3] = {"# forward\n", "# backward\n", "# loss\n"};
  int section = -1;
  for (const detail::exec_node& n : eg.nodes) {
    if (n.section != section) {
      section = n.section;
      s += titles[section];
    }
    s += detail::ir_entry(n, eb);
  }
  const index_t total = eg.bytes[0] + eg.bytes[1] + eg.bytes[2];
  s += "return %" + std::to_string(eg.result) + "\n";
  if (pg.pipelined())
    s += "# bytes received by rank " + std::to_string(rank) + " in one step of " + std::to_string(pg.micro_size()) +
         " micro-batches: the gradients marked once a step " + std::to_string(eg.once_bytes) +
         ", the rest per micro-batch as below\n";
  s += "# bytes received by rank " + std::to_string(rank) + (pg.pipelined() ? " per micro-batch" : " in one step") +
       ": forward " + std::to_string(eg.bytes[0]) +
       ", backward " + std::to_string(eg.bytes[1]) + ", loss " + std::to_string(eg.bytes[2]) + ", total " +
       std::to_string(total) + "\n";
  return s;
}

/// execute.dot's text for `rank` (see the top of this header).
inline std::string execute_dot(const parallel_graph& pg, int rank) {
  const detail::exec_graph eg = detail::build_exec_graph(pg, rank);
  std::string s = "digraph execute_rank_" + std::to_string(rank) + " {\n";
  s += "  graph [label=\"execute: rank " + std::to_string(rank) + " of " + std::to_string(pg.device_num()) + ", " +
       std::string(to_string(pg.config().mode)) + "\", labelloc=t, fontname=\"Helvetica\"];\n";
  s += "  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n  edge [fontname=\"Helvetica\", fontsize=9];\n";
  auto node_line = [&](const detail::exec_node& n) {
    std::string label = n.name.empty() ? n.type : n.name + "\\n" + n.type;
    if (n.comm) {
      label += "\\n" + detail::dot_escape(n.attrs.substr(1, n.attrs.size() - 2));
    } else if (!n.leaf && !n.out.empty()) {
      std::string shapes;
      for (std::size_t i = 0; i < n.in.size(); ++i) shapes += (i ? " x " : "") + to_string(n.in[i]);
      label += "\\n" + shapes + " -> " + to_string(n.out[0]);
    } else if (!n.out.empty()) {
      label += "\\n" + to_string(n.out[0]);
    }
    std::string attrs = "label=\"" + label + "\"";
    if (n.comm) attrs += ", style=filled, fillcolor=\"#ffb347\", color=\"#c0392b\", penwidth=2";
    else if (n.leaf) attrs += ", shape=ellipse";
    return "  n" + std::to_string(n.key) + " [" + attrs + "];\n";
  };
  const char* clusters[3] = {"forward", "backward", "loss"};
  for (int sec = 0; sec < 3; ++sec) {
    s += "  subgraph cluster_" + std::string(clusters[sec]) + " {\n    label=\"" + clusters[sec] + "\";\n";
    for (const detail::exec_node& n : eg.nodes)
      if (n.section == sec) s += "  " + node_line(n);
    s += "  }\n";
  }
  for (const detail::exec_node& n : eg.nodes)
    for (std::size_t i = 0; i < n.args.size(); ++i) {
      const detail::exec_node& from = eg.nodes[std::size_t(n.args[i])];
      // The local shape read: the reader's input, else what the producer gave.
      const std::string lbl = n.shapes && i < n.in.size() ? to_string(n.in[i])
                              : from.out.empty()           ? std::string()
                                                           : to_string(from.out[0]);
      s += "  n" + std::to_string(from.key) + " -> n" + std::to_string(n.key) + " [label=\"" + lbl + "\"" +
           (n.section == 1 ? ", style=dashed" : "") + "];\n";
    }
  return s + "}\n";
}

/// Writes dir/rank_<rank>/step_parallel_begin.ir, execute.ir and execute.dot, creating
/// the folders; throws tessera::error naming a file it cannot write.
inline void save_graphs(const parallel_graph& pg, const std::filesystem::path& dir, int rank) {
  const std::filesystem::path d = dir / ("rank_" + std::to_string(rank));
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  if (ec) throw error("save_graphs: cannot create " + d.string() + ": " + ec.message());
  auto write = [&](const char* name, const std::string& text) {
    const std::filesystem::path f = d / name;
    std::ofstream out(f, std::ios::binary);
    out << text;
    out.close();
    if (!out) throw error("save_graphs: cannot write " + f.string());
  };
  write("step_parallel_begin.ir", step_parallel_begin_ir(pg, rank));
  write("execute.ir", execute_ir(pg, rank));
  write("execute.dot", execute_dot(pg, rank));
}

}  // namespace tessera::graph
