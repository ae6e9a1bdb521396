// The graph executor under mpiexec: every parallel mode (stand_alone, data_parallel,
// semi_auto_parallel, auto_parallel with each data-import mode and each search,
// hybrid_parallel) gives the loss and the parameter gradients of the stand-alone run on
// one rank (the oracle), on every rank count; each rank's communicators move exactly the bytes the plan
// prices; training steps with Momentum agree; run-time errors name what is wrong.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include <xtensor/xview.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/optim/momentum.hpp>

namespace graph_test_execute {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::graph;

namespace {

using values = std::map<std::string, xt::xarray<float>>;

xt::xarray<float> matrix(const extents& s, int seed) {
  xt::xarray<float> x = storage<float, cpu_device>::empty(s);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float((int(i) * 7 + seed * 5) % 17 - 8) / 16.0f;
  return x;
}

// Values for every input and parameter of a graph, from their names' order.
values data_for(const traced_graph& g) {
  values v;
  int seed = 1;
  for (int id = 0; id < g.size(); ++id)
    if (g.at(id).kind != node_kind::op) v[g.at(id).name] = matrix(g.at(id).shape, seed++);
  // Class labels (B,): integers in [0, 16).
  if (v.count("classes"))
    for (std::size_t i = 0; i < v["classes"].size(); ++i) v["classes"].data()[i] = float(i * 5 % 16);
  return v;
}

struct outcome {
  float loss = 0;
  values grads;  // whole values
};

// An operator definition as `Op`, but linear in nothing: how the graph priced and ran
// a network before partial sums flowed through linear operators.
template <class Op>
struct opaque : Op {
  linearity linear() const { return {}; }
};

// One forward and backward of `g` on the ranks of `comm`, from whole values; checks that
// the communicators moved the planned bytes. `drop`: whether the executor frees the
// values no backward reads during the forward pass (the default); `dropped` gets how
// many it freed.
template <class C>
outcome run(const traced_graph& g, const parallel_config& cfg, C& comm, const values& v, bool drop = true,
            int* dropped = nullptr) {
  executor<float> ex(parallelize(g, cfg), comm);
  ex.drop_unread_values(drop);
  ex.template add_operator<opaque<ops::neg_op>>();
  ex.template add_operator<opaque<ops::mul_op>>();
  ex.template add_operator<opaque<ops::transpose_op>>();
  ex.template add_operator<opaque<ops::matmul_op>>();
  std::vector<xt::xarray<float>> whole;
  for (int id : g.inputs()) whole.push_back(v.at(g.at(id).name));
  for (int id : g.parameters()) ex.set_parameter(g.at(id).name, v.at(g.at(id).name));
  const auto r = ex.value_and_grad(ex.slice_batch(whole));
  CHECK(ex.last_step_traffic().bytes == ex.plan().bytes_for_rank(ex.rank()));
  if (dropped) *dropped = ex.last_step_dropped_values();
  outcome o;
  o.loss = r.loss;
  const std::vector<int> ps = g.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    CHECK(r.grads[i].layout() == ex.plan().value_layout(ps[i]));
    o.grads[g.at(ps[i]).name] = ex.gather(r.grads[i]);
  }
  return o;
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(x.data()[i] - y.data()[i]) > 1e-5f * (1.0f + std::abs(y.data()[i]))) return false;
  return true;
}

void check_same(const outcome& got, const outcome& want) {
  CHECK(std::abs(got.loss - want.loss) <= 1e-5f * (1.0f + std::abs(want.loss)));
  for (const auto& [name, g] : want.grads) {
    CAPTURE(name);
    CHECK(close(got.grads.at(name), g));
  }
}

parallel_config config(parallel_mode m, int n, dataset_strategy d = dataset_strategy::data_parallel()) {
  parallel_config c;
  c.mode = m;
  c.device_num = n;
  c.dataset = std::move(d);
  return c;
}

// auto_parallel with the dynamic_programming search and the given machine balance.
parallel_config dynamic_programming(int n, double flops_per_byte) {
  parallel_config c = config(parallel_mode::auto_parallel, n);
  c.search = search_mode::dynamic_programming;
  c.flops_per_byte = flops_per_byte;
  return c;
}

// auto_parallel with the recursive_programming search.
parallel_config recursive_programming(int n) {
  parallel_config c = config(parallel_mode::auto_parallel, n);
  c.search = search_mode::recursive_programming;
  return c;
}

// A network traced with a strategy for some operators: `semi` gives every operator
// one (those it names), `configured` only the first MatMul.
using tracer = std::function<traced_graph(int p, bool semi)>;

// The quickstart's MLP and MSE loss on a batch of 16.
traced_graph mlp(int p, bool semi) {
  const int a = p % 2 == 0 ? 2 : 1, k = p / a;
  graph_builder b;
  const value x = b.input("x", {16, 32}), label = b.input("label", {16, 16});
  value h = b.matmul(x, b.parameter("w", {32, 16})).shard({{a, k}, {k, 1}});
  h = b.relu(h);
  if (semi) h.shard({{1, p}});
  value y = b.matmul(h, b.parameter("w2", {16, 16}));
  if (semi) y.shard({{1, p}, {p, 1}});
  return b.build(b.mse_loss(y, label));
}

// A classifier: MatMul, BiasAdd, ReLU, MatMul, BiasAdd, softmax cross entropy.
traced_graph classifier(int p, bool semi) {
  const int a = p % 2 == 0 ? 2 : 1, k = p / a;
  graph_builder b;
  const value x = b.input("x", {16, 16}), labels = b.input("labels", {16, 8});
  value h = b.matmul(x, b.parameter("w1", {16, 32})).shard({{1, p}, {p, 1}});
  h = b.bias_add(h, b.parameter("b1", {32}));
  if (semi) h.shard({{1, p}, {p}});
  h = b.relu(h);
  value logits = b.matmul(h, b.parameter("w2", {32, 8}));
  if (semi) logits.shard({{p, 1}, {1, 1}});
  logits = b.bias_add(logits, b.parameter("b2", {8}));
  value ce = b.softmax_cross_entropy(logits, labels);
  if (semi) ce.shard({{a, k}, {a, k}});
  return b.build(b.reduce_mean(ce));
}

// Exp, Neg, ReduceSum and ReduceMax keeping dims, RealDiv and Add broadcasting, Log.
traced_graph zoo(int p, bool semi) {
  graph_builder b;
  const value x = b.input("x", {16, 8});
  const value h = b.matmul(x, b.parameter("w", {8, 8})).shard({{1, p}, {p, 1}});
  const value e = b.exp(b.neg(h));
  value s = b.reduce_sum(e, {1}, true);
  if (semi) s.shard({{1, p}});
  value z = b.div(e, s);
  if (semi) z.shard({{p, 1}, {p, 1}});
  value m = b.reduce_max(h, {1}, true);
  if (semi) m.shard({{1, p}});  // the maxima over split columns: partial max
  return b.build(b.reduce_mean(b.add(b.log(z), m)));
}

// BatchMatMul, Reshape, Transpose, Flatten, StridedSlice, Concat, LogSoftmax, Softmax,
// OneHot, ArgMax, ReduceMin and the sparse cross entropy.
traced_graph shapes(int p, bool semi) {
  const int a = p % 2 == 0 ? 2 : 1, k = p / a;
  graph_builder b;
  const value x = b.input("x", {16, 8}), classes = b.input("classes", {16});
  const value w = b.parameter("w", {8, 16}), w2 = b.parameter("w2", {4, 4}), w3 = b.parameter("w3", {8, 8});
  const value h = b.matmul(x, w).shard({{p, 1}, {1, 1}});
  const value t = b.transpose(b.reshape(h, {16, 4, 4}), {0, 2, 1});
  value bm = b.batch_matmul(t, w2);  // w2 shared by the 16 entries
  if (semi) bm.shard({{a, 1, k}, {k, 1}});
  const value sl = b.strided_slice(b.flatten(bm), {0, 0}, {16, 16}, {1, 2});  // (16, 8)
  value h3 = b.matmul(x, w3);
  if (semi) h3.shard({{1, p}, {p, 1}});
  value c = b.concat({sl, h3}, 1);  // (16, 16)
  if (semi) c.shard({{p, 1}, {p, 1}});
  value ls = b.log_softmax(c);
  value oh = b.one_hot(classes, 16);
  value ce = b.sparse_softmax_cross_entropy(c, classes);
  value am = b.argmax(c);
  value mn = b.reduce_min(c, {1});
  value sm = b.softmax(c, 0);  // over the batch
  if (semi) {
    ls.shard({{a, k}});  // the softmax axis split k ways
    oh.shard({{a, k}});
    ce.shard({{a, k}, {a}});
    am.shard({{a, k}});
    mn.shard({{a, k}});
    sm.shard({{k, a}});
  }
  const value l1 = b.neg(b.reduce_mean(b.mul(ls, oh)));
  const value l2 = b.reduce_mean(ce);
  const value l3 = b.reduce_mean(b.mul(mn, am));
  const value l4 = b.reduce_mean(b.mul(sm, c));
  const value l12 = b.add(l1, l2), l34 = b.add(l3, l4);
  return b.build(b.add(l12, l34));
}

// A MatMul with its contraction split, then linear operators (Neg, Mul by a scale,
// Transpose, a MatMul to 4 columns), then ReLU (rows split) and the loss. With `linear`, the
// operators are the library's; without, each resolves partial sums at its input.
traced_graph linear_chain(int p, bool linear) {
  graph_builder b;
  const value x = b.input("x", {16, 32});
  const value c = b.matmul(x, b.parameter("w", {32, 16})).shard({{1, p}, {p, 1}});
  auto unary = [&]<class Op>(Op op, const std::vector<value>& in) {
    return linear ? b.apply(op, in) : b.apply(opaque<Op>{op}, in);
  };
  const value n = unary(ops::neg_op{}, {c});
  const value m = unary(ops::mul_op{}, {n, b.parameter("scale", {1})});
  const value t = unary(ops::transpose_op{{}, {1, 0}}, {m});
  const value h = unary(ops::matmul_op{}, {t, b.parameter("w2", {16, 4})});
  return b.build(b.reduce_mean(b.relu(h).shard({{p, 1}})));  // ReLU wants its rows split
}

const std::vector<std::pair<std::string, tracer>>& networks() {
  static const std::vector<std::pair<std::string, tracer>> n = {
      {"mlp", mlp}, {"classifier", classifier}, {"zoo", zoo}, {"shapes", shapes}};
  return n;
}

}  // namespace

TEST_CASE("every parallel mode gives the stand-alone loss and gradients") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  any_communicator one{local_communicator{}};
  for (const auto& [name, trace] : networks()) {
    CAPTURE(name);
    const traced_graph semi = trace(p, true), configured = trace(p, false);
    const values v = data_for(semi);
    const outcome oracle = run(trace(1, false), config(parallel_mode::stand_alone, 1), one, v);
    struct mode_case {
      const char* what;
      const traced_graph& g;
      parallel_config cfg;
    };
    const std::vector<mode_case> cases = {
        {"stand_alone on every rank", semi, config(parallel_mode::stand_alone, p)},
        {"data_parallel", semi, config(parallel_mode::data_parallel, p)},
        {"semi_auto_parallel", semi, config(parallel_mode::semi_auto_parallel, p)},
        {"auto_parallel", configured, config(parallel_mode::auto_parallel, p)},
        {"auto_parallel, full_batch", configured, config(parallel_mode::auto_parallel, p, dataset_strategy::full_batch())},
        {"auto_parallel, dynamic_programming", configured, dynamic_programming(p, 10)},
        {"auto_parallel, dynamic_programming, compute dear", configured, dynamic_programming(p, 0.05)},
        {"auto_parallel, recursive_programming", configured, recursive_programming(p)},
    };
    for (const mode_case& c : cases) {
      CAPTURE(c.what);
      check_same(run(c.g, c.cfg, world, v), oracle);
    }
  }
}

TEST_CASE("the values no backward reads are freed in the forward pass, and the step is the same to the bit") {
  // Freed in the MLP: the first MatMul's output (ReLU's backward reads its own output);
  // in the classifier, both MatMuls' outputs and the first BiasAdd's (BiasAdd reads
  // neither input); in the zoo, Log's and Add's outputs; in `shapes`, the first MatMul's
  // and the Reshape's, among others.
  const std::map<std::string, int> at_least = {{"mlp", 1}, {"classifier", 3}, {"zoo", 2}, {"shapes", 2}};
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  for (const auto& [name, trace] : networks()) {
    CAPTURE(name);
    const traced_graph semi = trace(p, true), configured = trace(p, false);
    const values v = data_for(semi);
    const std::vector<std::pair<const traced_graph*, parallel_config>> cases = {
        {&semi, config(parallel_mode::stand_alone, p)},
        {&semi, config(parallel_mode::data_parallel, p)},
        {&semi, config(parallel_mode::semi_auto_parallel, p)},
        {&configured, config(parallel_mode::auto_parallel, p)}};
    for (const auto& [g, cfg] : cases) {
      CAPTURE(int(cfg.mode));
      int none = -1, freed = -1;
      const outcome kept = run(*g, cfg, world, v, false, &none);
      const outcome dropped = run(*g, cfg, world, v, true, &freed);
      CHECK(none == 0);
      CHECK(freed >= at_least.at(name));
      CHECK(dropped.loss == kept.loss);
      for (const auto& [param, grad] : kept.grads) {
        CAPTURE(param);
        CHECK(dropped.grads.at(param) == grad);
      }
    }
  }
}

TEST_CASE("partial sums stay partial through linear operators to the first ReLU, and move fewer bytes") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  any_communicator one{local_communicator{}};
  const traced_graph g = linear_chain(p, true), before = linear_chain(p, false);
  const parallel_config cfg = config(parallel_mode::auto_parallel, p);
  const parallel_graph pg = parallelize(g, cfg), pg0 = parallelize(before, cfg);
  // Nodes: x, w, matmul, neg, scale, mul, transpose, w2, matmul2, relu, loss.
  const int matmul = 2, neg = 3, mul = 5, transpose = 6, matmul2 = 8, relu = 9;
  REQUIRE(g.at(relu).op->type() == "ReLU");
  if (p > 1) {
    for (int id : {matmul, neg, mul, transpose, matmul2}) CHECK(pg.value_layout(id).has_partial());
    for (auto [c, s] : {std::pair{neg, 0}, {mul, 0}, {transpose, 0}, {matmul2, 0}}) CHECK(pg.edge(c, s).forward.empty());
    const route& r = pg.edge(relu, 0).forward;
    REQUIRE(r.p.size() == 1);  // one resolution, the cheapest: ReLU's input split
    CHECK(r.p[0].kind == step_kind::reduce_scatter);
    const std::string ir = execute_ir(pg, world.rank());
    CHECK(ir.find("# redistribution: matmul -> neg") == std::string::npos);
    CHECK(ir.find("# redistribution: neg -> mul") == std::string::npos);
    CHECK(ir.find("# redistribution: mul -> transpose") == std::string::npos);
    CHECK(ir.find("# redistribution: transpose -> matmul") == std::string::npos);
    CHECK(ir.find("ReduceScatter") != std::string::npos);
    // Before, Neg resolved the (16, 16) product; now ReLU resolves the (16, 4) one.
    CHECK(!pg0.value_layout(neg).has_partial());
    CHECK(pg.priced_bytes() < pg0.priced_bytes());
    CHECK(pg.bytes_for_rank(world.rank()) < pg0.bytes_for_rank(world.rank()));
    if (world.rank() == 0)
      MESSAGE("linear chain on " << p << " ranks, bytes per step for rank 0: priced " << pg0.priced_bytes() << " -> "
                                 << pg.priced_bytes() << ", received " << pg0.bytes_for_rank(0) << " -> " << pg.bytes_for_rank(0));
  }
  const values v = data_for(g);
  const outcome oracle = run(linear_chain(1, true), config(parallel_mode::stand_alone, 1), one, v);
  check_same(run(g, cfg, world, v), oracle);
  check_same(run(before, cfg, world, v), oracle);
}

TEST_CASE("auto_parallel with a per-input dataset strategy") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  any_communicator one{local_communicator{}};
  const values v = data_for(mlp(p, false));
  const outcome oracle = run(mlp(1, false), config(parallel_mode::stand_alone, 1), one, v);
  const dataset_strategy cols = dataset_strategy::per_input({{1, p}, {1, p}});
  check_same(run(mlp(p, false), config(parallel_mode::auto_parallel, p, cols), world, v), oracle);
  const int a = p % 2 == 0 ? 2 : 1;
  const dataset_strategy blocks = dataset_strategy::per_input({{a, p / a}, {p, 1}});
  check_same(run(mlp(p, true), config(parallel_mode::semi_auto_parallel, p, blocks), world, v), oracle);
}

TEST_CASE("hybrid_parallel: the user's AllReduce and layer-wise parallel slices") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size(), me = world.rank();
  any_communicator one{local_communicator{}};
  constexpr index_t B = 8, K = 16, H = 8;
  // The stand-alone network: y = x W + b, MSE against the labels.
  auto whole = [&] {
    graph_builder b;
    const value x = b.input("x", {B, K}), label = b.input("label", {B, H});
    const value w = b.parameter("w", {K, H}), bias = b.parameter("b", {H});
    const value y = b.bias_add(b.matmul(x, w), bias);
    return b.build(b.mse_loss(y, label));
  };
  const traced_graph sg = whole();
  const values v = data_for(sg);
  const outcome oracle = run(sg, config(parallel_mode::stand_alone, 1), one, v);
  const index_t k = K / p;
  auto rows = [&](const xt::xarray<float>& a) {  // this rank's rows of a whole matrix
    return xt::xarray<float>(xt::view(a, xt::range(me * k, (me + 1) * k), xt::all()));
  };
  auto cols = [&](const xt::xarray<float>& a) {
    return xt::xarray<float>(xt::view(a, xt::all(), xt::range(me * k, (me + 1) * k)));
  };
  for (bool grouped : {false, true}) {
    CAPTURE(grouped);
    // Seed 004's HybridParallelNet: each rank multiplies its columns of x by its rows of
    // W (layer-wise parallel) and the AllReduce sums the partial products.
    graph_builder b;
    const value x = b.input("x", {B, k}), label = b.input("label", {B, H});
    const value part = b.matmul(x, b.parameter("w", {k, H}, true));
    const value sum = grouped ? b.all_reduce(part, mesh{1, p}, {1}) : b.all_reduce(part);
    const traced_graph hg = b.build(b.mse_loss(b.bias_add(sum, b.parameter("b", {H})), label));
    executor<float> ex(parallelize(hg, config(parallel_mode::hybrid_parallel, p)), world);
    ex.set_parameter("w", rows(v.at("w")));
    ex.set_parameter("b", v.at("b"));
    const auto r = ex.value_and_grad({cols(v.at("x")), v.at("label")});
    CHECK(ex.last_step_traffic().bytes == ex.plan().bytes_for_rank(me));
    CHECK(std::abs(r.loss - oracle.loss) <= 1e-5f * oracle.loss);
    CHECK(close(r.grads[0].local(), rows(oracle.grads.at("w"))));  // each rank its slice's gradient
    CHECK(close(r.grads[1].local(), oracle.grads.at("b")));        // all-reduced over the ranks
  }
  // Data parallelism written by hand: each rank its rows of the batch, the parameters
  // whole; the mean of the ranks' losses is the loss, and the all-reduced gradients its.
  if (B % p == 0) {
    graph_builder b;
    const index_t rb = B / p;
    const value x = b.input("x", {rb, K}), label = b.input("label", {rb, H});
    const value w = b.parameter("w", {K, H}), bias = b.parameter("b", {H});  // in this order
    const value y = b.bias_add(b.matmul(x, w), bias);
    executor<float> ex(parallelize(b.build(b.mse_loss(y, label)), config(parallel_mode::hybrid_parallel, p)),
                                         world);
    ex.set_parameter("w", v.at("w"));
    ex.set_parameter("b", v.at("b"));
    auto batch_rows = [&](const xt::xarray<float>& a) {
      return xt::xarray<float>(xt::view(a, xt::range(me * rb, (me + 1) * rb), xt::all()));
    };
    const auto r = ex.value_and_grad({batch_rows(v.at("x")), batch_rows(v.at("label"))});
    float mean = r.loss / float(p);
    world.all_reduce(std::span<float>(&mean, 1), reduce_op::sum);
    CHECK(std::abs(mean - oracle.loss) <= 1e-5f * oracle.loss);
    CHECK(close(r.grads[0].local(), oracle.grads.at("w")));
    CHECK(close(r.grads[1].local(), oracle.grads.at("b")));
  }
}

TEST_CASE("training: Momentum steps on 1 rank and on all of them agree") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  any_communicator one{local_communicator{}};
  const values v = data_for(mlp(p, false));
  auto train = [&](auto& comm, const traced_graph& g, const parallel_config& cfg) {
    executor<float> ex(parallelize(g, cfg), comm);
    for (const char* n : {"w", "w2"}) ex.set_parameter(n, v.at(n));
    const auto batch = ex.slice_batch({v.at("x"), v.at("label")});
    optim::momentum<float> opt(0.2f, 0.1f);
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) losses.push_back(ex.train_step(batch, opt));
    losses.push_back(ex.evaluate(batch));
    std::vector<xt::xarray<float>> params;
    for (const auto& t : ex.parameters()) params.push_back(ex.gather(t));
    return std::make_pair(losses, params);
  };
  const auto alone = train(one, mlp(1, false), config(parallel_mode::stand_alone, 1));
  const auto par = train(world, mlp(p, false), config(parallel_mode::auto_parallel, p));
  for (std::size_t i = 0; i < alone.first.size(); ++i)
    CHECK(std::abs(par.first[i] - alone.first[i]) <= 1e-5f * alone.first[i]);
  CHECK(alone.first.back() < alone.first.front());
  for (std::size_t i = 0; i < alone.second.size(); ++i) CHECK(close(par.second[i], alone.second[i]));
}

namespace user {
// An operator defined outside the library: y = x * x, element by element. Its
// definition takes the element-wise rule (ops/elementwise_rule.hpp); its forward and
// backward run Mul, found by argument-dependent lookup in this namespace.
struct square_op {
  strategy st;

  static constexpr std::string_view type() { return "Square"; }
  static constexpr std::string_view name() { return "square"; }
  static constexpr int arity = 1;

  extents output_shape(const shape_list& in) const { return in[0]; }
  status check(const strategy& s, int n, const shape_list& in) const { return check_elementwise(s, n, in); }
  op_layouts layouts(const strategy& s, int n, const shape_list& in) const { return ops::relu_op{}.layouts(s, n, in); }
  std::vector<strategy> candidates(int n, const shape_list& in) const { return ops::relu_op{}.candidates(n, in); }
  strategy data_parallel(int n, const shape_list& in) const { return ops::relu_op{}.data_parallel(n, in); }
  ops::mul_op mul() const { return ops::mul_op{strategy{st.in[0], st.in[0]}}; }
};

template <class T, class D>
tensor_on<T, D> forward(const square_op& op, ops::op_inputs<T, D> x, context& ctx) {
  return ops::mul(op.mul(), *x[0], *x[0], ctx);
}
template <class T, class D>
ops::op_grads<T, D> backward(const square_op& op, const tensor_on<T, D>& dy, ops::op_inputs<T, D> x,
                             const tensor_on<T, D>&, context& ctx) {
  tensor_on<T, D> dx = ops::mul(op.mul(), dy, *x[0], ctx);
  kernels::backend<D>::scale(dx.local(), T(2));
  return ops::grads_of(std::move(dx));
}
}  // namespace user

TEST_CASE("an operator defined outside the library, run once the executor is told of it") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  graph_builder b;
  const value x = b.input("x", {8, 8});
  const value h = b.apply(user::square_op{}, {b.matmul(x, b.parameter("w", {8, 8}))});
  CHECK(h.name() == "square");
  const traced_graph g = b.build(b.reduce_sum(h));
  const values v = data_for(g);
  executor<float> ex(parallelize(g, config(parallel_mode::data_parallel, p)), world);
  ex.set_parameter("w", v.at("w"));
  const auto batch = ex.slice_batch({v.at("x")});
  std::string what;
  try {
    ex.value_and_grad(batch);
  } catch (const error& e) {
    what = e.what();
  }
  CHECK(what.starts_with("graph executor: Square 'square' is an operator defined outside the library ("));
  CHECK(what.ends_with("); let the executor run it with add_operator<Op>()"));
  ex.add_operator<user::square_op>();
  const auto r = ex.value_and_grad(batch);
  // The reference: sum((x w)^2) and its gradient 2 x^T (x w).
  const xt::xarray<float> xw = kernels::cpu::matmul(v.at("x"), v.at("w"));
  float ref = 0;
  for (float e : xw) ref += e * e;
  CHECK(std::abs(r.loss - ref) <= 1e-5f * ref);
  CHECK(close(ex.gather(r.grads[0]), xt::xarray<float>(2.0f * kernels::cpu::matmul(v.at("x"), xw, true, false))));
}

TEST_CASE("run-time errors name the input, parameter or operator and the shapes") {
  any_communicator world(mpi_communicator::world());
  const int p = world.size();
  const traced_graph g = mlp(p, false);
  executor<float> ex(parallelize(g, config(parallel_mode::auto_parallel, p)), world);
  const xt::xarray<float> x = matrix(extents{16, 32}, 1), label = matrix(extents{16, 16}, 2);
  const std::string each = "(" + std::to_string(16 / p) + ", 32)";
  if (p > 1)
    CHECK_THROWS_WITH_AS(ex.value_and_grad({x, label}),
                         ("graph executor: input 'x': this rank's data is (16, 32), dataset_strategy data_parallel "
                          "gives each rank " + each + " of (16, 32)").c_str(),
                         error);
  CHECK_THROWS_WITH_AS(ex.value_and_grad({x}), "graph executor: a batch of 1 tensors for 2 inputs", error);
  CHECK_THROWS_WITH_AS(ex.set_parameter("w", label), "graph executor: parameter 'w' is (32, 16), the value given is (16, 16)",
                       error);
  CHECK_THROWS_WITH_AS(ex.set_parameter("v", label), "graph executor: no parameter named 'v'", error);
  CHECK_THROWS_WITH_AS(ex.slice_input("y", x), "graph executor: no input named 'y'", error);
  CHECK(ex.input_local_shape("label") == extents{16 / p, 16});
  const int other = p == 2 ? 4 : 2;
  CHECK_THROWS_WITH_AS((executor<float>(parallelize(mlp(other, false), config(parallel_mode::auto_parallel, other)), world)),
                       ("graph executor: the graph was parallelized for " + std::to_string(other) +
                        " devices, the communicator has " + std::to_string(p) + " ranks").c_str(),
                       error);
  CHECK_THROWS_WITH_AS((executor<double>(parallelize(g, config(parallel_mode::auto_parallel, p)), world)),
                       "graph executor: the graph was parallelized for 4-byte elements, the executor's are 8 bytes",
                       error);
}
}  // namespace graph_test_execute
