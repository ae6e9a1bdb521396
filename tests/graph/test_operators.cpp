// The other operators of ops/ in the graph: each one's candidates are exactly the
// strategies its rule accepts (compared with an enumeration of every split tuple), its
// data-parallel strategy, its collectives, the shapes the builder infers and the exact
// text of its errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/graph/graph.hpp>
#include "candidates.hpp"

using namespace tessera;
using namespace tessera::graph;
using namespace tessera::graph::testing;

TEST_CASE("candidates of the other operators: every valid strategy, once") {
  for (int n : {1, 2, 4, 8}) {
    check_candidates(ops::batch_matmul_op{}, {extents{4, 8, 16}, extents{4, 16, 8}}, n);
    check_candidates(ops::batch_matmul_op{{}, false, true}, {extents{4, 8, 16}, extents{8, 16}}, n);  // B shared
    check_candidates(ops::batch_matmul_op{{}, true, false}, {extents{16, 8}, extents{2, 16, 4}}, n);  // A shared
    check_candidates(ops::one_hot_op{{}, 8}, {extents{16}}, n, {2});  // the strategy splits the output (16, 8)
    check_candidates(ops::softmax_op{{}, -1}, {extents{8, 12}}, n);
    check_candidates(ops::log_softmax_op{{}, 0}, {extents{8, 4}}, n);
    check_candidates(ops::transpose_op{{}, {1, 0, 2}}, {extents{4, 8, 2}}, n);
    check_candidates(ops::reshape_op{{}, {2, 8, 6}}, {extents{16, 6}}, n);
    check_candidates(ops::flatten_op{}, {extents{4, 2, 6}}, n);
    check_candidates(ops::strided_slice_op{{}, {0, 2}, {8, 10}, {1, 2}}, {extents{8, 16}}, n);
    check_candidates(ops::concat_op{{}, 1}, {extents{8, 4}, extents{8, 12}}, n);
    check_candidates(ops::concat_op{{}, 0}, {extents{2, 8}, extents{4, 8}, extents{2, 8}}, n);
    check_candidates(ops::argmax_op{{}, -1}, {extents{16, 8}}, n);
    check_candidates(ops::sparse_softmax_cross_entropy_op{}, {extents{16, 8}, extents{16}}, n);
    check_candidates(ops::reduce_min_op{{}, {0}, true}, {extents{16, 24}}, n);
  }
  CHECK(keys(ops::concat_op{{}, 1}.candidates(2, {extents{4, 2}, extents{4, 6}})) ==
        std::vector<std::string>{"((2, 1), (2, 1))", "((1, 1), (1, 1))"});
  CHECK(keys(ops::one_hot_op{{}, 4}.candidates(2, {extents{4}})) ==
        std::vector<std::string>{"((2, 1),)", "((1, 2),)", "((1, 1),)"});
}

TEST_CASE("data_parallel strategies of the other operators") {
  CHECK(ops::batch_matmul_op{}.data_parallel(4, {extents{4, 8, 16}, extents{4, 16, 8}}) ==
        strategy{{4, 1, 1}, {4, 1, 1}});
  CHECK(ops::batch_matmul_op{}.data_parallel(4, {extents{8, 16}, extents{4, 16, 8}}) == strategy{{1, 1}, {4, 1, 1}});
  CHECK(ops::one_hot_op{{}, 8}.data_parallel(8, {extents{16}}) == strategy{{8, 1}});
  CHECK(ops::transpose_op{{}, {1, 0}}.data_parallel(8, {extents{4, 16}}) == strategy{{1, 8}});  // the output's dim 0
  CHECK(ops::flatten_op{}.data_parallel(2, {extents{4, 2, 3}}) == strategy{{2, 1, 1}});
  CHECK(ops::concat_op{{}, 1}.data_parallel(8, {extents{16, 4}, extents{16, 4}}) == strategy{{8, 1}, {8, 1}});
  CHECK(ops::concat_op{{}, 0}.data_parallel(8, {extents{16, 4}, extents{16, 4}}) == strategy{{1, 1}, {1, 1}});
  CHECK(ops::sparse_softmax_cross_entropy_op{}.data_parallel(4, {}) == strategy{{4, 1}, {4}});
  CHECK(ops::argmax_op{{}, 1}.data_parallel(2, {extents{4, 4}}) == strategy{{2, 1}});
}

TEST_CASE("collectives of the other operators, and what gets no gradient") {
  // Softmax over a split axis: row maxima and sums forward, the gradient's row sums.
  const auto sm = ops::collectives_of(ops::softmax_op{{}, -1}, strategy{{2, 4}}, 8, {extents{16, 8}}, 4);
  REQUIRE(sm.size() == 3);
  CHECK(sm[0].bytes == cost::all_reduce(8 * 4, 4));
  CHECK(sm[2].backward);
  CHECK(ops::collectives_of(ops::softmax_op{{}, -1}, strategy{{8, 1}}, 8, {extents{16, 8}}, 4).empty());
  // ArgMax over a split axis: the maxima, then 8-byte indices.
  const auto am = ops::collectives_of(ops::argmax_op{{}, -1}, strategy{{2, 4}}, 8, {extents{16, 8}}, 4);
  REQUIRE(am.size() == 2);
  CHECK(am[1].bytes == cost::all_reduce(8 * 8, 4));
  CHECK(am[1].op == reduce_op::min);
  const auto ce = ops::collectives_of(ops::sparse_softmax_cross_entropy_op{}, strategy{{2, 4}, {2}}, 8, {extents{16, 8}, extents{16}}, 4);
  REQUIRE(ce.size() == 4);
  CHECK(ce[1].bytes == cost::all_reduce(2 * 8 * 4, 4));
  // ReduceMin over two split dims: the minimum and the tie counts each resolved by one
  // AllReduce over the group of both axes.
  const auto rm = ops::collectives_of(ops::reduce_min_op{{}, {}, false}, strategy{{2, 4}}, 8, {extents{16, 8}}, 4);
  REQUIRE(rm.size() == 2);
  CHECK(rm[0].op == reduce_op::min);
  CHECK(rm[0].axes == axis_list{0, 1});
  CHECK(rm[0].bytes == cost::all_reduce(4, 8));
  CHECK(!ops::differentiable_in(ops::one_hot_op{{}, 4}, 0));
  CHECK(!ops::differentiable_in(ops::argmax_op{{}, 0}, 0));
  CHECK(!ops::differentiable_in(ops::sparse_softmax_cross_entropy_op{}, 1));
  CHECK(ops::differentiable_in(ops::sparse_softmax_cross_entropy_op{}, 0));
}

TEST_CASE("graph_builder: the other operators' shapes and errors") {
  graph_builder b;
  const value x = b.input("x", {16, 8}), labels = b.input("labels", {16});
  const value w = b.parameter("w", {2, 8, 4});
  CHECK(b.batch_matmul(b.reshape(x, {2, 8, 8}), w).shape() == extents{2, 8, 4});
  CHECK(b.reshape(x, {-1, 4}).shape() == extents{32, 4});
  CHECK(b.flatten(b.reshape(x, {16, 2, 4})).shape() == extents{16, 8});
  CHECK(b.transpose(x, {1, 0}).shape() == extents{8, 16});
  CHECK(b.strided_slice(x, {0, 1}, {16, 8}, {2, 3}).shape() == extents{8, 3});
  CHECK(b.concat({x, x, x}, -1).shape() == extents{16, 24});
  CHECK(b.one_hot(labels, 10).shape() == extents{16, 10});
  CHECK(b.softmax(x).shape() == extents{16, 8});
  CHECK(b.log_softmax(x, 0).shape() == extents{16, 8});
  CHECK(b.argmax(x).shape() == extents{16});
  CHECK(b.reduce_min(x, {1}, true).shape() == extents{16, 1});
  CHECK(b.sparse_softmax_cross_entropy(x, labels).shape() == extents{16});
  // OneHot's strategy splits the output: one entry per output dim.
  const value oh = b.one_hot(labels, 8);
  CHECK(oh.shard({{2, 4}}).id() == oh.id());
  CHECK(oh.shard({{8, 1}, {}, {}}).id() == oh.id());  // MindSpore's form with the on and off values
  CHECK_THROWS_WITH_AS(oh.shard({{2}}), "graph: OneHot 'one_hot2': one_hot: the strategy splits the output, whose "
                                        "shape is indices.shape + (depth,): 1 entries for an output of rank 2; "
                                        "strategy ((2,),)", error);
  CHECK_THROWS_WITH_AS(b.reshape(x, {3, 5}), "graph: Reshape 'reshape4': reshape: the target shape must have the "
                                             "input's number of elements: the input has 128 elements, the target 15", error);
  CHECK_THROWS_WITH_AS(b.concat({x, labels}, 0), "graph: Concat 'concat2': concat: every input must have input 0's "
                                                 "rank: input 1 has rank 1, input 0 2", error);
  CHECK_THROWS_WITH_AS(b.softmax(x, 2), "graph: Softmax 'softmax2': softmax: the axis must name a dim of the input: "
                                        "axis 2, input rank 2", error);
  CHECK_THROWS_WITH_AS(b.batch_matmul(x, x), "graph: BatchMatMul 'batch_matmul2': batch_matmul: at least one input "
                                             "must have batch dims (rank 3 or more): inputs have ranks 2 and 2", error);
}
