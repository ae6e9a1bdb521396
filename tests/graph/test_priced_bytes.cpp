// Every operator of the library under every candidate strategy, in a small network run
// by the graph executor for one training step: the bytes this rank's communicators
// count (the redistributions the plan runs plus the operator's internal collectives)
// equal the bytes the graph prices for it, and the loss and the gradients equal the
// stand-alone run on one rank. This keeps each operator's one definition honest: the
// price the graph puts on a strategy is what running it moves.
//
// Built for the host here and, with TESSERA_TEST_CUDA (tests/cuda/graph.cu), with the
// N-rank run on the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include "device_under_test.hpp"
#include <tessera/comm/local.hpp>
#include <tessera/graph/execute.hpp>

using namespace tessera;
using namespace tessera::graph;
using namespace tessera::testing;

namespace {

using values = std::map<std::string, xt::xarray<float>>;

// Smooth values in [-1, 1) for every input and parameter; "classes" holds class indices
// in [0, 8) and "positive" values in [0.5, 1.5).
values data_for(const traced_graph& g) {
  values v;
  int seed = 1;
  for (int id = 0; id < g.size(); ++id) {
    const node& n = g.at(id);
    if (n.kind == node_kind::op) continue;
    xt::xarray<float> x = storage<float, cpu_device>::empty(n.shape);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float u = float((int(i) * 7 + seed * 5) % 17) / 17.0f;
      if (n.name == "classes") x.data()[i] = float((i * 5 + std::size_t(seed)) % 8);
      else if (n.name == "positive") x.data()[i] = 0.5f + u;
      else x.data()[i] = 2.0f * u - 1.0f;
    }
    v[n.name] = x;
    ++seed;
  }
  return v;
}

struct outcome {
  float loss = 0;
  values grads;
};

// One value_and_grad of `g` on the ranks of `comm`; checks that its communicators moved
// the bytes the plan prices for this rank.
template <class D>
outcome step(const parallel_graph& pg, any_communicator& comm, const values& v) {
  executor<float, D> ex(pg, comm);
  const traced_graph& g = pg.traced();
  std::vector<xt::xarray<float>> whole;
  for (int id : g.inputs()) whole.push_back(v.at(g.at(id).name));
  for (int id : g.parameters()) ex.set_parameter(g.at(id).name, v.at(g.at(id).name));
  const auto r = ex.value_and_grad(ex.slice_batch(whole));
  CHECK(ex.last_step_traffic().bytes == pg.bytes_for_rank(ex.rank()));
  outcome o;
  o.loss = r.loss;
  const std::vector<int> ps = g.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) o.grads[g.at(ps[i]).name] = ex.gather(r.grads[i]);
  return o;
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(std::abs(x.data()[i] - y.data()[i]) <= 1e-4f * (1.0f + std::abs(y.data()[i])))) return false;
  return true;
}

// A network around one operator: `build` applies it (its inputs declared first) and
// returns its output; the loss is the mean of `finish` of it (the output itself by
// default, or a differentiable product for operators that give data).
struct op_case {
  std::string name;
  std::function<value(graph_builder&)> build;
  std::function<value(graph_builder&, value)> finish = [](graph_builder&, value y) { return y; };
};

traced_graph network(const op_case& c, const strategy* st) {
  graph_builder b;
  value y = c.build(b);
  if (st) y.shard(*st);
  const value z = c.finish(b, y);
  // The mean of every element, on every rank whole: it gathers what the operator split.
  return b.build(b.reduce_mean(z).shard(strategy{ops::ones(z.shape().ndim)}));
}

// The id of the operator under test in a graph of `network` (the one `build` returned).
int tested_id(const op_case& c) {
  graph_builder b;
  return c.build(b).id();
}

// The operators of convolutional networks where the host and the test device have
// their kernels (the host's come with tessera::dnnl; nvcc's view of the host has none).
std::vector<op_case> cnn_cases() {
  using B = graph_builder;
  std::vector<op_case> c;
  if constexpr (ops::batch_norm_supported<float, cpu_device> && ops::batch_norm_supported<float, test_device>) {
    c.push_back({"BatchNorm",
                 [](B& b) {
                   return b.batch_norm(b.parameter("a", {8, 4, 2, 2}), b.parameter("gamma", {4}),
                                       b.parameter("beta", {4}));
                 },
                 [](B& b, value y) { return b.mul(y, b.parameter("w", {8, 4, 2, 2})); }});
  }
  if constexpr (ops::detail::has_window_kernels<float, cpu_device>() &&
                ops::detail::has_window_kernels<float, test_device>()) {
    c.push_back({"Conv2D 3x3, padding 1", [](B& b) {
                   return b.conv2d(b.parameter("a", {4, 2, 4, 4}), b.parameter("w", {4, 2, 3, 3}),
                                   kernels::conv2d_params{1, 1, kernels::pad2d::uniform(1)});
                 }});
    c.push_back({"MaxPool 3x3, stride 2, padding 1",
                 [](B& b) {
                   return b.max_pool2d(b.parameter("a", {8, 2, 8, 8}), kernels::pool2d_params::square(3, 2, 1));
                 },
                 [](B& b, value y) { return b.mul(y, b.parameter("w", {8, 2, 4, 4})); }});
    c.push_back({"AvgPool 2x2", [](B& b) {
                   return b.avg_pool2d(b.parameter("a", {4, 2, 4, 4}), kernels::pool2d_params::square(2, 2));
                 }});
  }
  return c;
}

std::vector<op_case> joined(std::vector<op_case> a, const std::vector<op_case>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<op_case>& cases() {
  using B = graph_builder;
  static const std::vector<op_case> c = joined({
      {"MatMul", [](B& b) { return b.matmul(b.parameter("a", {8, 16}), b.parameter("w", {16, 8})); }},
      {"MatMul transposed", [](B& b) { return b.matmul(b.parameter("a", {16, 8}), b.parameter("w", {8, 16}), true, true); }},
      {"BatchMatMul", [](B& b) { return b.batch_matmul(b.parameter("a", {4, 8, 8}), b.parameter("w", {4, 8, 4})); }},
      {"BatchMatMul shared", [](B& b) { return b.batch_matmul(b.parameter("a", {4, 8, 8}), b.parameter("w", {8, 4})); }},
      {"Add", [](B& b) { return b.add(b.parameter("a", {8, 16}), b.parameter("w", {8, 16})); }},
      {"Add broadcast", [](B& b) { return b.add(b.parameter("a", {8, 16}), b.parameter("w", {16})); }},
      {"Sub", [](B& b) { return b.sub(b.parameter("a", {8, 1}), b.parameter("w", {8, 16})); }},
      {"Mul", [](B& b) { return b.mul(b.parameter("a", {8, 16}), b.parameter("w", {8, 16})); }},
      {"RealDiv", [](B& b) { return b.div(b.parameter("a", {8, 16}), b.input("positive", {8, 16})); }},
      {"BiasAdd", [](B& b) { return b.bias_add(b.parameter("a", {8, 16}), b.parameter("w", {16})); }},
      {"ReLU", [](B& b) { return b.relu(b.parameter("a", {8, 16})); }},
      {"Exp", [](B& b) { return b.exp(b.parameter("a", {8, 16})); }},
      {"Log", [](B& b) { return b.log(b.exp(b.parameter("a", {8, 16}))); }},
      {"Neg", [](B& b) { return b.neg(b.parameter("a", {8, 16})); }},
      {"ReduceSum", [](B& b) { return b.reduce_sum(b.parameter("a", {8, 16}), {1}); }},
      {"ReduceMean keep_dims", [](B& b) { return b.reduce_mean(b.parameter("a", {8, 16}), {0}, true); }},
      {"ReduceMax", [](B& b) { return b.reduce_max(b.parameter("a", {8, 16}), {1}); }},
      {"ReduceMin all", [](B& b) { return b.reduce_min(b.parameter("a", {8, 16})); }},
      {"SoftmaxCrossEntropyWithLogits",
       [](B& b) { return b.softmax_cross_entropy(b.parameter("a", {16, 8}), b.input("labels", {16, 8})); }},
      {"SparseSoftmaxCrossEntropyWithLogits",
       [](B& b) { return b.sparse_softmax_cross_entropy(b.parameter("a", {16, 8}), b.input("classes", {16})); }},
      {"Softmax", [](B& b) { return b.softmax(b.parameter("a", {8, 16})); }},
      {"LogSoftmax axis 0", [](B& b) { return b.log_softmax(b.parameter("a", {8, 16}), 0); }},
      {"Transpose", [](B& b) { return b.transpose(b.parameter("a", {8, 4, 2}), {2, 0, 1}); }},
      {"Reshape", [](B& b) { return b.reshape(b.parameter("a", {8, 16}), {16, 2, 4}); }},
      {"Flatten", [](B& b) { return b.flatten(b.parameter("a", {8, 2, 4})); }},
      {"StridedSlice", [](B& b) { return b.strided_slice(b.parameter("a", {8, 16}), {0, 2}, {8, 14}, {1, 3}); }},
      {"Concat", [](B& b) { return b.concat({b.parameter("a", {8, 4}), b.parameter("w", {8, 12})}, 1); }},
      {"OneHot", [](B& b) { return b.one_hot(b.input("classes", {16}), 8); },
       [](B& b, value y) { return b.mul(y, b.parameter("a", {16, 8})); }},
      {"Argmax", [](B& b) { return b.argmax(b.input("x", {16, 8})); },
       [](B& b, value y) { return b.mul(y, b.parameter("a", {16})); }},
  }, cnn_cases());
  return c;
}

}  // namespace

TEST_CASE("every operator under every candidate strategy: the bytes moved are the bytes priced") {
  any_communicator world(test_world());
  const int p = world.size();
  any_communicator one{local_communicator{}};
  int runs = 0;
  for (const op_case& c : cases()) {
    CAPTURE(c.name);
    const traced_graph plain = network(c, nullptr);
    const values v = data_for(plain);
    const outcome oracle =
        step<cpu_device>(parallelize(plain, parallel_config{}), one, v);
    const int id = tested_id(c);
    REQUIRE(plain.at(id).kind == node_kind::op);
    const std::vector<strategy> candidates = plain.at(id).op->candidates(p, plain.input_shapes(id));
    REQUIRE(!candidates.empty());
    for (const strategy& st : candidates) {
      CAPTURE(to_string(st));
      parallel_config cfg;
      cfg.mode = parallel_mode::semi_auto_parallel;
      cfg.device_num = p;
      const parallel_graph pg = parallelize(network(c, &st), cfg);
      CHECK(pg.op(id).st == st);
      const outcome got = step<test_device>(pg, world, v);
      CHECK(std::abs(got.loss - oracle.loss) <= 1e-4f * (1.0f + std::abs(oracle.loss)));
      for (const auto& [name, g] : oracle.grads) {
        CAPTURE(name);
        CHECK(close(got.grads.at(name), g));
      }
      ++runs;
    }
  }
  if (world.rank() == 0) MESSAGE(runs << " strategies of " << cases().size() << " operator cases on " << p << " ranks");
}

TEST_CASE("the user's AllReduce in hybrid_parallel: the bytes moved are the bytes priced") {
  any_communicator world(test_world());
  const int p = world.size();
  graph_builder b;
  const value a = b.parameter("a", {4, 8});
  const value s = b.all_reduce(b.mul(a, a));
  const value t = p % 2 == 0 ? b.all_reduce(s, mesh{2, p / 2}, {1}) : s;
  const traced_graph g = b.build(b.reduce_mean(t));
  parallel_config cfg;
  cfg.mode = parallel_mode::hybrid_parallel;
  cfg.device_num = p;
  const parallel_graph pg = parallelize(g, cfg);
  const values v = data_for(g);
  const outcome got = step<test_device>(pg, world, v);
  if (p > 1) CHECK(pg.bytes_for_rank(world.rank()) > 0);
  // Every rank holds the same a: the sum over p ranks is p a^2 (then the group's).
  const float scale = float(p) * float(p % 2 == 0 ? p / 2 : 1);
  float want = 0;
  for (float x : v.at("a")) want += scale * x * x;
  want /= float(v.at("a").size());
  CHECK(std::abs(got.loss - want) <= 1e-4f * (1.0f + std::abs(want)));
}
