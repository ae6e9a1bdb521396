// Sharding propagation: the routes between layouts of different device matrices, the
// min-sum solver against enumeration on random problems, and, on small graphs of 3 to
// 6 operators, the strategies sharding propagation picks against the minimum over
// every assignment of candidate strategies, priced here from the operators' rules and
// the planner; the same for the dynamic_programming search, whose price adds each
// operator's work; and what that search picks for large batches and for large weights.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>
#include <tessera/graph/parallel.hpp>
#include "brute_force.hpp"

namespace graph_test_propagate {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::graph;
using namespace tessera::graph::testing;

TEST_CASE("plan_route: on the common refinement of two device matrices") {
  // The seed's MatMul output to ReLU (2, 4): one ReduceScatter over the 4 ranks of a row.
  const layout c = layout(mesh{2, 4, 1}, {{0}, {2}}).with_partial(1);
  const layout r = layout(mesh{2, 4}, {{0}, {1}});
  const route rt = plan_route(c, r, extents{16, 16}, 4);
  CHECK(rt.feasible);
  CHECK(rt.fine == mesh{2, 4});
  REQUIRE(rt.p.size() == 1);
  CHECK(rt.p[0].kind == step_kind::reduce_scatter);
  CHECK(rt.p[0].axis == 1);
  CHECK(rt.bytes() == 384);
  CHECK(rt.from == c);
  CHECK(rt.to == r);
  // Same device matrix: planned there.
  const layout rows(mesh{8}, {{0}, {}});
  CHECK(plan_route(rows, layout::replicated(mesh{8}, 2), extents{16, 4}, 4).bytes() == 7 * 32);
  CHECK(plan_route(rows, rows, extents{16, 4}, 4).empty());
  // Rows over 8 ranks written on (8,) and on (2, 4): the same shards, nothing to move.
  CHECK(plan_route(rows, layout(mesh{2, 4}, {{0, 1}, {}}), extents{16, 4}, 4).empty());
  // (2, 3) and (3, 2) cut 6 ranks incompatibly.
  const route bad = plan_route(layout(mesh{2, 3}, {{0}, {1}}), layout(mesh{3, 2}, {{0}, {1}}), extents{6, 6}, 4);
  CHECK(!bad.feasible);
  CHECK(bad.bytes() == infinite_bytes);
}

// ---- the solver --------------------------------------------------------------------

namespace {

index_t brute_force(const search_problem& pb, std::vector<int>& best_pick) {
  const std::size_t n = pb.choices.size();
  std::vector<int> cur(n, 0);
  index_t best = infinite_bytes + 1;
  while (true) {
    const index_t t = pb.total(cur);
    if (t < best) {
      best = t;
      best_pick = cur;
    }
    std::size_t i = 0;
    while (i < n && ++cur[i] == pb.choices[i]) cur[i++] = 0;
    if (i == n) break;
  }
  return best;
}

// A random problem on `n` variables whose links are `edges`, every variable anchored.
search_problem random_problem(std::mt19937& gen, int n, const std::vector<std::pair<int, int>>& edges) {
  std::uniform_int_distribution<int> choices(1, 4), cost(0, 9), rare(0, 9);
  search_problem pb;
  for (int v = 0; v < n; ++v) pb.choices.push_back(choices(gen));
  for (int v = 0; v < n; ++v) {
    pb.unary.emplace_back();
    for (int s = 0; s < pb.choices[v]; ++s) pb.unary.back().push_back(rare(gen) == 0 ? infinite_bytes : cost(gen));
  }
  pb.anchored.assign(std::size_t(n), true);
  for (auto [u, v] : edges)
    for (int a = 0; a < pb.choices[u]; ++a)
      for (int b = 0; b < pb.choices[v]; ++b) pb.add_pair(u, a, v, b, rare(gen) == 0 ? infinite_bytes : cost(gen));
  return pb;
}

}  // namespace

TEST_CASE("solve: dynamic programming on trees and enumeration otherwise find the minimum") {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + trial % 6;
    std::vector<std::pair<int, int>> edges;
    for (int v = 1; v < n; ++v) edges.emplace_back(int(gen() % unsigned(v)), v);  // a random tree
    const bool cyclic = trial % 3 == 0 && n >= 3;
    if (cyclic) edges.emplace_back(0, n - 1 == edges.back().first ? 1 : n - 1);
    search_problem pb = random_problem(gen, n, edges);
    std::vector<int> best_pick;
    const index_t best = brute_force(pb, best_pick);
    const search_result r = solve(pb);
    CAPTURE(trial);
    CHECK(pb.total(r.pick) == best);
    const bool tree = pb.pairs.size() + 1 == std::size_t(n);
    CHECK(r.method[0] == (tree ? search_method::dynamic_programming : search_method::enumeration));
    // Past the enumeration limit a cyclic component is solved greedily: a valid pick.
    if (!tree) {
      const search_result g = solve(pb, 1);
      CHECK(g.method[0] == search_method::greedy);
      for (int v = 0; v < n; ++v) CHECK((g.pick[v] >= 0 && g.pick[v] < pb.choices[v]));
      CHECK(pb.total(g.pick) >= best);
    }
  }
}

TEST_CASE("solve: components apart; an unanchored one is left to the caller") {
  search_problem pb;
  pb.choices = {2, 2, 3};
  pb.unary = {{5, 1}, {0, 0}, {4, 2, 2}};
  pb.anchored = {true, false, false};
  pb.add_pair(0, 1, 1, 0, 10);  // 0 and 1 linked; 2 alone and unanchored
  const search_result r = solve(pb);
  CHECK(r.pick[0] == 1);
  CHECK(r.pick[1] == 1);  // 0 + 0 with 0's choice 1, not 10
  CHECK(r.pick[2] == -1);
  CHECK(r.method[2] == search_method::unanchored);
  // Ties go to the first candidate.
  search_problem tie;
  tie.choices = {3};
  tie.unary = {{2, 1, 1}};
  tie.anchored = {true};
  CHECK(solve(tie).pick[0] == 1);
}

// ---- sharding propagation against every assignment ----------------------------------

namespace {

struct case_graph {
  std::string name;
  std::function<traced_graph(int)> make;  // for n devices
};

std::vector<case_graph> graphs() {
  auto mm_strategy = [](int n) {
    const int a = n % 2 == 0 ? 2 : 1, k = n / a;
    return strategy{{a, k}, {k, 1}};
  };
  return {
      {"chain: MatMul, ReLU, MatMul, ReduceMean",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})).shard(mm_strategy(n)));
         return b.build(b.reduce_mean(b.matmul(h, b.parameter("w2", {16, 16}))));
       }},
      {"the quickstart's network and MSE loss",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32}), label = b.input("label", {16, 16});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})).shard(mm_strategy(n)));
         return b.build(b.mse_loss(b.matmul(h, b.parameter("w2", {16, 16})), label));
       }},
      {"a diamond: ReLU feeding Exp and Neg, added",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})).shard(mm_strategy(n)));
         return b.build(b.reduce_sum(b.add(b.exp(h), b.neg(h))));
       }},
      {"a parameter read by two MatMuls",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 16});
         const value w = b.parameter("w", {16, 16});
         const value h = b.relu(b.matmul(x, w).shard(mm_strategy(n)));
         return b.build(b.reduce_mean(b.matmul(h, w)));
       }},
      {"two configured MatMuls and a BiasAdd",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})).shard(mm_strategy(n)));
         const value y = b.matmul(h, b.parameter("w2", {16, 8})).shard({{n, 1}, {1, 1}});
         return b.build(b.reduce_mean(b.bias_add(y, b.parameter("b", {8}))));
       }},
      {"a configured BatchMatMul, Transpose, Softmax",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {8, 4, 4});
         const value w = b.parameter("w", {4, 4});
         const int a = n % 2 == 0 ? 2 : 1, k = n / a;
         const value y = b.batch_matmul(x, w).shard({{a, 1, k}, {k, 1}});
         return b.build(b.reduce_mean(b.softmax(b.transpose(y, {0, 2, 1}))));
       }},
      {"partial sums through Neg, Transpose and a MatMul, resolved at ReLU",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const value c = b.matmul(x, b.parameter("w", {32, 16})).shard({{1, n}, {n, 1}});
         const value h = b.matmul(b.transpose(b.neg(c), {1, 0}), b.parameter("w2", {16, 16}));
         return b.build(b.reduce_mean(b.relu(h).shard({{n, 1}})));
       }},
      {"partial sums through Add and ReduceSum into the loss",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32});
         const int a = n >= 4 ? 2 : 1, k = n / a;
         const value c1 = b.matmul(x, b.parameter("w", {32, 8})).shard({{a, k}, {k, 1}});
         const value c2 = b.matmul(x, b.parameter("w2", {32, 8})).shard({{a, k}, {k, 1}});
         return b.build(b.reduce_sum(b.add(c1, c2)));
       }},
      {"softmax cross entropy of a biased MatMul",
       [=](int n) {
         graph_builder b;
         const value x = b.input("x", {16, 32}), labels = b.input("labels", {16, 8});
         const value logits = b.bias_add(b.matmul(x, b.parameter("w", {32, 8})).shard({{1, n}, {n, 1}}),
                                         b.parameter("b", {8}));
         return b.build(b.reduce_mean(b.softmax_cross_entropy(logits, labels)));
       }},
  };
}

}  // namespace

TEST_CASE("sharding propagation: the least total price over every assignment of candidates") {
  for (int n : {2, 4, 8}) {
    for (const case_graph& cg : graphs()) {
      CAPTURE(n);
      CAPTURE(cg.name);
      const traced_graph g = cg.make(n);
      parallel_config cfg;
      cfg.mode = parallel_mode::auto_parallel;
      cfg.device_num = n;
      const parallel_graph pg = parallelize(g, cfg);
      std::vector<op_plan> chosen(std::size_t(g.size()));
      for (int id = 0; id < g.size(); ++id)
        if (g.at(id).kind == node_kind::op) {
          chosen[id] = pg.op(id);
          CHECK(pg.op(id).source == (g.at(id).user_strategy ? strategy_source::user : strategy_source::sharding_propagation));
        }
      const brute_result r = brute_force_price(g, n, chosen);
      CHECK(r.best < infinite_bytes);
      CHECK(r.of_choice == r.best);
      CHECK(pg.priced_bytes() == r.best);
      // Deterministic: the same graph gives the same strategies.
      const parallel_graph again = parallelize(cg.make(n), cfg);
      for (int id = 0; id < g.size(); ++id)
        if (g.at(id).kind == node_kind::op) CHECK(again.op(id).st == pg.op(id).st);
    }
  }
}

TEST_CASE("dynamic_programming: the least bytes and work over every assignment, no configured operator needed") {
  // The graphs above, and two with no configured operator (small enough to enumerate).
  std::vector<case_graph> cases = graphs();
  cases.push_back({"unconfigured: MatMul, ReLU, MatMul, ReduceMean", [](int) {
                     graph_builder b;
                     const value x = b.input("x", {16, 32});
                     const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})));
                     return b.build(b.reduce_mean(b.matmul(h, b.parameter("w2", {16, 8}))));
                   }});
  cases.push_back({"unconfigured: softmax cross entropy of a biased MatMul", [](int) {
                     graph_builder b;
                     const value x = b.input("x", {16, 32}), labels = b.input("labels", {16, 8});
                     const value logits = b.bias_add(b.matmul(x, b.parameter("w", {32, 8})), b.parameter("b", {8}));
                     return b.build(b.reduce_mean(b.softmax_cross_entropy(logits, labels)));
                   }});
  for (const double fpb : {0.05, 10.0}) {  // compute dear, compute cheap
    for (int n : {2, 4}) {
      for (const case_graph& cg : cases) {
        CAPTURE(fpb);
        CAPTURE(n);
        CAPTURE(cg.name);
        const traced_graph g = cg.make(n);
        parallel_config cfg;
        cfg.mode = parallel_mode::auto_parallel;
        cfg.search = search_mode::dynamic_programming;
        cfg.device_num = n;
        cfg.flops_per_byte = fpb;
        const parallel_graph pg = parallelize(g, cfg);
        std::vector<op_plan> chosen(std::size_t(g.size()));
        double work = 0;
        for (int id = 0; id < g.size(); ++id)
          if (g.at(id).kind == node_kind::op) {
            chosen[id] = pg.op(id);
            CHECK(pg.op(id).source ==
                  (g.at(id).user_strategy ? strategy_source::user : strategy_source::dynamic_programming));
            work += (pg.needs_grad(id) ? 3.0 : 1.0) *
                    g.at(id).op->forward_work(pg.op(id).lay, g.input_shapes(id), g.at(id).shape);
          }
        const brute_result r = brute_force_price(g, n, chosen, fpb);
        CHECK(r.best < infinite_bytes);
        CHECK(r.of_choice == r.best);
        CHECK(pg.work_per_rank() == doctest::Approx(work));
        CHECK(pg.step_cost() == doctest::Approx(double(pg.priced_bytes()) + work / fpb));
      }
    }
  }
}

TEST_CASE("dynamic_programming: a large batch runs data parallel, a large weight is split") {
  parallel_config cfg;
  cfg.mode = parallel_mode::auto_parallel;
  cfg.search = search_mode::dynamic_programming;
  cfg.device_num = 4;
  {
    // 4096 samples through a 64 x 64 weight: splitting the batch moves only the weight's
    // gradient (16 KiB); any other split moves activations of 4096 rows.
    graph_builder b;
    const value x = b.input("x", {4096, 64});
    const value mm = b.matmul(x, b.parameter("w", {64, 64}));
    const traced_graph g = b.build(b.reduce_mean(b.relu(mm)));
    const parallel_graph pg = parallelize(g, cfg);
    CHECK(pg.op(mm.id()).st == strategy{{4, 1}, {1, 1}});
    CHECK(pg.op(mm.id()).source == strategy_source::dynamic_programming);
  }
  {
    // 4 samples through a 2048 x 2048 weight: data parallel would all-reduce its 16 MiB
    // gradient; the search splits the weight instead, and each rank multiplies a
    // quarter of it.
    graph_builder b;
    const value x = b.input("x", {4, 2048});
    const value mm = b.matmul(x, b.parameter("w", {2048, 2048}));
    const traced_graph g = b.build(b.reduce_mean(b.relu(mm)));
    const parallel_graph pg = parallelize(g, cfg);
    const strategy& st = pg.op(mm.id()).st;
    CHECK(st.in[1].v[0] * st.in[1].v[1] == 4);  // the weight in 4 pieces
    parallel_config dp = cfg;
    dp.mode = parallel_mode::data_parallel;
    const parallel_graph data = parallelize(g, dp);
    CHECK(pg.step_cost() < data.step_cost());
    CHECK(pg.work_per_rank() == doctest::Approx(data.work_per_rank()).epsilon(0.01));  // the same split of the work
  }
  // Sharding propagation leaves a graph without a configured operator data parallel.
  graph_builder b;
  const value x = b.input("x", {4, 2048});
  const value mm = b.matmul(x, b.parameter("w", {2048, 2048}));
  const traced_graph g = b.build(b.reduce_mean(b.relu(mm)));
  cfg.search = search_mode::sharding_propagation;
  CHECK(parallelize(g, cfg).op(mm.id()).source == strategy_source::data_parallel);
  cfg.flops_per_byte = 0;
  CHECK_THROWS_WITH(parallelize(g, cfg), "parallelize: flops_per_byte must be positive, got 0.000000");
}

TEST_CASE("sharding propagation on the quickstart: the first MatMul's output reduce-scattered over ranks 0-3") {
  graph_builder b;
  const value x = b.input("input", {16, 32}), label = b.input("label", {16, 16});
  const value mm = b.matmul(x, b.parameter("w", {32, 16})).shard({{2, 4}, {4, 1}});
  const value r = b.relu(mm);
  const value mm2 = b.matmul(r, b.parameter("w2", {16, 16}));
  const traced_graph g = b.build(b.mse_loss(mm2, label));
  parallel_config cfg;
  cfg.mode = parallel_mode::auto_parallel;
  cfg.device_num = 8;
  const parallel_graph pg = parallelize(g, cfg);
  CHECK(pg.op(r.id()).st == strategy{{2, 4}});  // the seed's ReLU strategy
  const edge_plan& e = pg.edge(r.id(), 0);
  REQUIRE(e.forward.p.size() == 1);
  CHECK(e.forward.p[0].kind == step_kind::reduce_scatter);
  CHECK(e.forward.bytes() == 384);  // 3/4 of rank 0's (8, 16) partial sums; AllReduce: 768
  CHECK(pg.local_shape(mm.id()) == extents{8, 16});
  // The seed's own choice for MatMul2, ((2, 4), (4, 1)), is priced higher: propagation
  // found ((2, 2), (2, 2)).
  CHECK(pg.op(mm2.id()).st == strategy{{2, 2}, {2, 2}});
  graph_builder s;
  const value sx = s.input("input", {16, 32}), sl = s.input("label", {16, 16});
  const value sr = s.relu(s.matmul(sx, s.parameter("w", {32, 16})).shard({{2, 4}, {4, 1}})).shard({{2, 4}});
  const value smm2 = s.matmul(sr, s.parameter("w2", {16, 16})).shard({{2, 4}, {4, 1}});
  cfg.mode = parallel_mode::semi_auto_parallel;  // the loss operators data parallel
  const parallel_graph seed = parallelize(s.build(s.mse_loss(smm2, sl)), cfg);
  CHECK(seed.priced_bytes() > pg.priced_bytes());
}

TEST_CASE("sharding propagation: operators no configured one reaches are data parallel") {
  graph_builder b;
  const value x = b.input("x", {16, 8});
  const traced_graph g = b.build(b.reduce_mean(b.relu(b.matmul(x, b.parameter("w", {8, 8})))));
  parallel_config cfg;
  cfg.mode = parallel_mode::auto_parallel;
  cfg.device_num = 4;
  const parallel_graph pg = parallelize(g, cfg);
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op) {
      CHECK(pg.op(id).source == strategy_source::data_parallel);
      CHECK(pg.op(id).st == g.at(id).op->data_parallel(4, g.input_shapes(id)));
    }
}

TEST_CASE("partial variants: the layouts an operator's rule gives for inputs arriving as the variant takes them") {
  // What the operators of ops/ decide at run time from their inputs' layouts
  // (pass_layouts) is the variant the parallel pass chose.
  for (int n : {2, 4, 8}) {
    CAPTURE(n);
    graph_builder b;
    const value x = b.input("x", {16, 32});
    const value c = b.matmul(x, b.parameter("w", {32, 16})).shard({{1, n}, {n, 1}});
    const value t = b.transpose(b.neg(c), {1, 0});
    const value h = b.matmul(t, b.parameter("w2", {16, 4}));
    const traced_graph g = b.build(b.reduce_mean(b.relu(h).shard({{n, 1}})));
    parallel_config cfg;
    cfg.mode = parallel_mode::auto_parallel;
    cfg.device_num = n;
    const parallel_graph pg = parallelize(g, cfg);
    int passing = 0;
    for (int id = 0; id < g.size(); ++id) {
      if (g.at(id).kind != node_kind::op) continue;
      const op_plan& o = pg.op(id);
      const op_layouts rule = g.at(id).op->layouts(o.st, n, g.input_shapes(id));
      CHECK(pass_layouts(*g.at(id).op, rule, o.lay.in) == o.lay);
      if (!(o.lay == rule)) ++passing;
    }
    CHECK(passing == 3);  // Neg, Transpose and the second MatMul
    CHECK(pg.value_layout(h.id()).has_partial());
    for (int id = 0; id < g.size(); ++id)
      if (g.at(id).kind == node_kind::op && g.at(id).op->type() == "ReLU") CHECK(!pg.value_layout(id).has_partial());
  }
}
}  // namespace graph_test_propagate
