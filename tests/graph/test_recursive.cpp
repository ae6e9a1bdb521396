// The recursive_programming search (graph/recursive.hpp): its symbolic price against
// the planner where both are exact; its choices on small graphs against a brute-force
// search over every assignment of candidates under the same symbolic price, written
// again here; the worked example of its header; every strategy it returns valid, on 1
// to 1024 devices; and its errors. Also sharding propagation under the same symbolic
// price (beyond parallel_config::exact_pricing_limit) against the exact one.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>
#include <tessera/graph/parallel.hpp>
#include "error_text.hpp"

namespace graph_test_recursive {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::graph;
using tessera::testing::error_of;

TEST_CASE("symbolic_bytes: the planner's bytes for single collectives, slicing and equal placements") {
  const extents shape{16, 16};
  struct pair {
    const char* what;
    layout from, to;
  };
  const layout rows8(mesh{8}, {{0}, {}}), cols8(mesh{8}, {{}, {0}});
  const std::vector<pair> cases = {
      {"all-gather", rows8, layout::replicated(mesh{8}, 2)},
      {"slicing", layout::replicated(mesh{8}, 2), rows8},
      {"all-to-all", rows8, cols8},
      {"reduce-scatter", layout(mesh{2, 4}, {{0}, {}}).with_partial(1), layout(mesh{2, 4}, {{0}, {1}})},
      {"all-reduce", layout(mesh{2, 4}, {{0}, {}}).with_partial(1), layout(mesh{2, 4}, {{0}, {}})},
      {"all-gather over one mesh axis", layout(mesh{2, 4}, {{0}, {1}}), layout(mesh{2, 4}, {{0}, {}})},
      {"the same shards on two device matrices", rows8, layout(mesh{2, 4}, {{0, 1}, {}})},
      {"equal", cols8, cols8},
  };
  for (const pair& c : cases) {
    CAPTURE(c.what);
    const double sym = symbolic_bytes(c.from, c.to, shape, 4);
    CHECK(sym == doctest::Approx(double(plan_route(c.from, c.to, shape, 4).bytes())));
  }
  CHECK(symbolic_bytes(rows8, layout::replicated(mesh{8}, 2), shape, 4) == 896);  // 7 of 8 row blocks of 128 bytes
  CHECK(error_of([] { symbolic_bytes(layout(mesh{6}, {{0}, {}}), layout::replicated(mesh{6}, 2), extents{6, 6}, 4); }) ==
        "symbolic_bytes: device matrices (6,) and (6,) must hold the same power-of-two number of ranks");
}

namespace {

parallel_config recursive(int n) {
  parallel_config c;
  c.mode = parallel_mode::auto_parallel;
  c.search = search_mode::recursive_programming;
  c.device_num = n;
  return c;
}

struct case_graph {
  std::string name;
  std::function<traced_graph(int)> make;  // for n devices
};

// Small graphs, none configured unless the name says so.
std::vector<case_graph> graphs() {
  return {
      {"chain: MatMul, ReLU, MatMul, ReduceMean",
       [](int) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 64})));
         return b.build(b.reduce_mean(b.matmul(h, b.parameter("w2", {64, 8}))));
       }},
      {"a large weight: 8 rows through 256 x 256",
       [](int) {
         graph_builder b;
         const value x = b.input("x", {8, 256});
         return b.build(b.reduce_mean(b.relu(b.matmul(x, b.parameter("w", {256, 256})))));
       }},
      {"a diamond: ReLU feeding Exp and Neg, added",
       [](int) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})));
         return b.build(b.reduce_sum(b.add(b.exp(h), b.neg(h))));
       }},
      {"a parameter read by two MatMuls",
       [](int) {
         graph_builder b;
         const value x = b.input("x", {16, 16});
         const value w = b.parameter("w", {16, 16});
         return b.build(b.reduce_mean(b.matmul(b.relu(b.matmul(x, w)), w)));
       }},
      {"softmax cross entropy of a biased MatMul",
       [](int) {
         graph_builder b;
         const value x = b.input("x", {16, 32}), labels = b.input("labels", {16, 8});
         const value logits = b.bias_add(b.matmul(x, b.parameter("w", {32, 8})), b.parameter("b", {8}));
         return b.build(b.reduce_mean(b.softmax_cross_entropy(logits, labels)));
       }},
      {"configured: the first MatMul ((1, n), (n, 1))",
       [](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})).shard({{1, n}, {n, 1}}));
         return b.build(b.reduce_mean(b.matmul(h, b.parameter("w2", {16, 16}))));
       }},
  };
}

// Whether `st` is one of the operator's strategies on n devices that passes every check.
bool valid(const traced_graph& g, int id, const strategy& st, int n) {
  const node& nd = g.at(id);
  const shape_list shapes = g.input_shapes(id);
  if (!nd.op->check(st, n, shapes).ok()) return false;
  const op_layouts l = nd.op->layouts(st, n, shapes);
  for (int i = 0; i < shapes.n; ++i)
    if (!check(l.in[i], shapes[i]).ok()) return false;
  return check(l.out, nd.shape).ok();
}

// The recursive_input of an unconfigured graph, its data inputs split by the batch.
recursive_input input_of(const traced_graph& g, int n) {
  recursive_input in;
  in.g = &g;
  in.device_num = n;
  in.input_layout.resize(std::size_t(g.size()));
  in.fixed.resize(std::size_t(g.size()));
  in.fixed_strategy.resize(std::size_t(g.size()));
  in.needs_grad.assign(std::size_t(g.size()), false);
  // needs_grad: depends on a parameter and receives a gradient from the loss.
  std::vector<bool> dep(std::size_t(g.size()), false), rec(std::size_t(g.size()), false);
  for (int id = 0; id < g.size(); ++id) {
    const node& nd = g.at(id);
    dep[id] = nd.kind == node_kind::parameter;
    if (nd.kind == node_kind::op)
      for (std::size_t s = 0; s < nd.inputs.size(); ++s) dep[id] = dep[id] || (dep[nd.inputs[s]] && nd.op->differentiable(int(s)));
    if (nd.kind == node_kind::input) {
      layout l = layout::replicated(mesh{n}, nd.shape.ndim);
      l.split[0] = axis_list{0};
      in.input_layout[id] = l;
    }
  }
  rec[g.loss()] = true;
  for (int id = g.size() - 1; id >= 0; --id)
    if (g.at(id).kind == node_kind::op && rec[id] && dep[id])
      for (std::size_t s = 0; s < g.at(id).inputs.size(); ++s)
        if (g.at(id).op->differentiable(int(s))) rec[g.at(id).inputs[s]] = true;
  for (int id = 0; id < g.size(); ++id) in.needs_grad[id] = dep[id] && rec[id];
  return in;
}

// The symbolic price of a whole assignment (graph/recursive.hpp's, written again):
// each operator's collectives and work, every edge's routes forward and back, each
// parameter gradient's reduction, the loss's fetch; a parameter laid out two ways is
// infinite.
double symbolic_price(const recursive_input& in, const std::vector<strategy>& st) {
  const traced_graph& g = *in.g;
  const int n = in.device_num;
  std::vector<op_layouts> lay(std::size_t(g.size()));
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op) lay[id] = g.at(id).op->layouts(st[id], n, g.input_shapes(id));
  double t = 0;
  for (int c = 0; c < g.size(); ++c) {
    const node& nd = g.at(c);
    if (nd.kind != node_kind::op) continue;
    const bool back = in.needs_grad[c];
    t += (back ? 3.0 : 1.0) * nd.op->forward_work(lay[c], g.input_shapes(c), nd.shape) / in.flops_per_byte;
    for (const internal_collective& ic : nd.op->collectives(st[c], n, g.input_shapes(c), 4))
      if (!ic.backward || back) t += double(ic.bytes);
    for (std::size_t s = 0; s < nd.inputs.size(); ++s) {
      const int p = nd.inputs[s];
      const node& pn = g.at(p);
      const bool grad = in.needs_grad[p] && nd.op->differentiable(int(s));
      if (pn.kind == node_kind::input) {
        t += symbolic_bytes(in.input_layout[p], lay[c].in[s], pn.shape, 4);
      } else if (pn.kind == node_kind::parameter) {
        const auto [c0, s0] = g.consumers(p).front();
        if (!same_placement(lay[c0].in[s0], lay[c].in[s])) return 1e300;
        if (grad) t += symbolic_bytes(lay[c].in_grad[s], lay[c].in[s], pn.shape, 4);
      } else if (pn.kind == node_kind::op) {
        t += symbolic_bytes(lay[p].out, lay[c].in[s], pn.shape, 4);
        if (grad) t += symbolic_bytes(lay[c].in_grad[s], lay[p].out_grad, pn.shape, 4);
      }
    }
  }
  const layout& loss = lay[g.loss()].out;
  return t + symbolic_bytes(loss, layout::replicated(loss.dev, 0), extents{}, 4);
}

}  // namespace

TEST_CASE("recursive_programming: against every assignment under its symbolic price") {
  // The search is a heuristic (each operator cut once a round, in order of weight, the
  // cheapest given its neighbours as they stand): its price is that of its assignment,
  // at least the minimum, and on these graphs within 15 % of it. The ratios are
  // printed; the worst, 1.13 on the diamond on 2 devices, cuts the MatMul's columns
  // first, which looks cheaper while its neighbours are still whole.
  for (int n : {2, 4}) {
    for (const case_graph& cg : graphs()) {
      if (cg.name.rfind("configured", 0) == 0) continue;
      CAPTURE(n);
      CAPTURE(cg.name);
      const traced_graph g = cg.make(n);
      const recursive_input in = input_of(g, n);
      const recursive_result r = recursive_programming(in);
      CHECK(r.rounds == (n == 2 ? 1 : 2));
      std::vector<int> ops;
      std::vector<std::vector<strategy>> options(std::size_t(g.size()));
      std::vector<strategy> chosen(std::size_t(g.size()));
      for (int id = 0; id < g.size(); ++id) {
        if (g.at(id).kind != node_kind::op) continue;
        ops.push_back(id);
        REQUIRE(r.choice[id]);
        chosen[id] = r.choice[id]->st;
        CHECK(valid(g, id, chosen[id], n));
        for (const strategy& s : g.at(id).op->candidates(n, g.input_shapes(id)))
          if (valid(g, id, s, n)) options[id].push_back(s);
      }
      CHECK(symbolic_price(in, chosen) == doctest::Approx(r.symbolic_cost));
      std::vector<std::size_t> pick(std::size_t(g.size()), 0);
      std::vector<strategy> cur(std::size_t(g.size()));
      double best = 1e300;
      while (true) {
        for (int id : ops) cur[id] = options[id][pick[id]];
        best = std::min(best, symbolic_price(in, cur));
        std::size_t i = 0;
        while (i < ops.size() && ++pick[ops[i]] == options[ops[i]].size()) pick[ops[i++]] = 0;
        if (i == ops.size()) break;
      }
      std::printf("recursive_programming, %s, %d devices: %.4f of the brute-force minimum\n", cg.name.c_str(), n,
                  r.symbolic_cost / best);
      CHECK(r.symbolic_cost >= best * (1 - 1e-12));
      CHECK(r.symbolic_cost <= 1.15 * best);
    }
  }
}

TEST_CASE("recursive_programming: the worked example of graph/recursive.hpp") {
  graph_builder b;
  const value x = b.input("x", {64, 1024});
  const value m1 = b.matmul(x, b.parameter("w1", {1024, 4096}));
  const value relu = b.relu(m1);
  const value m2 = b.matmul(relu, b.parameter("w2", {4096, 16}));
  const value loss = b.reduce_mean(m2);
  const traced_graph g = b.build(loss);
  {
    const parallel_graph pg = parallelize(g, recursive(2));  // round 1
    CHECK(pg.op(m1.id()).st == strategy{{1, 1}, {1, 2}});
    CHECK(pg.op(relu.id()).st == strategy{{1, 2}});
    CHECK(pg.op(m2.id()).st == strategy{{1, 2}, {2, 1}});
    CHECK(pg.op(loss.id()).st == strategy{{2, 1}});
  }
  const parallel_graph pg = parallelize(g, recursive(4));  // round 2 doubles the cuts
  CHECK(pg.op(m1.id()).st == strategy{{1, 1}, {1, 4}});
  CHECK(pg.op(relu.id()).st == strategy{{1, 4}});
  CHECK(pg.op(m2.id()).st == strategy{{1, 4}, {4, 1}});
  CHECK(pg.op(loss.id()).st == strategy{{4, 1}});
  for (int id : {m1.id(), relu.id(), m2.id(), loss.id()}) CHECK(pg.op(id).source == strategy_source::recursive_programming);
  // Within 1 % of dynamic programming's cost here.
  parallel_config dp = recursive(4);
  dp.search = search_mode::dynamic_programming;
  CHECK(pg.step_cost() <= 1.01 * parallelize(g, dp).step_cost());
}

TEST_CASE("recursive_programming: every strategy valid on 1 to 8 devices; configured operators keep theirs") {
  for (int n : {1, 2, 4, 8}) {
    for (const case_graph& cg : graphs()) {
      CAPTURE(n);
      CAPTURE(cg.name);
      const traced_graph g = cg.make(n);
      const parallel_graph pg = parallelize(g, recursive(n));
      for (int id = 0; id < g.size(); ++id) {
        if (g.at(id).kind != node_kind::op) continue;
        const op_plan& o = pg.op(id);
        CHECK(valid(g, id, o.st, n));
        if (g.at(id).user_strategy) {
          CHECK(o.st == *g.at(id).user_strategy);
          CHECK(o.source == strategy_source::user);
        } else {
          CHECK(o.source == strategy_source::recursive_programming);
        }
        if (n == 1) CHECK(o.st == g.at(id).op->data_parallel(1, g.input_shapes(id)));
      }
      CHECK(pg.priced_bytes() < infinite_bytes);
    }
  }
}

TEST_CASE("recursive_programming: a transformer layer on 1024 devices, every operator cut ten times") {
  const index_t batch = 64, seq = 128, hidden = 1024;
  graph_builder b;
  const value x = b.input("x", {batch * seq, hidden});
  auto param = [&](const char* name, const extents& e) { return b.parameter(name, e); };
  const value q = b.reshape(b.matmul(x, param("wq", {hidden, hidden})), {batch, seq, hidden});
  const value k = b.reshape(b.matmul(x, param("wk", {hidden, hidden})), {batch, seq, hidden});
  const value v = b.reshape(b.matmul(x, param("wv", {hidden, hidden})), {batch, seq, hidden});
  const value ctx = b.reshape(b.batch_matmul(b.softmax(b.batch_matmul(q, k, false, true)), v), {batch * seq, hidden});
  const value h = b.add(x, b.matmul(ctx, param("wo", {hidden, hidden})));
  const value f = b.matmul(b.relu(b.matmul(h, param("w1", {hidden, 4 * hidden}))), param("w2", {4 * hidden, hidden}));
  const traced_graph g = b.build(b.reduce_mean(b.add(h, f)));
  const parallel_graph pg = parallelize(g, recursive(1024));
  for (int id = 0; id < g.size(); ++id) {
    if (g.at(id).kind != node_kind::op) continue;
    CAPTURE(g.describe(id));
    CHECK(valid(g, id, pg.op(id).st, 1024));
  }
  CHECK(pg.priced_bytes() < infinite_bytes);
  // The batch of 64 cannot be split 1024 ways: data parallel is no choice here.
  parallel_config data = recursive(1024);
  data.mode = parallel_mode::data_parallel;
  CHECK_THROWS_AS(parallelize(g, data), error);
}

TEST_CASE("sharding propagation beyond exact_pricing_limit: propagated under the symbolic price") {
  // The configured graph on 2 to 8 devices, propagated exactly and symbolically: every
  // operator reached, every strategy valid, the step's exact price at most twice the
  // exact search's minimum (the ratios are printed: 2.0 here, where ReLU, decided before
  // the MatMul it feeds, takes the partial sums split (a tie with taking them whole),
  // and that MatMul then cuts its inner dim before the mean that would all-reduce its
  // output is decided: greedy propagation's myopia, the price of its scale).
  for (int n : {2, 4, 8}) {
    const case_graph& cg = graphs().back();
    CAPTURE(n);
    const traced_graph g = cg.make(n);
    parallel_config cfg = recursive(n);
    cfg.search = search_mode::sharding_propagation;
    const parallel_graph exact = parallelize(g, cfg);
    cfg.exact_pricing_limit = 0;
    const parallel_graph symbolic = parallelize(g, cfg);
    for (int id = 0; id < g.size(); ++id) {
      if (g.at(id).kind != node_kind::op) continue;
      CHECK(valid(g, id, symbolic.op(id).st, n));
      CHECK(symbolic.op(id).source ==
            (g.at(id).user_strategy ? strategy_source::user : strategy_source::sharding_propagation));
    }
    std::printf("symbolic sharding propagation, %d devices: %.4f of the exact search's bytes\n", n,
                double(symbolic.priced_bytes()) / double(exact.priced_bytes()));
    CHECK(double(symbolic.priced_bytes()) <= 2.0 * double(exact.priced_bytes()));
  }
  // Unconfigured graphs: nothing to propagate from, data parallel (as the exact search).
  const traced_graph g = graphs().front().make(4);
  parallel_config cfg = recursive(4);
  cfg.search = search_mode::sharding_propagation;
  cfg.exact_pricing_limit = 0;
  const parallel_graph pg = parallelize(g, cfg);
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op) CHECK(pg.op(id).source == strategy_source::data_parallel);
  // A transformer layer on 1024 devices, its first MatMul configured: far beyond the
  // limit, propagated in a fraction of a second; every strategy valid.
  const index_t batch = 64, seq = 128, hidden = 1024;
  graph_builder b;
  const value x = b.input("x", {batch * seq, hidden});
  const value q = b.reshape(b.matmul(x, b.parameter("wq", {hidden, hidden})).shard({{1024, 1}, {1, 1}}), {batch, seq, hidden});
  const value k = b.reshape(b.matmul(x, b.parameter("wk", {hidden, hidden})), {batch, seq, hidden});
  const value s = b.softmax(b.batch_matmul(q, k, false, true));
  const traced_graph big = b.build(b.reduce_mean(b.relu(s)));
  cfg = recursive(1024);
  cfg.search = search_mode::sharding_propagation;
  const parallel_graph bp = parallelize(big, cfg);
  for (int id = 0; id < big.size(); ++id) {
    if (big.at(id).kind != node_kind::op) continue;
    CAPTURE(big.describe(id));
    CHECK(valid(big, id, bp.op(id).st, 1024));
    if (!big.at(id).user_strategy) CHECK(bp.op(id).source == strategy_source::sharding_propagation);
  }
}

TEST_CASE("recursive_programming: errors") {
  const traced_graph g = graphs().front().make(6);
  CHECK(error_of([&] { parallelize(g, recursive(6)); }) ==
        "parallelize: search recursive_programming needs a device count that is a power of two, got 6");
  CHECK(parse_search_mode("recursive_programming") == search_mode::recursive_programming);
  CHECK(parse_search_mode("dynamic_programming") == search_mode::dynamic_programming);
  CHECK(parse_search_mode("sharding_propagation") == search_mode::sharding_propagation);
  CHECK(error_of([] { parse_search_mode("rec"); }) ==
        "search_mode: 'rec' is not sharding_propagation, dynamic_programming or recursive_programming");
}
}  // namespace graph_test_recursive
