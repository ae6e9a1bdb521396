// The parallel pass: from a traced graph and a parallel configuration (MindSpore's
// set_auto_parallel_context: parallel mode, search mode, dataset strategy, device
// count) to a parallel graph: every operator's strategy and layouts, every data
// input's and parameter's layout, and every redistribution a training step runs,
// planned. Standard library only; graph/execute.hpp runs the result.
//
// Parallel modes (every one gives the stand-alone results, to float rounding):
//
// | mode               | operator strategies                                   | shapes in the graph |
// |--------------------|-------------------------------------------------------|---------------------|
// | stand_alone        | all ones: every rank computes everything              | global              |
// | data_parallel      | op_def::data_parallel: the batch split over all ranks, parameters replicated, gradients all-reduced | global |
// | semi_auto_parallel | the shard() strategies; data_parallel for the others  | global              |
// | auto_parallel      | the shard() strategies; for the others, sharding propagation (graph/propagate.hpp) or dynamic programming (below) | global |
// | hybrid_parallel    | all ones on each rank's own tensors; the user places AllReduce nodes; layer-wise parallel parameters are already sliced | each rank's own |
//
// stand_alone, data_parallel and hybrid_parallel ignore shard() strategies (as MindSpore
// does).
//
// auto_parallel's three searches (parallel_config::search), MindSpore's:
// - sharding_propagation: the unconfigured operators linked to configured ones take the
//   strategies that move the fewest bytes per rank; the others run data parallel.
// - dynamic_programming: every unconfigured operator takes the strategy that minimises
//   a training step's estimated time on one rank, in bytes: the bytes it receives (the
//   same price) plus its floating-point operations (op_def::forward_work, forward and
//   backward counted as three forwards) over parallel_config::flops_per_byte, the
//   machine's balance. Splitting an operator's work over more ranks is then worth the
//   communication it costs; no configured operator is needed. Solved by the same
//   solver: exactly by dynamic programming where the operators' links form a tree (a
//   chain of layers), by enumeration or greedily otherwise.
// - recursive_programming: every unconfigured operator is cut in two log2(N) times, in
//   order of weight, each time along the cut with the least symbolic cost given its
//   neighbours (graph/recursive.hpp): the same price in closed form, for large graphs
//   and device counts (a power of two). The configured operators keep their strategies.
//
// Data import (the dataset strategy; each input's layout on the device matrix (N,)):
//
// | dataset strategy      | each rank reads                     | modes                          |
// |-----------------------|-------------------------------------|--------------------------------|
// | data_parallel         | its slice of the batch (dim 0 split N ways) | all (stand_alone and hybrid: the whole tensor of the input's shape) |
// | full_batch            | the whole batch                     | semi_auto_parallel, auto_parallel |
// | per input, ((1, 8), (1, 8)) | the shard the split tuple gives (strategy_layout) | semi_auto_parallel, auto_parallel |
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/graph/op_def.hpp>
#include <tessera/graph/pipeline.hpp>
#include <tessera/graph/propagate.hpp>
#include <tessera/graph/recursive.hpp>
#include <tessera/plan/cost.hpp>
#include <tessera/plan/planner.hpp>

namespace tessera::graph {

/// MindSpore's ParallelMode.
enum class parallel_mode { stand_alone, data_parallel, semi_auto_parallel, auto_parallel, hybrid_parallel };

constexpr std::string_view to_string(parallel_mode m) {
  switch (m) {
    case parallel_mode::stand_alone: return "stand_alone";
    case parallel_mode::data_parallel: return "data_parallel";
    case parallel_mode::semi_auto_parallel: return "semi_auto_parallel";
    case parallel_mode::auto_parallel: return "auto_parallel";
    case parallel_mode::hybrid_parallel: return "hybrid_parallel";
  }
  return "?";
}

/// auto_parallel's strategy search (see the top of this header).
enum class search_mode { sharding_propagation, dynamic_programming, recursive_programming };

constexpr std::string_view to_string(search_mode m) {
  switch (m) {
    case search_mode::sharding_propagation: return "sharding_propagation";
    case search_mode::dynamic_programming: return "dynamic_programming";
    case search_mode::recursive_programming: return "recursive_programming";
  }
  return "?";
}

/// The search mode named `text` ("sharding_propagation", "dynamic_programming",
/// "recursive_programming", MindSpore's names); throws tessera::error naming the three.
inline search_mode parse_search_mode(std::string_view text) {
  for (search_mode m : {search_mode::sharding_propagation, search_mode::dynamic_programming,
                        search_mode::recursive_programming})
    if (text == to_string(m)) return m;
  throw error("search_mode: '" + std::string(text) +
              "' is not sharding_propagation, dynamic_programming or recursive_programming");
}

/// How each rank gets its data (MindSpore's dataset_strategy / full_batch).
class dataset_strategy {
 public:
  enum class kind { data_parallel, full_batch, per_input };

  /// Each rank reads its slice of the batch (the default).
  static dataset_strategy data_parallel() { return dataset_strategy(kind::data_parallel, {}); }
  /// Each rank reads the whole batch.
  static dataset_strategy full_batch() { return dataset_strategy(kind::full_batch, {}); }
  /// One split tuple per data input, e.g. {{1, 8}, {1, 8}}: each rank reads the shard
  /// that strategy_layout(tuple, device count) gives it.
  static dataset_strategy per_input(std::vector<split_tuple> tuples) {
    return dataset_strategy(kind::per_input, std::move(tuples));
  }
  /// "data_parallel", "full_batch" or a tuple of tuples, "((1, 8), (1, 8))".
  static dataset_strategy parse(std::string_view text) {
    if (text == "data_parallel") return data_parallel();
    if (text == "full_batch") return full_batch();
    const strategy st = parse_strategy(text);
    return per_input(std::vector<split_tuple>(st.in.begin(), st.in.begin() + st.n));
  }

  kind which() const { return kind_; }
  const std::vector<split_tuple>& tuples() const { return tuples_; }
  std::string to_string() const {
    if (kind_ == kind::data_parallel) return "data_parallel";
    if (kind_ == kind::full_batch) return "full_batch";
    std::string s = "(";
    for (std::size_t i = 0; i < tuples_.size(); ++i) s += (i ? ", " : "") + tessera::to_string(tuples_[i]);
    return s + (tuples_.size() == 1 ? ",)" : ")");
  }

 private:
  dataset_strategy(kind k, std::vector<split_tuple> t) : kind_(k), tuples_(std::move(t)) {}
  kind kind_;
  std::vector<split_tuple> tuples_;
};

/// MindSpore's auto-parallel context.
struct parallel_config {
  parallel_mode mode = parallel_mode::stand_alone;
  search_mode search = search_mode::sharding_propagation;
  dataset_strategy dataset = dataset_strategy::data_parallel();
  int device_num = 1;      ///< the number of ranks
  index_t elem_bytes = 4;  ///< bytes per element (4: float)
  /// dynamic_programming's machine balance: the floating-point operations a rank does
  /// in the time it receives one byte from another. About 10 on the build machine
  /// (90 GFLOP/s of BLAS per rank, bench_matmul; 5-13 GB/s through MPI,
  /// bench_collectives); a GPU over NVLink is nearer 100.
  double flops_per_byte = 10;
  /// The bytes each device may hold (0: no limit): parameters with their gradients and
  /// optimizer state, every operator's output (kept for the backward) and the data
  /// inputs, as parallel_graph::memory_per_device counts them. The searches never
  /// return a plan over it; parallelize throws, naming the largest consumers, where
  /// no plan of the mode fits.
  index_t memory_budget = 0;
  /// The optimizer's state tensors per parameter (Momentum 1, Adam 2, SGD without
  /// momentum 0), for memory_budget.
  int optimizer_slots = 1;
  /// sharding_propagation prices every pair of candidates of two linked unconfigured
  /// operators with the planner, and minimises exactly, while the pairs times the square
  /// of the device count (the planner's work on a pair grows about so) stay within this
  /// limit: a 4-layer transformer on 8 devices (29,400 pairs) takes 2.7 s, one layer on
  /// 16 devices (19,450 pairs) 86 s. Beyond it, where the device count is a power of
  /// two, it propagates from the configured operators under the symbolic price instead
  /// (graph/recursive.hpp, symbolic_propagation).
  double exact_pricing_limit = 2e6;
  /// Pipeline parallel (MindSpore's pipeline_stages): the ranks form this many stages
  /// of device_num / pipeline_stages ranks each (stage s: ranks [s n, (s + 1) n)), and
  /// the operators run on the stage their node::pipeline_stage names, sharded over its
  /// ranks by the mode and search as on device_num / pipeline_stages devices. With
  /// pipeline_stages V times as many stages on the operators (V > 1), operator stage v
  /// runs on stage v mod pipeline_stages: V chunks per stage, for the interleaved
  /// schedule (graph/pipeline.hpp). 1: the operators' stages are ignored.
  int pipeline_stages = 1;
  /// The micro-batches of a training step (MindSpore's micro_size): the graph is traced
  /// for one micro-batch, and a step feeds micro_size of them (dim 0 of every input
  /// micro_size times the traced one), through the stages in the order `schedule` gives.
  /// The step's loss is the mean of the micro-batches' losses and its gradients the
  /// gradients of that mean. With pipeline_stages 1 and micro_size > 1: gradient
  /// accumulation.
  int micro_size = 1;
  /// The order of the micro-batches' forward and backward passes on each stage.
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;

  /// Whether a step runs micro-batches through stages (pipeline_stages or micro_size
  /// above 1).
  bool pipelined() const { return pipeline_stages > 1 || micro_size > 1; }
};

/// Where an operator's strategy came from.
enum class strategy_source {
  user,
  sharding_propagation,
  dynamic_programming,
  recursive_programming,
  data_parallel,
  stand_alone
};

constexpr std::string_view to_string(strategy_source s) {
  switch (s) {
    case strategy_source::user: return "user";
    case strategy_source::sharding_propagation: return "sharding_propagation";
    case strategy_source::dynamic_programming: return "dynamic_programming";
    case strategy_source::recursive_programming: return "recursive_programming";
    case strategy_source::data_parallel: return "data_parallel";
    case strategy_source::stand_alone: return "stand_alone";
  }
  return "?";
}

/// An operator's strategy and what its rule makes of it: the rule's layouts, or, where
/// partial sums pass through it (a linear operator given them: pass_layouts), the
/// layouts that keep them partial.
struct op_plan {
  strategy st;
  strategy_source source = strategy_source::stand_alone;
  op_layouts lay;
  std::vector<internal_collective> collectives;
};

/// The redistributions of one edge: slot `slot` of operator `consumer` reads node
/// `producer`.
struct edge_plan {
  int producer = -1, consumer = -1, slot = -1;
  route forward;                 ///< producer's value layout -> the consumer's input layout
  bool has_backward = false;     ///< the producer needs this input's gradient
  route backward;                ///< the consumer's input gradient -> the producer's gradient layout
};

/// A value that one pipeline stage makes and a later one reads: the producer's ranks
/// send it each micro-batch, rank i of the producing stage to rank i of the reading
/// stage, in the producer's layout (partial sums included); the gradient comes back the
/// same way, in the producer's gradient layout. Stages are virtual (node::pipeline_stage).
struct pipeline_boundary {
  int producer = -1;          ///< the operator whose value crosses
  int from_stage = -1;        ///< its virtual stage
  int to_stage = -1;          ///< the reading virtual stage
  bool has_backward = false;  ///< the gradient comes back
  index_t bytes = 0;          ///< a rank's shard of the value, in bytes
  index_t grad_bytes = 0;     ///< a rank's shard of the gradient
};

/// A gradient all-reduce of hybrid_parallel: a parameter that is not layer-wise
/// parallel has its gradient summed over every rank.
struct gradient_reduction {
  int parameter = -1;
  mesh dev;          ///< (N,)
  index_t bytes = 0;
};

/// The result of the parallel pass. Every layout is a run-time value; every plan was
/// computed by plan_redistribution.
class parallel_graph {
 public:
  const traced_graph& traced() const { return g_; }
  const parallel_config& config() const { return cfg_; }
  /// The ranks of the job (every pipeline stage's).
  int device_num() const { return cfg_.device_num; }

  // ---- pipeline stages (parallel_config::pipeline_stages) ------------------------

  /// Whether a step runs micro-batches through stages (parallel_config::pipelined).
  bool pipelined() const { return cfg_.pipelined(); }
  /// With micro-batches, whether parameter `id`'s gradient is summed over them as the
  /// backward passes make it and reduced into its layout once a step: a parameter read
  /// by one operator (one read by several is reduced each micro-batch, its readers'
  /// gradient layouts possibly differing).
  bool reduces_gradient_once(int id) const {
    return pipelined() && g_.at(id).kind == node_kind::parameter && g_.consumers(id).size() == 1;
  }
  /// Of bytes_for_rank(rank), the once-a-step gradient reductions (reduces_gradient_once),
  /// which an optimizer with optimizer parallel makes in its step instead; 0 for a plan
  /// without micro-batches.
  index_t bytes_reduced_once(int rank) const {
    if (!pipelined()) return 0;
    const int s = stage_of_rank(rank), i = rank % stage_device_num();
    index_t b = 0;
    for (const edge_plan& e : edges_)
      if (e.has_backward && reduces_gradient_once(e.producer) && physical_stage(stage_[std::size_t(e.consumer)]) == s)
        b += e.backward.p.bytes_for_rank(i);
    return b;
  }
  int pipeline_stages() const { return cfg_.pipeline_stages; }
  /// The chunks (virtual stages) of each stage: 1 unless the operators are on a
  /// multiple of pipeline_stages stages.
  int pipeline_chunks() const { return chunks_; }
  int micro_size() const { return cfg_.micro_size; }
  /// The ranks of one stage, over which its operators are sharded (every layout of the
  /// plan is on that many devices): device_num / pipeline_stages.
  int stage_device_num() const { return cfg_.device_num / cfg_.pipeline_stages; }
  /// The virtual stage of an operator (0 .. pipeline_stages x chunks - 1; 0 without
  /// stages); -1 for the other nodes, which every reading stage has.
  int stage(int id) const { return stage_.at(std::size_t(id)); }
  /// The stage whose ranks run virtual stage v.
  int physical_stage(int v) const { return v % cfg_.pipeline_stages; }
  /// The stage of world rank `rank`, and its rank within the stage.
  int stage_of_rank(int rank) const { return rank / stage_device_num(); }
  /// The values crossing from one virtual stage to another, by producer then reading stage.
  const std::vector<pipeline_boundary>& boundaries() const { return boundaries_; }

  /// The layout of a node's value: a data input's import layout, a parameter's layout
  /// (the one its readers want), an operator's output layout.
  const layout& value_layout(int id) const { return value_layout_[id]; }
  /// The layout in which a node's gradient accumulates: a parameter's own layout, an
  /// operator's out_grad.
  const layout& grad_layout(int id) const { return grad_layout_[id]; }
  /// Whether a node's value needs a gradient (parameters, and operators reading one).
  bool needs_grad(int id) const { return needs_grad_[id]; }
  /// An operator's plan; throws for other nodes.
  const op_plan& op(int id) const {
    if (!ops_[id]) throw error("parallel_graph: " + g_.describe(id) + " is not an operator");
    return *ops_[id];
  }
  /// Every edge, in node order then slot order.
  const std::vector<edge_plan>& edges() const { return edges_; }
  /// The edge into slot `slot` of operator `consumer`.
  const edge_plan& edge(int consumer, int slot) const {
    for (const edge_plan& e : edges_)
      if (e.consumer == consumer && e.slot == slot) return e;
    throw error("parallel_graph: " + g_.describe(consumer) + " has no input " + std::to_string(slot));
  }
  /// The loss's layout -> replicated: how every rank reads the loss.
  const route& loss_fetch() const { return loss_fetch_; }
  /// hybrid_parallel's gradient all-reduces.
  const std::vector<gradient_reduction>& gradient_reductions() const { return grad_reductions_; }
  /// The shape of a node's value on each rank.
  extents local_shape(int id) const { return tessera::local_shape(value_layout(id), g_.at(id).shape); }

  /// The price sharding propagation minimises, for the strategies chosen: the bytes
  /// per rank of every edge's forward and backward redistribution, of the operators'
  /// own collectives and of the loss's fetch (see graph/propagate.hpp). With pipeline
  /// stages: of one micro-batch through every stage, the transfers between stages
  /// aside (bytes_for_rank counts what a rank receives in a whole step).
  index_t priced_bytes() const { return priced_; }
  /// The floating-point operations of a training step on one rank, as
  /// dynamic_programming counts them: each operator's forward_work, three times when
  /// its backward runs (forward, and the gradients of its inputs).
  double work_per_rank() const { return work_; }
  /// What dynamic_programming minimises: priced_bytes() + work_per_rank() /
  /// flops_per_byte, a step's time on one rank in the time of a byte received.
  double step_cost() const { return double(priced_) + work_ / cfg_.flops_per_byte; }
  /// The bytes each device holds in a training step, as memory_budget counts them: the
  /// data inputs' shards, each operator's output shard (kept for its backward), and
  /// each parameter's shard with its gradient and optimizer_slots state tensors. With
  /// pipeline stages, the most any stage holds: its parameters, and the activations
  /// (outputs, inputs and values received) of the micro-batches its schedule holds at
  /// once.
  index_t memory_per_device() const {
    if (!stage_memory_.empty()) return *std::max_element(stage_memory_.begin(), stage_memory_.end());
    index_t m = 0;
    for (index_t b : memory_) m += b;
    return m;
  }
  /// With pipeline stages, what each stage's devices hold (memory_per_device).
  const std::vector<index_t>& stage_memory() const { return stage_memory_; }
  /// What memory_per_device holds, per node (an operator's bytes include the
  /// parameters it reads first): (node id, bytes), largest first.
  std::vector<std::pair<int, index_t>> memory_consumers() const {
    std::vector<std::pair<int, index_t>> c;
    for (int id = 0; id < int(memory_.size()); ++id)
      if (memory_[id] > 0) c.emplace_back(id, memory_[id]);
    std::stable_sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return c;
  }
  /// The wall time, in seconds, of the strategy search that chose the unconfigured
  /// operators' strategies (0 where no search ran); the rest of parallelize plans the
  /// chosen layouts' redistributions.
  double search_seconds() const { return search_seconds_; }
  /// The bytes `rank` receives in one training step: the priced redistributions,
  /// collectives and loss fetch, and hybrid_parallel's gradient all-reduces. With
  /// pipeline stages or micro-batches (`rank` a rank of the job): those of its stage's
  /// operators once per micro-batch (a parameter read once has its gradient reduced
  /// once a step), the values and gradients it receives from other stages, and the
  /// step's loss sent to every rank.
  index_t bytes_for_rank(int rank) const {
    if (pipelined()) return pipelined_bytes_for_rank(rank);
    index_t b = 0;
    for (const edge_plan& e : edges_) {
      b += e.forward.p.bytes_for_rank(rank);
      if (e.has_backward) b += e.backward.p.bytes_for_rank(rank);
    }
    for (std::size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i])
        for (const internal_collective& c : ops_[i]->collectives)
          if (!c.backward || needs_grad_[i]) b += c.bytes_on(rank);
    b += loss_fetch_.p.bytes_for_rank(rank);
    for (const gradient_reduction& r : grad_reductions_) b += r.bytes;
    return b;
  }

 private:
  friend parallel_graph parallelize(const traced_graph&, const parallel_config&);

  traced_graph g_;
  parallel_config cfg_;
  std::vector<layout> value_layout_, grad_layout_;
  std::vector<bool> needs_grad_;
  std::vector<std::optional<op_plan>> ops_;
  std::vector<edge_plan> edges_;
  route loss_fetch_;
  std::vector<gradient_reduction> grad_reductions_;
  index_t priced_ = 0;
  double work_ = 0;
  double search_seconds_ = 0;
  std::vector<index_t> memory_;  // per node
  std::vector<index_t> stage_memory_;  // per physical stage (pipelined plans)
  std::vector<int> stage_;             // per node: its virtual stage (operators)
  int chunks_ = 1;
  std::vector<pipeline_boundary> boundaries_;

  index_t pipelined_bytes_for_rank(int rank) const {
    const int s = stage_of_rank(rank), i = rank % stage_device_num();
    const index_t M = cfg_.micro_size;
    index_t b = 0;
    for (const edge_plan& e : edges_)
      if (physical_stage(stage_[std::size_t(e.consumer)]) == s) {
        b += M * e.forward.p.bytes_for_rank(i);
        if (e.has_backward) b += (reduces_gradient_once(e.producer) ? 1 : M) * e.backward.p.bytes_for_rank(i);
      }
    for (std::size_t id = 0; id < ops_.size(); ++id)
      if (ops_[id] && physical_stage(stage_[id]) == s)
        for (const internal_collective& c : ops_[id]->collectives)
          if (!c.backward || needs_grad_[id]) b += M * c.bytes_on(i);
    if (physical_stage(stage_[std::size_t(g_.loss())]) == s) b += M * loss_fetch_.p.bytes_for_rank(i);
    for (const pipeline_boundary& x : boundaries_) {
      if (physical_stage(x.from_stage) == physical_stage(x.to_stage)) continue;  // handed over in memory
      if (physical_stage(x.to_stage) == s) b += M * x.bytes;
      if (x.has_backward && physical_stage(x.from_stage) == s) b += M * x.grad_bytes;
    }
    if (cfg_.pipeline_stages > 1) b += cost::all_reduce(index_t(sizeof(double)), cfg_.device_num);  // the loss to every rank
    return b;
  }
};

namespace detail {

inline std::string where(const strategy& st, int device_num, strategy_source src) {
  return "strategy " + to_string(st) + " on " + std::to_string(device_num) + (device_num == 1 ? " device" : " devices") +
         " (" + std::string(to_string(src)) + ")";
}

inline op_layouts evaluate_or_throw(const traced_graph& g, int id, const strategy& st, int device_num, strategy_source src) {
  evaluation e = evaluate(g, id, st, device_num);
  if (!e.lay) throw error(e.s, e.context, where(st, device_num, src));
  return std::move(*e.lay);
}

// The work of operator `id` in a training step under layouts `l` (work_per_rank).
inline double op_work(const traced_graph& g, int id, const op_layouts& l, bool backward) {
  const node& n = g.at(id);
  return (backward ? 3.0 : 1.0) * n.op->forward_work(l, g.input_shapes(id), n.shape);
}

// Every split 1: the data-parallel strategy on one device.
inline strategy all_ones(const traced_graph& g, int id) { return g.at(id).op->data_parallel(1, g.input_shapes(id)); }

inline layout import_layout(const traced_graph& g, int id, const parallel_config& cfg, int index) {
  const node& n = g.at(id);
  const int N = cfg.device_num;
  const mesh flat{N};
  const std::string who = "parallelize: dataset_strategy " + cfg.dataset.to_string() + ": input '" + n.name + "' " +
                          to_string(n.shape);
  const bool whole = cfg.mode == parallel_mode::stand_alone || cfg.mode == parallel_mode::hybrid_parallel;
  const dataset_strategy::kind k = cfg.dataset.which();
  if (whole || k == dataset_strategy::kind::full_batch || (k == dataset_strategy::kind::data_parallel && n.shape.ndim == 0))
    return layout::replicated(flat, n.shape.ndim);
  if (k == dataset_strategy::kind::data_parallel) {
    layout l = layout::replicated(flat, n.shape.ndim);
    l.split[0] = axis_list{0};
    if (const status s = check(l, n.shape); !s.ok()) throw error(s, who);
    return l;
  }
  const split_tuple& t = cfg.dataset.tuples()[index];
  if (t.n != n.shape.ndim)
    throw error(who + ": the input has rank " + std::to_string(n.shape.ndim) + ", its split tuple " + to_string(t) +
                " has " + std::to_string(t.n) + (t.n == 1 ? " entry" : " entries"));
  if (status s = check(t, N, index); !s.ok()) throw error(s, who);
  const layout l = strategy_layout(t, N);
  if (const status s = check(l, n.shape); !s.ok()) throw error(s, who);
  return l;
}

// Checks parallel_config's pipeline against the graph and gives each node its virtual
// stage (operators; -1 for the others).
inline std::vector<int> pipeline_stages_of(const traced_graph& g, const parallel_config& cfg) {
  const int S = cfg.pipeline_stages, N = cfg.device_num;
  if (S < 1) throw error("parallelize: pipeline_stages must be at least 1, got " + std::to_string(S));
  if (N % S != 0)
    throw error("parallelize: pipeline_stages " + std::to_string(S) + " does not divide device_num " + std::to_string(N) +
                " into stages of equal size");
  if (cfg.micro_size < 1) throw error("parallelize: micro_size must be at least 1, got " + std::to_string(cfg.micro_size));
  if (cfg.mode == parallel_mode::hybrid_parallel && (S > 1 || cfg.micro_size > 1))
    throw error("parallelize: hybrid_parallel runs each rank's own graph; it has no pipeline stages or micro-batches "
                "(pipeline_stages " + std::to_string(S) + ", micro_size " + std::to_string(cfg.micro_size) + ")");
  std::vector<int> stage(std::size_t(g.size()), -1);
  const int K = S > 1 ? g.pipeline_stage_count() : 1;
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op) stage[std::size_t(id)] = S > 1 ? g.at(id).pipeline_stage : 0;
  if (S > 1 && (K < S || K % S != 0))
    throw error("parallelize: the operators are on " + std::to_string(K) + " pipeline " +
                (K == 1 ? "stage" : "stages") + " (node pipeline_stage 0 .. " + std::to_string(K - 1) +
                "); pipeline_stages " + std::to_string(S) + " needs " + std::to_string(S) +
                " of them, or a multiple of " + std::to_string(S) + " (chunks of the interleaved schedule)");
  check_schedule(cfg.schedule, S, K / S, cfg.micro_size);
  if (S == 1) return stage;
  std::vector<int> first(std::size_t(K), -1);
  for (int id = 0; id < g.size(); ++id)
    if (stage[std::size_t(id)] >= 0 && first[std::size_t(stage[std::size_t(id)])] < 0)
      first[std::size_t(stage[std::size_t(id)])] = id;
  for (int v = 0; v < K; ++v)
    if (first[std::size_t(v)] < 0)
      throw error("parallelize: pipeline stage " + std::to_string(v) + " of " + std::to_string(K) + " has no operator");
  for (int id = 0; id < g.size(); ++id) {
    const node& n = g.at(id);
    if (n.kind != node_kind::op) continue;
    for (int p : n.inputs)
      if (g.at(p).kind == node_kind::op && stage[std::size_t(p)] > stage[std::size_t(id)])
        throw error("parallelize: " + g.describe(id) + " on pipeline stage " + std::to_string(stage[std::size_t(id)]) +
                    " reads " + g.describe(p) + " of the later stage " + std::to_string(stage[std::size_t(p)]) +
                    "; values flow to later stages only");
  }
  for (int p : g.parameters()) {
    const auto& readers = g.consumers(p);
    for (const auto& [c, slot] : readers)
      if (stage[std::size_t(c)] != stage[std::size_t(readers.front().first)])
        throw error("parallelize: parameter '" + g.at(p).name + "' is read by " + g.describe(readers.front().first) +
                    " on pipeline stage " + std::to_string(stage[std::size_t(readers.front().first)]) + " and by " +
                    g.describe(c) + " on stage " + std::to_string(stage[std::size_t(c)]) +
                    "; a parameter belongs to one stage");
  }
  return stage;
}

}  // namespace detail

/// Runs the parallel pass (see the top of this header). Throws tessera::error, naming
/// the node and the numbers, for: a strategy its operator's rule rejects or that
/// splits a dim unevenly; a parameter two operators want laid out differently; a
/// dataset strategy that does not fit the inputs (count, rank, divisibility, device
/// count) or the mode; an AllReduce node or a layer-wise parallel parameter outside
/// hybrid_parallel; pipeline stages that do not divide the ranks, that the operators'
/// stages do not match, that a value would cross backwards, or that share a parameter.
inline parallel_graph parallelize(const traced_graph& g, const parallel_config& config) {
  if (config.device_num < 1) throw error("parallelize: device_num must be positive, got " + std::to_string(config.device_num));
  const std::vector<int> stage_of = detail::pipeline_stages_of(g, config);
  // The operators are sharded over the ranks of one stage.
  parallel_config stage_cfg = config;
  stage_cfg.device_num = config.device_num / config.pipeline_stages;
  const parallel_config& cfg = stage_cfg;
  const int N = cfg.device_num;
  if (cfg.elem_bytes < 1) throw error("parallelize: elem_bytes must be positive, got " + std::to_string(cfg.elem_bytes));
  if (cfg.memory_budget < 0)
    throw error("parallelize: memory_budget must be 0 (no limit) or positive, got " + std::to_string(cfg.memory_budget));
  if (cfg.optimizer_slots < 0)
    throw error("parallelize: optimizer_slots must not be negative, got " + std::to_string(cfg.optimizer_slots));
  if (!(cfg.flops_per_byte > 0))
    throw error("parallelize: flops_per_byte must be positive, got " + std::to_string(cfg.flops_per_byte));
  if (g.loss() < 0) throw error("parallelize: the graph has no loss (build it with graph_builder::build)");
  if (cfg.mode == parallel_mode::auto_parallel && cfg.search == search_mode::recursive_programming)
    detail::require_power_of_two(N);
  const parallel_mode mode = cfg.mode;
  const bool hybrid = mode == parallel_mode::hybrid_parallel;
  const bool semi_or_auto = mode == parallel_mode::semi_auto_parallel || mode == parallel_mode::auto_parallel;
  if (cfg.dataset.which() != dataset_strategy::kind::data_parallel && !semi_or_auto)
    throw error("parallelize: dataset_strategy " + cfg.dataset.to_string() +
                " needs parallel_mode semi_auto_parallel or auto_parallel, not " + std::string(to_string(mode)));
  const std::vector<int> inputs = g.inputs();
  if (cfg.dataset.which() == dataset_strategy::kind::per_input && cfg.dataset.tuples().size() != inputs.size()) {
    std::string names;
    for (std::size_t i = 0; i < inputs.size(); ++i) names += (i ? ", '" : "'") + g.at(inputs[i]).name + "'";
    throw error("parallelize: dataset_strategy " + cfg.dataset.to_string() + " has " +
                std::to_string(cfg.dataset.tuples().size()) + " split tuples for " + std::to_string(inputs.size()) +
                (inputs.size() == 1 ? " input (" : " inputs (") + names + ")");
  }

  parallel_graph pg;
  pg.g_ = g;
  pg.cfg_ = config;
  pg.stage_ = stage_of;
  pg.chunks_ = config.pipeline_stages > 1 ? std::max(1, g.pipeline_stage_count() / config.pipeline_stages) : 1;
  const std::size_t n = std::size_t(g.size());
  pg.value_layout_.resize(n);
  pg.grad_layout_.resize(n);
  pg.needs_grad_.assign(n, false);
  pg.ops_.resize(n);

  // Mode checks, needs_grad, data import.
  for (int id = 0; id < g.size(); ++id) {
    const node& nd = g.at(id);
    if (nd.kind == node_kind::parameter) {
      pg.needs_grad_[id] = true;
      if (nd.layerwise_parallel && !hybrid)
        throw error("parallelize: parameter '" + nd.name + "' is layer-wise parallel, which only hybrid_parallel supports, not " +
                    std::string(to_string(mode)));
    } else if (nd.kind == node_kind::op) {
      if (nd.op->hybrid_only() && !hybrid)
        throw error("parallelize: " + g.describe(id) + " is a hybrid_parallel operator; in " + std::string(to_string(mode)) +
                    " the parallel pass places communication itself");
      try {
        nd.op->validate(N);
      } catch (const error& e) {
        throw error("parallelize: " + g.describe(id) + ": " + e.what());
      }
      for (std::size_t s = 0; s < nd.inputs.size(); ++s)
        if (pg.needs_grad_[nd.inputs[s]] && nd.op->differentiable(int(s))) pg.needs_grad_[id] = true;
    }
  }
  // needs_grad so far: the value depends on a parameter. It also has to receive a
  // gradient from the loss, through differentiable inputs of operators whose backward runs.
  {
    std::vector<bool> receives(n, false);
    receives[g.loss()] = true;
    for (int id = g.size() - 1; id >= 0; --id) {
      if (!(receives[id] && pg.needs_grad_[id]) || g.at(id).kind != node_kind::op) continue;
      for (std::size_t s = 0; s < g.at(id).inputs.size(); ++s)
        if (g.at(id).op->differentiable(int(s))) receives[g.at(id).inputs[s]] = true;
    }
    for (std::size_t id = 0; id < n; ++id) pg.needs_grad_[id] = pg.needs_grad_[id] && receives[id];
  }
  for (std::size_t i = 0; i < inputs.size(); ++i)
    pg.value_layout_[inputs[i]] = detail::import_layout(g, inputs[i], cfg, int(i));

  const auto search_start = std::chrono::steady_clock::now();
  // Strategies: fixed ones now, the others by the search. Each operator linear in some
  // input also gets, per strategy, the variants that keep the partial sums its producers
  // may give it (partial_variants), listed before the strategy's own layouts: a
  // configured operator with variants chooses among them in the search too.
  propagation_input pin;
  pin.g = &g;
  pin.device_num = N;
  pin.elem_bytes = cfg.elem_bytes;
  pin.input_layout = pg.value_layout_;
  pin.fixed.resize(n);
  pin.free.resize(n);
  pin.anchor.assign(n, false);
  pin.needs_grad = pg.needs_grad_;
  std::vector<std::vector<layout>> outs(n);  // per operator, every output layout it may give
  std::vector<strategy_source> fixed_source(n, strategy_source::stand_alone);
  auto with_variants = [&](int id, const op_candidates& base) {
    const node& nd = g.at(id);
    if (hybrid || N == 1 || !nd.op->linear().any()) return base;
    std::vector<std::vector<layout>> arriving;
    for (int p : nd.inputs) arriving.push_back(g.at(p).kind == node_kind::op ? outs[p] : std::vector<layout>{});
    op_candidates c;
    for (std::size_t k = 0; k < base.st.size(); ++k) {
      for (op_layouts& v : partial_variants(*nd.op, base.lay[k], arriving)) {
        c.st.push_back(base.st[k]);
        c.lay.push_back(std::move(v));
      }
      c.st.push_back(base.st[k]);
      c.lay.push_back(base.lay[k]);
    }
    return c;
  };
  // recursive_programming cuts the unconfigured operators itself and keeps the
  // configured ones' own layouts; so does sharding propagation under the symbolic price,
  // where pricing every pair of candidates exactly would exceed exact_pricing_limit.
  const bool rec = mode == parallel_mode::auto_parallel && cfg.search == search_mode::recursive_programming;
  bool symbolic_propagate = false;
  if (mode == parallel_mode::auto_parallel && cfg.search == search_mode::sharding_propagation &&
      std::has_single_bit(unsigned(N))) {
    std::map<std::string, double> count_of;  // candidates per signature
    auto count = [&](int id) {
      std::string key = detail::signature(g, id);
      auto it = count_of.find(key);
      if (it == count_of.end())
        it = count_of.emplace(std::move(key), double(g.at(id).op->candidates(N, g.input_shapes(id)).size())).first;
      return it->second;
    };
    double pairs = 0;
    for (int c = 0; c < g.size() && pairs * double(N) * double(N) <= cfg.exact_pricing_limit; ++c) {
      const node& cn = g.at(c);
      if (cn.kind != node_kind::op || cn.user_strategy) continue;
      for (int p : cn.inputs)
        if (g.at(p).kind == node_kind::op && !g.at(p).user_strategy) pairs += count(p) * count(c);
    }
    symbolic_propagate = pairs * double(N) * double(N) > cfg.exact_pricing_limit;
  }
  const bool symbolic = rec || symbolic_propagate;
  std::vector<bool> searched(n, false);  // the operators a symbolic search decides
  bool any_free = false;
  for (int id = 0; id < g.size(); ++id) {
    const node& nd = g.at(id);
    if (nd.kind != node_kind::op) continue;
    if (symbolic && !nd.user_strategy) {
      searched[id] = any_free = true;
      continue;
    }
    const shape_list shapes = g.input_shapes(id);
    op_plan o;
    if (mode == parallel_mode::stand_alone || hybrid) {
      o.st = detail::all_ones(g, id);
      o.source = strategy_source::stand_alone;
    } else if (mode == parallel_mode::data_parallel || (mode == parallel_mode::semi_auto_parallel && !nd.user_strategy)) {
      o.st = nd.op->data_parallel(N, shapes);
      o.source = strategy_source::data_parallel;
    } else if (nd.user_strategy) {
      o.st = *nd.user_strategy;
      o.source = strategy_source::user;
    } else {
      op_candidates c;
      for (const strategy& st : nd.op->candidates(N, shapes)) {
        detail::evaluation e = detail::evaluate(g, id, st, N);
        if (!e.lay) continue;
        c.st.push_back(st);
        c.lay.push_back(std::move(*e.lay));
      }
      if (c.st.empty())
        throw error("parallelize: " + g.describe(id) + " has no strategy on " + std::to_string(N) + " devices");
      pin.free[id] = with_variants(id, c);
      for (const op_layouts& l : pin.free[id].lay) outs[id].push_back(l.out);
      any_free = true;
      continue;
    }
    o.lay = detail::evaluate_or_throw(g, id, o.st, N, o.source);
    op_candidates c = symbolic ? op_candidates{{o.st}, {o.lay}} : with_variants(id, op_candidates{{o.st}, {o.lay}});
    for (const op_layouts& l : c.lay) outs[id].push_back(l.out);
    if (c.st.size() > 1) {  // the configured strategy and its variants: a choice for the search
      pin.free[id] = std::move(c);
      pin.anchor[id] = true;
      fixed_source[id] = o.source;
      any_free = true;
      continue;
    }
    pin.fixed[id] = o.lay;
    pg.ops_[id] = std::move(o);
  }
  detail::route_cache rc(cfg.elem_bytes);
  const bool dp = mode == parallel_mode::auto_parallel && cfg.search == search_mode::dynamic_programming;
  // The search, with memory weighed at `lambda` per byte (0: free): writes the chosen
  // strategies of the operators it decides into pg.ops_.
  std::optional<graph_problem> gp;             // built once (the exact prices)
  std::vector<std::vector<index_t>> memory_of;  // per variable and candidate
  auto search = [&](double lambda) {
    if (symbolic) {
      recursive_input rin;
      rin.g = &g;
      rin.device_num = N;
      rin.elem_bytes = cfg.elem_bytes;
      rin.flops_per_byte = cfg.flops_per_byte;
      rin.input_layout = pg.value_layout_;
      rin.fixed.resize(n);
      rin.fixed_strategy.resize(n);
      for (int id = 0; id < g.size(); ++id)
        if (pg.ops_[id] && !searched[id]) {
          rin.fixed[id] = pg.ops_[id]->lay;
          rin.fixed_strategy[id] = pg.ops_[id]->st;
        }
      rin.needs_grad = pg.needs_grad_;
      rin.memory_weight = lambda;
      rin.optimizer_slots = cfg.optimizer_slots;
      const recursive_result r = rec ? recursive_programming(rin) : symbolic_propagation(rin);
      for (int id = 0; id < g.size(); ++id) {
        if (r.choice[id]) {
          pg.ops_[id] = op_plan{r.choice[id]->st,
                                rec ? strategy_source::recursive_programming : strategy_source::sharding_propagation,
                                r.choice[id]->lay, {}};
        } else if (searched[id]) {  // unreached by propagation: data parallel
          op_plan o;
          o.st = g.at(id).op->data_parallel(N, g.input_shapes(id));
          o.source = strategy_source::data_parallel;
          o.lay = detail::evaluate_or_throw(g, id, o.st, N, o.source);
          pg.ops_[id] = std::move(o);
        }
      }
      return;
    }
    if (!gp) {
      gp = build_problem(pin, rc);
      if (dp)  // every operator a choice, priced with its work too (in bytes' time)
        for (std::size_t v = 0; v < gp->vars.size(); ++v) {
          const int id = gp->vars[v];
          for (std::size_t k = 0; k < gp->pb.unary[v].size(); ++k) {
            const double w = detail::op_work(g, id, pin.free[id].lay[k], pg.needs_grad_[id]) / cfg.flops_per_byte;
            gp->pb.unary[v][k] = detail::add_bytes(gp->pb.unary[v][k], w >= double(infinite_bytes) ? infinite_bytes
                                                                                                 : index_t(w + 0.5));
          }
          gp->pb.anchored[v] = true;
        }
    }
    search_problem pb = gp->pb;
    if (lambda > 0) {  // every operator a choice, its memory priced too
      if (memory_of.empty())
        for (int id : gp->vars) {
          memory_of.emplace_back();
          for (const op_layouts& l : pin.free[id].lay)
            memory_of.back().push_back(detail::op_memory(g, id, l, cfg.elem_bytes, cfg.optimizer_slots));
        }
      for (std::size_t v = 0; v < gp->vars.size(); ++v) {
        for (std::size_t k = 0; k < pb.unary[v].size(); ++k) {
          const double m = lambda * double(memory_of[v][k]);
          pb.unary[v][k] = detail::add_bytes(pb.unary[v][k], m >= double(infinite_bytes) ? infinite_bytes : index_t(m + 0.5));
        }
        pb.anchored[v] = true;
      }
    }
    const search_result r = solve(pb);
    for (std::size_t v = 0; v < gp->vars.size(); ++v) {
      const int id = gp->vars[v];
      op_plan o;
      if (r.pick[v] >= 0) {
        o.st = pin.free[id].st[r.pick[v]];
        o.source = pin.anchor[id] ? fixed_source[id]
                   : dp           ? strategy_source::dynamic_programming
                                  : strategy_source::sharding_propagation;
        o.lay = pin.free[id].lay[r.pick[v]];
      } else {
        o.st = g.at(id).op->data_parallel(N, g.input_shapes(id));
        o.source = strategy_source::data_parallel;
        o.lay = detail::evaluate_or_throw(g, id, o.st, N, o.source);
      }
      pg.ops_[id] = std::move(o);
    }
  };
  // The bytes each device holds for node `id` under the strategies in pg.ops_: a data
  // input's shard, an operator's op_memory; and for all nodes.
  auto node_memory = [&](int id) -> index_t {
    if (g.at(id).kind == node_kind::input) return local_size(pg.value_layout_[id], g.at(id).shape) * cfg.elem_bytes;
    return pg.ops_[id] ? detail::op_memory(g, id, pg.ops_[id]->lay, cfg.elem_bytes, cfg.optimizer_slots) : 0;
  };
  // With pipeline stages, per stage: its parameters, and the activations of the units
  // (a chunk's part of a micro-batch: operator outputs, the inputs it reads, the values
  // it receives) its schedule holds at once.
  const bool pipelined = config.pipelined();
  auto stage_memory = [&] {
    const int S = config.pipeline_stages, V = pg.chunks_;
    std::vector<index_t> per(std::size_t(S), 0), act(std::size_t(S * V), 0);
    std::set<std::pair<int, int>> held;  // (value, virtual stage) counted
    for (int id = 0; id < g.size(); ++id) {
      const node& nd = g.at(id);
      if (nd.kind != node_kind::op || !pg.ops_[id]) continue;
      const int v = stage_of[std::size_t(id)];
      const index_t out = local_size(pg.ops_[id]->lay.out, nd.shape) * cfg.elem_bytes;
      per[std::size_t(v % S)] += node_memory(id) - out;
      act[std::size_t(v)] += out;
      for (int p : nd.inputs) {
        const node& pn = g.at(p);
        const bool received = pn.kind == node_kind::op && stage_of[std::size_t(p)] != v;
        if ((pn.kind == node_kind::input || received) && held.emplace(p, v).second)
          act[std::size_t(v)] += local_size(pn.kind == node_kind::input ? pg.value_layout_[p] : pg.ops_[p]->lay.out,
                                            pn.shape) * cfg.elem_bytes;
      }
    }
    for (int st = 0; st < S; ++st) {
      index_t live = 0, peak = 0;
      for (const pipeline_unit& u : schedule_order(config.schedule, S, V, config.micro_size, st)) {
        const index_t a = act[std::size_t(u.chunk * S + st)];
        live = u.forward ? live + a : live - a;
        peak = std::max(peak, live);
      }
      per[std::size_t(st)] += peak;
    }
    return per;
  };
  auto memory = [&] {
    if (pipelined) {
      const std::vector<index_t> per = stage_memory();
      return *std::max_element(per.begin(), per.end());
    }
    index_t m = 0;
    for (int id = 0; id < g.size(); ++id) m += node_memory(id);
    return m;
  };
  if (any_free) {
    search(0);
    // Over the memory budget: memory weighed against bytes received, its price raised
    // until the plan fits, then bisected down to the cheapest price that still fits.
    if (cfg.memory_budget > 0 && memory() > cfg.memory_budget) {
      double over = 0, fits = 1.0 / 1024;
      for (search(fits); memory() > cfg.memory_budget && fits < 1e9; search(fits)) {
        over = fits;
        fits *= 8;
      }
      if (memory() <= cfg.memory_budget) {
        for (int i = 0; i < 12; ++i) {
          const double mid = std::sqrt(std::max(over, fits / 1024) * fits);
          search(mid);
          (memory() <= cfg.memory_budget ? fits : over) = mid;
        }
        search(fits);
      }
    }
  }
  // Memory: per node, and against the budget.
  pg.memory_.assign(n, 0);
  for (int id = 0; id < g.size(); ++id) pg.memory_[id] = node_memory(id);
  if (pipelined) pg.stage_memory_ = stage_memory();
  if (cfg.memory_budget > 0 && pg.memory_per_device() > cfg.memory_budget) {
    std::string largest;
    const auto consumers = pg.memory_consumers();
    for (std::size_t i = 0; i < consumers.size() && i < 3; ++i) {
      const auto [id, bytes] = consumers[i];
      std::string what = g.describe(id);
      if (g.at(id).kind == node_kind::op) {
        what += " " + to_string(pg.ops_[id]->st) + " (its output";
        for (int p : g.at(id).inputs)
          if (g.at(p).kind == node_kind::parameter && g.consumers(p).front().first == id)
            what += ", parameter '" + g.at(p).name + "' with its gradient and optimizer state";
        what += ")";
      }
      largest += (i ? "; " : "") + what + ": " + std::to_string(bytes) + " bytes";
    }
    throw error("parallelize: the plan holds " + std::to_string(pg.memory_per_device()) +
                " bytes per device, over the memory budget of " + std::to_string(cfg.memory_budget) + " bytes" +
                (any_free && mode == parallel_mode::auto_parallel
                     ? " with the search weighing memory as dearly as it can"
                     : " (" + std::string(to_string(mode)) + " has no choice to make)") +
                "; the largest: " + largest);
  }
  if (any_free) pg.search_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - search_start).count();
  for (int id = 0; id < g.size(); ++id)
    if (pg.ops_[id]) {
      op_plan& o = *pg.ops_[id];
      o.collectives = g.at(id).op->collectives(o.st, N, g.input_shapes(id), cfg.elem_bytes);
      pg.work_ += detail::op_work(g, id, o.lay, pg.needs_grad_[id]);
      pg.value_layout_[id] = o.lay.out;
      pg.grad_layout_[id] = o.lay.out_grad;
    }

  // Parameters: one layout, the one every reader wants.
  for (int p : g.parameters()) {
    const auto readers = g.consumers(p);
    const auto [c0, s0] = readers.front();
    const layout& first = pg.ops_[c0]->lay.in[s0];
    for (std::size_t k = 1; k < readers.size(); ++k) {
      const auto [ck, sk] = readers[k];
      const layout& other = pg.ops_[ck]->lay.in[sk];
      if (!same_placement(first, other)) {
        auto who = [&](int c) {
          return g.describe(c) + " with strategy " + to_string(pg.ops_[c]->st) + " (" +
                 std::string(to_string(pg.ops_[c]->source)) + ")";
        };
        throw error("parallelize: parameter '" + g.at(p).name + "' " + to_string(g.at(p).shape) + " is read by " + who(c0) +
                    " as " + describe(first) + " and by " + who(ck) + " as " + describe(other) +
                    "; the operators sharing a parameter must lay it out alike");
      }
    }
    pg.value_layout_[p] = first;
    pg.grad_layout_[p] = first;
  }
  // Constants: made in the layout their first reader wants (a scalar, replicated, which
  // the other readers' routes take as it is).
  for (int c : g.ids(node_kind::constant)) {
    const auto readers = g.consumers(c);
    pg.value_layout_[c] =
        readers.empty() ? layout::replicated(mesh{N}, 0) : pg.ops_[readers.front().first]->lay.in[readers.front().second];
    pg.grad_layout_[c] = pg.value_layout_[c];
  }

  // Every edge's routes.
  auto route_or_throw = [&](const layout& from, const layout& to, const extents& shape, int p, int c) {
    const route& r = rc.get(from, to, shape);
    if (!r.feasible)
      throw error("parallelize: " + g.describe(p) + " -> " + g.describe(c) + ": device matrices " + to_string(from.dev) +
                  " and " + to_string(to.dev) + " share no refinement, so no redistribution joins " + describe(from) +
                  " and " + describe(to));
    return r;
  };
  for (int c = 0; c < g.size(); ++c) {
    const node& cn = g.at(c);
    if (cn.kind != node_kind::op) continue;
    const op_plan& o = *pg.ops_[c];
    for (std::size_t s = 0; s < cn.inputs.size(); ++s) {
      const int p = cn.inputs[s];
      const extents& shape = g.at(p).shape;
      edge_plan e;
      e.producer = p;
      e.consumer = c;
      e.slot = int(s);
      e.forward = route_or_throw(pg.value_layout_[p], o.lay.in[s], shape, p, c);
      e.has_backward = pg.needs_grad_[p] && cn.op->differentiable(int(s));
      if (e.has_backward) e.backward = route_or_throw(o.lay.in_grad[s], pg.grad_layout_[p], shape, c, p);
      pg.priced_ = detail::add_bytes(pg.priced_, e.forward.bytes());
      if (e.has_backward) pg.priced_ = detail::add_bytes(pg.priced_, e.backward.bytes());
      pg.edges_.push_back(std::move(e));
    }
    for (const internal_collective& ic : o.collectives)
      if (!ic.backward || pg.needs_grad_[c]) pg.priced_ = detail::add_bytes(pg.priced_, ic.bytes);
  }
  const layout& ll = pg.value_layout_[g.loss()];
  pg.loss_fetch_ = rc.get(ll, layout::replicated(ll.dev, 0), g.at(g.loss()).shape);
  // Values crossing pipeline stages.
  if (config.pipeline_stages > 1)
    for (const edge_plan& e : pg.edges_) {
      const int u = stage_of[std::size_t(e.producer)], v = stage_of[std::size_t(e.consumer)];
      if (g.at(e.producer).kind != node_kind::op || u == v) continue;
      auto it = std::find_if(pg.boundaries_.begin(), pg.boundaries_.end(),
                             [&](const pipeline_boundary& b) { return b.producer == e.producer && b.to_stage == v; });
      if (it == pg.boundaries_.end()) {
        const extents& shape = g.at(e.producer).shape;
        pg.boundaries_.push_back({e.producer, u, v, false, local_size(pg.value_layout_[e.producer], shape) * cfg.elem_bytes,
                                  local_size(pg.grad_layout_[e.producer], shape) * cfg.elem_bytes});
        it = pg.boundaries_.end() - 1;
      }
      it->has_backward = it->has_backward || e.has_backward;
    }
  std::stable_sort(pg.boundaries_.begin(), pg.boundaries_.end(), [](const pipeline_boundary& a, const pipeline_boundary& b) {
    return a.producer != b.producer ? a.producer < b.producer : a.to_stage < b.to_stage;
  });
  pg.priced_ = detail::add_bytes(pg.priced_, pg.loss_fetch_.bytes());
  if (hybrid && N > 1)
    for (int p : g.parameters())
      if (!g.at(p).layerwise_parallel)
        pg.grad_reductions_.push_back({p, mesh{N}, cost::all_reduce(g.at(p).shape.size() * cfg.elem_bytes, N)});
  return pg;
}

}  // namespace tessera::graph
