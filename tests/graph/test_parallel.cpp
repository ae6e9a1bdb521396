// The parallel pass: what each parallel mode makes of a graph (strategies, layouts of
// inputs and parameters, gradient reductions), the data-import modes, and the exact
// text of every configuration error: bad strategies, a parameter laid out two ways,
// dataset strategies that do not fit, operators and flags of another mode; the memory
// each device holds, and the budget every search keeps to.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/graph/parallel.hpp>

namespace graph_test_parallel {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::graph;

namespace {

// The quickstart's network with the seed's MatMul strategy (for 8 devices).
traced_graph quickstart(index_t batch = 16, const strategy& st = strategy{{2, 4}, {4, 1}}) {
  graph_builder b;
  const value x = b.input("x", {batch, 32}), label = b.input("label", {batch, 16});
  const value h = b.relu(b.matmul(x, b.parameter("w", {32, 16})).shard(st));
  return b.build(b.mse_loss(b.matmul(h, b.parameter("w2", {16, 16})), label));
}

parallel_config config(parallel_mode m, int n, dataset_strategy d = dataset_strategy::data_parallel()) {
  parallel_config c;
  c.mode = m;
  c.device_num = n;
  c.dataset = std::move(d);
  return c;
}

}  // namespace

TEST_CASE("stand_alone: every operator whole on every rank, shard() ignored") {
  const traced_graph g = quickstart();
  const parallel_graph pg = parallelize(g, config(parallel_mode::stand_alone, 8));
  for (int id = 0; id < g.size(); ++id) {
    if (g.at(id).kind == node_kind::op) {
      CHECK(pg.op(id).source == strategy_source::stand_alone);
      CHECK(to_split_tuple(pg.op(id).lay.in[0]).product() == 1);
    }
    CHECK(pg.local_shape(id) == g.at(id).shape);
  }
  CHECK(pg.bytes_for_rank(3) == 0);
  CHECK(pg.priced_bytes() == 0);
  CHECK(pg.gradient_reductions().empty());
}

TEST_CASE("data_parallel: the batch split over every rank, parameters replicated, gradients all-reduced") {
  const traced_graph g = quickstart();
  const parallel_graph pg = parallelize(g, config(parallel_mode::data_parallel, 8));
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind == node_kind::op) {
      CHECK(pg.op(id).source == strategy_source::data_parallel);
      CHECK(pg.op(id).st == g.at(id).op->data_parallel(8, g.input_shapes(id)));
    }
  for (int x : g.inputs()) CHECK(pg.local_shape(x)[0] == 2);
  for (int p : g.parameters()) {
    CHECK(same_placement(pg.value_layout(p), layout::replicated(mesh{8}, 2)));
    // The gradient's one redistribution: an AllReduce over all 8 ranks.
    const auto [c, s] = g.consumers(p).front();
    const edge_plan& e = pg.edge(c, s);
    CHECK(e.forward.empty());
    REQUIRE(e.has_backward);
    index_t allreduce = 0;
    for (const plan_step& st : e.backward.p) {
      CHECK(st.kind == step_kind::all_reduce);
      allreduce += st.bytes;
    }
    CHECK(allreduce >= cost::all_reduce(g.at(p).shape.size() * 4, 8));
  }
  // Between operators nothing moves: every edge forward and backward is empty.
  for (const edge_plan& e : pg.edges())
    if (g.at(e.producer).kind != node_kind::parameter) {
      CHECK(e.forward.empty());
      CHECK((!e.has_backward || e.backward.empty()));
    }
}

TEST_CASE("semi_auto_parallel: the user's strategies, data parallel elsewhere") {
  const traced_graph g = quickstart();
  const parallel_graph pg = parallelize(g, config(parallel_mode::semi_auto_parallel, 8));
  const int mm = g.find("matmul"), relu = g.find("relu");
  CHECK(pg.op(mm).st == strategy{{2, 4}, {4, 1}});
  CHECK(pg.op(mm).source == strategy_source::user);
  CHECK(pg.op(relu).st == strategy{{8, 1}});
  CHECK(pg.op(relu).source == strategy_source::data_parallel);
  CHECK(pg.value_layout(g.find("w")) == layout(mesh{2, 4, 1}, {{1}, {2}}));
  CHECK(pg.local_shape(g.find("w")) == extents{8, 16});
  CHECK(pg.local_shape(mm) == extents{8, 16});
  // MatMul's partial sums go to ReLU's rows by a ReduceScatter over ranks {0, 1, 2, 3}.
  const edge_plan& e = pg.edge(relu, 0);
  REQUIRE(e.forward.p.size() == 1);
  CHECK(e.forward.p[0].kind == step_kind::reduce_scatter);
  CHECK(e.forward.bytes() == 384);
}

TEST_CASE("hybrid_parallel: each rank's own tensors; gradients of shared parameters all-reduced") {
  graph_builder b;
  const value x = b.input("x", {16, 8});
  const value w = b.parameter("w", {8, 16}, true);  // this rank's slice
  const value bias = b.parameter("b", {16});
  const value y = b.bias_add(b.all_reduce(b.matmul(x, w)), bias);
  const traced_graph g = b.build(b.reduce_mean(y));
  const parallel_graph pg = parallelize(g, config(parallel_mode::hybrid_parallel, 4));
  for (int id = 0; id < g.size(); ++id) CHECK(pg.local_shape(id) == g.at(id).shape);
  REQUIRE(pg.gradient_reductions().size() == 1);
  CHECK(pg.gradient_reductions()[0].parameter == bias.id());
  CHECK(pg.gradient_reductions()[0].bytes == cost::all_reduce(64, 4));
  const op_plan& ar = pg.op(g.find("all_reduce"));
  REQUIRE(ar.collectives.size() == 2);
  CHECK(ar.collectives[0].bytes == cost::all_reduce(16 * 16 * 4, 4));
  // The AllReduce's forward and backward, and the bias gradient's.
  CHECK(pg.bytes_for_rank(0) == 2 * cost::all_reduce(1024, 4) + cost::all_reduce(64, 4));
}

TEST_CASE("data import: data_parallel, full_batch and per-input strategies") {
  const traced_graph g = quickstart();
  const int x = g.find("x"), label = g.find("label");
  const parallel_graph dp = parallelize(g, config(parallel_mode::auto_parallel, 8));
  CHECK(dp.value_layout(x) == layout(mesh{8}, {{0}, {}}));
  CHECK(dp.local_shape(x) == extents{2, 32});
  const parallel_graph full = parallelize(g, config(parallel_mode::auto_parallel, 8, dataset_strategy::full_batch()));
  CHECK(full.value_layout(x) == layout::replicated(mesh{8}, 2));
  CHECK(full.local_shape(label) == extents{16, 16});
  const parallel_graph cols =
      parallelize(g, config(parallel_mode::semi_auto_parallel, 8, dataset_strategy::parse("((1, 8), (1, 8))")));
  CHECK(cols.value_layout(x) == strategy_layout(split_tuple{1, 8}, 8));
  CHECK(cols.local_shape(x) == extents{16, 4});
  CHECK(cols.local_shape(label) == extents{16, 2});
  const parallel_graph quarter =
      parallelize(g, config(parallel_mode::semi_auto_parallel, 8, dataset_strategy::parse("((4, 1), (2, 2))")));
  CHECK(quarter.value_layout(x).dev == mesh{2, 4, 1});  // a replica axis first
  CHECK(quarter.local_shape(x) == extents{4, 32});
  CHECK(quarter.local_shape(label) == extents{8, 8});
  CHECK(dataset_strategy::parse("full_batch").which() == dataset_strategy::kind::full_batch);
  CHECK(dataset_strategy::parse("data_parallel").to_string() == "data_parallel");
  CHECK(dataset_strategy::per_input({{1, 8}}).to_string() == "((1, 8),)");
}

TEST_CASE("data import: a dataset strategy that does not fit is an error naming the input and the numbers") {
  const traced_graph g = quickstart();
  auto run = [&](const char* ds, parallel_mode m = parallel_mode::semi_auto_parallel, const traced_graph* gg = nullptr) {
    parallelize(gg ? *gg : g, config(m, 8, dataset_strategy::parse(ds)));
  };
  CHECK_THROWS_WITH_AS(run("((1, 8),)"),
                       "parallelize: dataset_strategy ((1, 8),) has 1 split tuples for 2 inputs ('x', 'label')", error);
  CHECK_THROWS_WITH_AS(run("((1, 8, 1), (1, 8))"),
                       "parallelize: dataset_strategy ((1, 8, 1), (1, 8)): input 'x' (16, 32): the input has rank 2, "
                       "its split tuple (1, 8, 1) has 3 entries", error);
  CHECK_THROWS_WITH_AS(run("((1, 16), (1, 8))"),
                       "parallelize: dataset_strategy ((1, 16), (1, 8)): input 'x' (16, 32): strategy: the product of "
                       "an input's splits must divide the device count: input 0: product of splits 16, device count 8",
                       error);
  CHECK_THROWS_WITH_AS(run("((1, 8), (1, 3))"),
                       "parallelize: dataset_strategy ((1, 8), (1, 3)): input 'label' (16, 16): strategy: the product "
                       "of an input's splits must divide the device count: input 1: product of splits 3, device count 8",
                       error);
  const traced_graph odd = quickstart(16);
  graph_builder b;
  const value x = b.input("x", {16, 12});
  const traced_graph narrow = b.build(b.reduce_sum(x));
  CHECK_THROWS_WITH_AS(run("((1, 8),)", parallel_mode::auto_parallel, &narrow),
                       "parallelize: dataset_strategy ((1, 8),): input 'x' (16, 12): layout: a tensor dim must be "
                       "divisible by the product of its splits: dim 1 has extent 12, split into 8 pieces", error);
  const traced_graph twelve = quickstart(12);
  CHECK_THROWS_WITH_AS(parallelize(twelve, config(parallel_mode::data_parallel, 8)),
                       "parallelize: dataset_strategy data_parallel: input 'x' (12, 32): layout: a tensor dim must be "
                       "divisible by the product of its splits: dim 0 has extent 12, split into 8 pieces", error);
  CHECK_THROWS_WITH_AS(parallelize(g, config(parallel_mode::data_parallel, 8, dataset_strategy::full_batch())),
                       "parallelize: dataset_strategy full_batch needs parallel_mode semi_auto_parallel or "
                       "auto_parallel, not data_parallel", error);
  CHECK_THROWS_WITH_AS(run("((1, 8), (1, 8))", parallel_mode::hybrid_parallel),
                       "parallelize: dataset_strategy ((1, 8), (1, 8)) needs parallel_mode semi_auto_parallel or "
                       "auto_parallel, not hybrid_parallel", error);
  CHECK_THROWS_WITH_AS(dataset_strategy::parse("((1, 8), (1, x))"),
                       "parse_strategy: expected a split, found 'x' at character 13 in \"((1, 8), (1, x))\"", error);
  (void)odd;
}

TEST_CASE("a parameter read by several operators must get one layout") {
  graph_builder b;
  const value x = b.input("x", {16, 16});
  const value w = b.parameter("w", {16, 16});
  const value h = b.relu(b.matmul(x, w).shard({{2, 4}, {4, 1}}));
  const value y = b.matmul(h, w).shard({{8, 1}, {1, 1}});
  const traced_graph g = b.build(b.reduce_mean(y));
  const char* conflict =
      "parallelize: parameter 'w' (16, 16) is read by MatMul 'matmul' with strategy ((2, 4), (4, 1)) (user) as "
      "[1, -] on device matrix (2, 4, 1) and by MatMul 'matmul2' with strategy ((8, 1), (1, 1)) (user) as [-, -] on "
      "device matrix (8, 1, 1); the operators sharing a parameter must lay it out alike";
  CHECK_THROWS_WITH_AS(parallelize(g, config(parallel_mode::semi_auto_parallel, 8)), conflict, error);
  CHECK_THROWS_WITH_AS(parallelize(g, config(parallel_mode::auto_parallel, 8)), conflict, error);
  // In auto_parallel an unconfigured reader follows the configured one.
  graph_builder c;
  const value cx = c.input("x", {16, 16});
  const value cw = c.parameter("w", {16, 16});
  const value ch = c.relu(c.matmul(cx, cw).shard({{2, 4}, {4, 1}}));
  const value cy = c.matmul(ch, cw);
  const traced_graph cg = c.build(c.reduce_mean(cy));
  const parallel_graph pg = parallelize(cg, config(parallel_mode::auto_parallel, 8));
  CHECK(same_placement(pg.op(cy.id()).lay.in[1], pg.value_layout(cw.id())));
  CHECK(pg.priced_bytes() < infinite_bytes);
  // Data parallel replicates w for the MatMul but splits it by rows for a Mul.
  graph_builder d;
  const value dx = d.input("x", {16, 16});
  const value dw = d.parameter("w", {16, 16});
  const value product = d.matmul(dx, dw);
  const value square = d.mul(dw, dw);
  const traced_graph dg = d.build(d.reduce_mean(d.add(product, square)));
  CHECK_THROWS_WITH_AS(parallelize(dg, config(parallel_mode::data_parallel, 8)),
                       "parallelize: parameter 'w' (16, 16) is read by MatMul 'matmul' with strategy ((8, 1), (1, 1)) "
                       "(data_parallel) as [-, -] on device matrix (8, 1, 1) and by Mul 'mul' with strategy ((8, 1), "
                       "(8, 1)) (data_parallel) as [0, -] on device matrix (8, 1); the operators sharing a parameter "
                       "must lay it out alike", error);
}

TEST_CASE("strategies the rules reject, and operators or flags of another mode") {
  CHECK_THROWS_WITH_AS(parallelize(quickstart(), config(parallel_mode::semi_auto_parallel, 4)),
                       "parallelize: MatMul 'matmul': strategy: the product of an input's splits must divide the device "
                       "count: input 0: product of splits 8, device count 4; strategy ((2, 4), (4, 1)) on 4 devices "
                       "(user)", error);
  CHECK_THROWS_WITH_AS(parallelize(quickstart(16, {{2, 4}, {2, 1}}), config(parallel_mode::auto_parallel, 8)),
                       "parallelize: MatMul 'matmul': matmul: both inputs must split the contraction dim into the same "
                       "number of pieces: input 0 splits it 4 ways, input 1 2 ways; strategy ((2, 4), (2, 1)) on 8 "
                       "devices (user)", error);
  CHECK_THROWS_WITH_AS(parallelize(quickstart(12, {{1, 4}, {4, 2}}),
                                   config(parallel_mode::semi_auto_parallel, 8, dataset_strategy::full_batch())),
                       "parallelize: ReLU 'relu': input 0 (12, 16): layout: a tensor dim must be divisible by the "
                       "product of its splits: dim 0 has extent 12, split into 8 pieces; strategy ((8, 1),) on 8 "
                       "devices (data_parallel)", error);
  CHECK_THROWS_WITH_AS(parallelize(quickstart(16, {{1, 1}, {1, 3}}),
                                   config(parallel_mode::semi_auto_parallel, 3, dataset_strategy::full_batch())),
                       "parallelize: MatMul 'matmul': input 1 (32, 16): layout: a tensor dim must be divisible by the "
                       "product of its splits: dim 1 has extent 16, split into 3 pieces; strategy ((1, 1), (1, 3)) on "
                       "3 devices (user)", error);
  graph_builder b;
  const value x = b.input("x", {8, 8});
  const value w = b.parameter("w", {8, 8}, true);
  const traced_graph g = b.build(b.reduce_sum(b.all_reduce(b.matmul(x, w))));
  CHECK_THROWS_WITH_AS(parallelize(g, config(parallel_mode::auto_parallel, 2)),
                       "parallelize: parameter 'w' is layer-wise parallel, which only hybrid_parallel supports, not "
                       "auto_parallel", error);
  graph_builder c;
  const value cx = c.input("x", {8, 8});
  const traced_graph cg = c.build(c.reduce_sum(c.all_reduce(c.matmul(cx, c.parameter("w", {8, 8})), mesh{2, 2}, {1})));
  CHECK_THROWS_WITH_AS(parallelize(cg, config(parallel_mode::semi_auto_parallel, 4)),
                       "parallelize: AllReduce 'all_reduce' is a hybrid_parallel operator; in semi_auto_parallel the "
                       "parallel pass places communication itself", error);
  CHECK_THROWS_WITH_AS(parallelize(cg, config(parallel_mode::hybrid_parallel, 8)),
                       "parallelize: AllReduce 'all_reduce': group mesh (2, 2): mesh: the mesh size must equal the "
                       "number of ranks: mesh size 4, communicator size 8", error);
  CHECK_NOTHROW(parallelize(cg, config(parallel_mode::hybrid_parallel, 4)));
  CHECK_THROWS_WITH_AS(parallelize(cg, config(parallel_mode::hybrid_parallel, 0)),
                       "parallelize: device_num must be positive, got 0", error);
  CHECK_THROWS_WITH_AS(parallelize(traced_graph(), config(parallel_mode::stand_alone, 1)),
                       "parallelize: the graph has no loss (build it with graph_builder::build)", error);
}

TEST_CASE("bytes_for_rank: every edge, collective and the loss, as planned") {
  const traced_graph g = quickstart();
  const parallel_graph pg = parallelize(g, config(parallel_mode::auto_parallel, 8));
  index_t sum = pg.loss_fetch().p.bytes_for_rank(0);
  for (const edge_plan& e : pg.edges()) sum += e.forward.bytes() + (e.has_backward ? e.backward.bytes() : 0);
  CHECK(pg.bytes_for_rank(0) == sum);
  CHECK(pg.priced_bytes() == sum);  // the loss's fetch is priced too
  // Values that need no gradient: the inputs; every other node of this graph does.
  for (int id = 0; id < g.size(); ++id) CHECK(pg.needs_grad(id) == (g.at(id).kind != node_kind::input));
}

// ---- memory --------------------------------------------------------------------------

namespace {

// 512 samples through two weights of 1 MiB: data parallel keeps both whole on every
// device, with their gradients and Momentum's state.
traced_graph two_weights() {
  graph_builder b;
  const value x = b.input("x", {512, 256});
  const value h = b.relu(b.matmul(x, b.parameter("w1", {256, 1024})));
  return b.build(b.reduce_mean(b.matmul(h, b.parameter("w2", {1024, 256}))));
}

}  // namespace

TEST_CASE("memory_per_device: inputs, outputs and parameters with gradients and optimizer state") {
  const traced_graph g = two_weights();
  parallel_config cfg = config(parallel_mode::data_parallel, 4);
  const parallel_graph pg = parallelize(g, cfg);
  // x 128 x 256, the MatMul outputs 128 x 1024 and 128 x 256, ReLU 128 x 1024, the
  // loss a scalar; w1 and w2 of 256 x 1024 each, three times (value, gradient, moments).
  const index_t expect = 4 * (128 * 256 + 128 * 1024 + 128 * 1024 + 128 * 256 + 1) + 3 * 4 * (2 * 256 * 1024);
  CHECK(pg.memory_per_device() == expect);
  const auto consumers = pg.memory_consumers();
  REQUIRE(consumers.size() == 5);  // x, the two MatMuls (with their weights), ReLU, the mean
  CHECK(g.at(consumers[0].first).name == "matmul");
  CHECK(consumers[0].second == 4 * (128 * 1024 + 3 * 256 * 1024));
  cfg.optimizer_slots = 2;  // Adam
  CHECK(parallelize(g, cfg).memory_per_device() == expect + 4 * 2 * 256 * 1024);
}

TEST_CASE("memory_budget: every search fits a plan under it, or says what is too large") {
  const traced_graph g = two_weights();
  const index_t data_parallel_memory = parallelize(g, config(parallel_mode::data_parallel, 4)).memory_per_device();
  for (search_mode s : {search_mode::sharding_propagation, search_mode::dynamic_programming,
                        search_mode::recursive_programming}) {
    CAPTURE(to_string(s));
    parallel_config cfg = config(parallel_mode::auto_parallel, 4);
    cfg.search = s;
    const parallel_graph free = parallelize(g, cfg);
    // A budget half of data parallel's: the weights are split.
    cfg.memory_budget = data_parallel_memory / 2;
    const parallel_graph fit = parallelize(g, cfg);
    CHECK(fit.memory_per_device() <= cfg.memory_budget);
    const auto split = [](const layout& l) { return l.pieces(0) * l.pieces(1) == 4; };
    const int w1 = g.find("w1"), w2 = g.find("w2");
    CHECK(split(fit.value_layout(w1)));
    CHECK(split(fit.value_layout(w2)));
    // A budget the unconstrained choice already meets changes nothing.
    cfg.memory_budget = free.memory_per_device();
    const parallel_graph same = parallelize(g, cfg);
    for (int id = 0; id < g.size(); ++id)
      if (g.at(id).kind == node_kind::op) CHECK(same.op(id).st == free.op(id).st);
    // Below the least any plan holds (every tensor split 4 ways: 2,883,588 bytes).
    cfg.memory_budget = 2'500'000;
    CHECK_THROWS_WITH_AS(
        parallelize(g, cfg),
        "parallelize: the plan holds 2883588 bytes per device, over the memory budget of 2500000 bytes with the "
        "search weighing memory as dearly as it can; the largest: MatMul 'matmul' ((1, 1), (1, 4)) (its output, "
        "parameter 'w1' with its gradient and optimizer state): 1310720 bytes; MatMul 'matmul2' ((1, 1), (1, 4)) "
        "(its output, parameter 'w2' with its gradient and optimizer state): 917504 bytes; ReLU 'relu' ((1, 4),) "
        "(its output): 524288 bytes",
        error);
  }
  // A mode without a search: over the budget is an error at once.
  parallel_config dp = config(parallel_mode::data_parallel, 4);
  dp.memory_budget = data_parallel_memory - 1;
  CHECK_THROWS_WITH_AS(parallelize(g, dp),
                       ("parallelize: the plan holds " + std::to_string(data_parallel_memory) +
                        " bytes per device, over the memory budget of " + std::to_string(data_parallel_memory - 1) +
                        " bytes (data_parallel has no choice to make); the largest: MatMul 'matmul' ((4, 1), (1, 1)) "
                        "(its output, parameter 'w1' with its gradient and optimizer state): 3670016 bytes; MatMul "
                        "'matmul2' ((4, 1), (1, 1)) (its output, parameter 'w2' with its gradient and optimizer "
                        "state): 3276800 bytes; ReLU 'relu' ((4, 1),) (its output): 524288 bytes")
                           .c_str(),
                       error);
  dp.memory_budget = -1;
  CHECK_THROWS_WITH_AS(parallelize(g, dp), "parallelize: memory_budget must be 0 (no limit) or positive, got -1", error);
}
}  // namespace graph_test_parallel
