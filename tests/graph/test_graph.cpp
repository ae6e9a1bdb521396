// The traced graph and its builder: shapes inferred as operators are applied, instance
// names, shard() checked against the operator's inputs, and the exact text of every
// error a wrong network gets.
#include <doctest/doctest.h>

#include <string>
#include <tessera/graph/graph.hpp>

using namespace tessera;
using namespace tessera::graph;

TEST_CASE("graph_builder: the seed's network, its shapes, names and order") {
  graph_builder b;
  const value x = b.input("input", {16, 32});
  const value label = b.input("label", {16, 16});
  const value w = b.parameter("w", {32, 16});
  const value w2 = b.parameter("w2", {16, 16});
  const value h = b.matmul(x, w).shard({{2, 4}, {4, 1}});
  const value r = b.relu(h);
  const value o = b.matmul(r, w2);
  const value loss = b.mse_loss(o, label);
  CHECK(h.shape() == extents{16, 16});
  CHECK(h.name() == "matmul");
  CHECK(r.name() == "relu");
  CHECK(o.name() == "matmul2");  // the second MatMul, numbered as the seed names it
  CHECK(loss.name() == "mse_loss.reduce_mean");
  CHECK(loss.shape() == extents{});

  const traced_graph g = b.build(loss);
  CHECK(g.size() == 10);
  CHECK(g.loss() == loss.id());
  CHECK(g.inputs() == std::vector<int>{0, 1});
  CHECK(g.parameters() == std::vector<int>{2, 3});
  CHECK(g.find("matmul2") == o.id());
  CHECK(g.at(h.id()).user_strategy == strategy{{2, 4}, {4, 1}});
  CHECK(!g.at(r.id()).user_strategy);
  CHECK(g.at(h.id()).inputs == std::vector<int>{x.id(), w.id()});
  // Every node comes after its inputs; sub is read twice by mul.
  for (int id = 0; id < g.size(); ++id)
    for (int in : g.at(id).inputs) CHECK(in < id);
  const int sub = g.find("mse_loss.sub");
  CHECK(g.consumers(sub) == std::vector<std::pair<int, int>>{{sub + 1, 0}, {sub + 1, 1}});
  CHECK(g.describe(h.id()) == "MatMul 'matmul'");
  CHECK(g.describe(w.id()) == "parameter 'w'");
  CHECK(g.describe(x.id()) == "input 'input'");
  const shape_list s = g.input_shapes(h.id());
  CHECK(s.n == 2);
  CHECK(s[0] == extents{16, 32});
  CHECK(s[1] == extents{32, 16});
}

TEST_CASE("graph_builder: output shapes of every operator") {
  graph_builder b;
  const value x = b.input("x", {8, 6});
  const value v = b.input("v", {6});
  const value c = b.input("c", {8, 1});
  CHECK(b.matmul(x, x, true, false).shape() == extents{6, 6});
  CHECK(b.matmul(x, x, false, true).shape() == extents{8, 8});
  CHECK(b.add(x, v).shape() == extents{8, 6});
  CHECK(b.sub(c, x).shape() == extents{8, 6});
  CHECK(b.mul(x, x).shape() == extents{8, 6});
  CHECK(b.div(x, c).shape() == extents{8, 6});
  CHECK(b.bias_add(x, v).shape() == extents{8, 6});
  for (value y : {b.relu(x), b.exp(x), b.log(x), b.neg(x)}) CHECK(y.shape() == extents{8, 6});
  CHECK(b.reduce_sum(x).shape() == extents{});
  CHECK(b.reduce_mean(x, {1}).shape() == extents{8});
  CHECK(b.reduce_max(x, {-1}, true).shape() == extents{8, 1});
  CHECK(b.reduce_sum(x, {0}, true).shape() == extents{1, 6});
  CHECK(b.softmax_cross_entropy(x, x).shape() == extents{8});
  CHECK(b.all_reduce(x).shape() == extents{8, 6});
  CHECK(b.all_reduce(x, mesh{2, 4}, {1}).shape() == extents{8, 6});
}

TEST_CASE("graph_builder: names are unique; named() renames") {
  graph_builder b;
  const value x = b.input("x", {4, 4});
  const value r1 = b.relu(x);
  const value r2 = b.relu(x);
  const value r3 = b.relu(x).named("third");
  CHECK(r1.name() == "relu");
  CHECK(r2.name() == "relu2");
  CHECK(r3.name() == "third");
  CHECK(b.relu(x).name() == "relu3");
  CHECK(r2.named("relu2").name() == "relu2");  // its own name again: fine
  CHECK_THROWS_WITH_AS(r1.named("third"), "graph: the name 'third' is used twice", error);
  CHECK_THROWS_WITH_AS(b.parameter("x", {2}), "graph: the name 'x' is used twice", error);
  CHECK_THROWS_WITH_AS(b.input("", {2}), "graph: input needs a name", error);
  CHECK_THROWS_WITH_AS(r1.named(""), "graph: a node name must not be empty", error);
}

TEST_CASE("graph_builder: shapes that do not fit are errors naming the operator and the shapes") {
  graph_builder b;
  const value x = b.input("x", {16, 32});
  const value y = b.input("y", {16, 16});
  const value v = b.input("v", {3});
  CHECK_THROWS_WITH_AS(b.matmul(x, y), "graph: MatMul 'matmul': shapes (16, 32) and (16, 16) do not multiply "
                                       "(transpose_a false, transpose_b false)", error);
  CHECK_THROWS_WITH_AS(b.matmul(x, v), "graph: MatMul 'matmul': shapes (16, 32) and (3,) do not multiply "
                                       "(transpose_a false, transpose_b false)", error);
  CHECK_THROWS_WITH_AS(b.add(x, y), "graph: Add 'add': elementwise: the input shapes must broadcast: input 1, "
                                    "output dim 1: extent 16, an earlier input has 32", error);
  CHECK_THROWS_WITH_AS(b.bias_add(x, v), "graph: BiasAdd 'bias_add': bias is (3,), expected (32,) for x (16, 32)", error);
  CHECK_THROWS_WITH_AS(b.reduce_sum(x, {2}), "graph: ReduceSum 'reduce_sum': reduce: each axis must name a dim of "
                                             "the input: axis 2, input rank 2", error);
  CHECK_THROWS_WITH_AS(b.reduce_mean(x, {1, -1}), "graph: ReduceMean 'reduce_mean': reduce: an axis must not name a "
                                                  "dim twice: dim 1 is named twice", error);
  CHECK_THROWS_WITH_AS(b.softmax_cross_entropy(x, y),
                       "graph: SoftmaxCrossEntropyWithLogits 'softmax_cross_entropy': softmax_cross_entropy: logits "
                       "and labels must have the same shape: dim 1: labels has extent 16, logits 32", error);
  CHECK_THROWS_WITH_AS(b.softmax_cross_entropy(v, v),
                       "graph: SoftmaxCrossEntropyWithLogits 'softmax_cross_entropy': softmax_cross_entropy: logits "
                       "must have rank 2 (batch, classes): input 0 has rank 1", error);
  CHECK_THROWS_WITH_AS(b.input("z", {4, 0}), "graph: input 'z': every extent must be positive, shape (4, 0)", error);
  CHECK_THROWS_WITH_AS(b.apply(ops::relu_op{}, {x, x}), "graph: ReLU takes 1 input, got 2", error);
  graph_builder other;
  const value o = other.input("o", {16, 32});
  CHECK_THROWS_WITH_AS(b.add(x, o), "graph: Add 'add': an input comes from another graph_builder", error);
  // Nothing was added by the failed applications: the next ReLU is still "relu".
  CHECK(b.relu(x).name() == "relu");
}

TEST_CASE("shard: checked against the operator's inputs at once") {
  graph_builder b;
  const value x = b.input("x", {16, 32});
  const value w = b.parameter("w", {32, 16});
  const value h = b.matmul(x, w);
  CHECK_THROWS_WITH_AS(h.shard({{2, 4}}), "graph: MatMul 'matmul': operator: a strategy has one split tuple per "
                                          "operator input: 1 split tuples for 2 inputs; strategy ((2, 4),)", error);
  CHECK_THROWS_WITH_AS(h.shard({{2, 4}, {4}}), "graph: MatMul 'matmul': operator: each split tuple has one entry per "
                                               "dim of its input: input 1 has 1 entries, the input has rank 2; "
                                               "strategy ((2, 4), (4,))", error);
  CHECK_THROWS_WITH_AS(h.shard({{2, 0}, {0, 1}}), "graph: MatMul 'matmul': strategy: every split must be positive: "
                                                  "input 0, dim 1: split 0; strategy ((2, 0), (0, 1))", error);
  CHECK_THROWS_WITH_AS(x.shard({{2, 1}}), "graph: shard: input 'x' is not an operator", error);
  CHECK(h.shard("((2, 4), (4, 1))").id() == h.id());
  CHECK(b.current().at(h.id()).user_strategy == strategy{{2, 4}, {4, 1}});
}

TEST_CASE("build: the loss is a scalar every node contributes to") {
  graph_builder b;
  const value x = b.input("x", {8, 4});
  const value unused = b.parameter("unused", {4});
  const value y = b.relu(x);
  CHECK_THROWS_WITH_AS(b.build(y), "graph: the loss must be a scalar, 'relu' has shape (8, 4)", error);
  CHECK_THROWS_WITH_AS(b.build(b.reduce_sum(y)), "graph: parameter 'unused' does not contribute to the loss 'reduce_sum'",
                       error);
  (void)unused;
  graph_builder c;
  const value z = c.input("z", {8, 4});
  const value dead = c.exp(z);
  const value l = c.reduce_sum(c.relu(z));
  CHECK_THROWS_WITH_AS(c.build(l), "graph: Exp 'exp' does not contribute to the loss 'reduce_sum'", error);
  (void)dead;
  CHECK_THROWS_WITH_AS(traced_graph().at(0), "graph: no node 0 in a graph of 0 nodes", error);
  CHECK_THROWS_WITH_AS(c.current().find("nope"), "graph: no node named 'nope'", error);
}
