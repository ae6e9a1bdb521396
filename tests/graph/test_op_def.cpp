// The operators of the graph: each one's candidate strategies are exactly the
// strategies its rule accepts that split every tensor evenly (compared with an
// enumeration of every split tuple), in the documented order; its data-parallel
// strategy; the layouts of its backward; the collectives it runs inside itself.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/graph/op_def.hpp>
#include "candidates.hpp"

using namespace tessera;
using namespace tessera::graph;
using namespace tessera::graph::testing;

TEST_CASE("candidates: every valid strategy, once") {
  for (int n : {1, 2, 4, 6, 8}) {
    check_candidates(ops::matmul_op{}, {extents{16, 24}, extents{24, 8}}, n);
    check_candidates(ops::matmul_op{{}, true, false}, {extents{24, 16}, extents{24, 8}}, n);
    check_candidates(ops::matmul_op{{}, false, true}, {extents{16, 24}, extents{8, 24}}, n);
    check_candidates(ops::matmul_op{}, {extents{6, 4}, extents{4, 2}}, n);  // splits limited by the extents
    check_candidates(ops::add_op{}, {extents{16, 24}, extents{16, 24}}, n);
    check_candidates(ops::add_op{}, {extents{16, 24}, extents{24}}, n);    // broadcast: the bias dim only
    check_candidates(ops::sub_op{}, {extents{16, 1}, extents{16, 24}}, n);  // extent 1 never split
    check_candidates(ops::bias_add_op{}, {extents{8, 4, 6}, extents{6}}, n);
    check_candidates(ops::relu_op{}, {extents{12, 8}}, n);
    check_candidates(ops::exp_op{}, {extents{}}, n);  // a scalar: the empty strategy
    check_candidates(ops::reduce_sum_op{{}, {1}, false}, {extents{16, 24}}, n);
    check_candidates(ops::reduce_mean_op{{}, {}, false}, {extents{8, 4, 6}}, n);
    check_candidates(ops::reduce_max_op{{}, {0}, true}, {extents{16, 24}}, n);
    check_candidates(ops::softmax_cross_entropy_op{}, {extents{16, 10}, extents{16, 10}}, n);
  }
}

TEST_CASE("candidates: more devices first, then larger splits of earlier dims") {
  const shape_list mm{extents{4, 4}, extents{4, 4}};
  CHECK(keys(ops::matmul_op{}.candidates(2, mm)) ==
        std::vector<std::string>{"((2, 1), (1, 1))", "((1, 2), (2, 1))", "((1, 1), (1, 2))", "((1, 1), (1, 1))"});
  CHECK(keys(ops::relu_op{}.candidates(4, {extents{4, 4}})) ==
        std::vector<std::string>{"((4, 1),)", "((2, 2),)", "((1, 4),)", "((2, 1),)", "((1, 2),)", "((1, 1),)"});
  CHECK(keys(ops::add_op{}.candidates(2, {extents{4, 6}, extents{6}})) ==
        std::vector<std::string>{"((2, 1), (1,))", "((1, 2), (2,))", "((1, 1), (1,))"});
  CHECK(keys(ops::softmax_cross_entropy_op{}.candidates(2, {extents{4, 6}, extents{4, 6}})) ==
        std::vector<std::string>{"((2, 1), (2, 1))", "((1, 2), (1, 2))", "((1, 1), (1, 1))"});
  // The first candidate on 8 devices of the seed's MatMul is data parallel.
  CHECK(to_string(ops::matmul_op{}.candidates(8, {extents{16, 32}, extents{32, 16}})[0]) == "((8, 1), (1, 1))");
}

TEST_CASE("data_parallel: the batch split over every device") {
  CHECK(ops::matmul_op{}.data_parallel(8, {}) == strategy{{8, 1}, {1, 1}});
  CHECK(ops::matmul_op{{}, true, false}.data_parallel(8, {}) == strategy{{1, 8}, {1, 1}});
  CHECK(ops::matmul_op{{}, false, true}.data_parallel(4, {}) == strategy{{4, 1}, {1, 1}});
  CHECK(ops::bias_add_op{}.data_parallel(8, {extents{16, 4}, extents{4}}) == strategy{{8, 1}, {1}});
  CHECK(ops::add_op{}.data_parallel(2, {extents{6}, extents{4, 6}}) == strategy{{1}, {2, 1}});
  CHECK(ops::exp_op{}.data_parallel(8, {extents{}}) == strategy{split_tuple{}});
  CHECK(ops::reduce_sum_op{{}, {0}, false}.data_parallel(8, {extents{16, 4}}) == strategy{{8, 1}});
  CHECK(ops::softmax_cross_entropy_op{}.data_parallel(4, {}) == strategy{{4, 1}, {4, 1}});
  CHECK(ops::all_reduce_op{}.data_parallel(8, {extents{16, 4}}) == strategy{{1, 1}});
}

TEST_CASE("layouts: the rules' layouts, and the backward's") {
  // MatMul ((2, 4), (4, 1)) on 8 devices: the seed's.
  const op_layouts m = ops::matmul_op{}.layouts(strategy{{2, 4}, {4, 1}}, 8, {});
  CHECK(m.dev == mesh{2, 4, 1});
  CHECK(m.out == layout(mesh{2, 4, 1}, {{0}, {2}}).with_partial(1));
  CHECK(m.out_grad == layout(mesh{2, 4, 1}, {{0}, {2}}));  // the backward takes dC whole over k
  CHECK(m.in_grad[0] == m.in[0]);                          // n = 1: dA complete
  CHECK(m.in_grad[1] == m.in[1].with_partial(0));          // dB partial over the rows' axis
  // ReduceSum over dim 1 split 4 ways: the output is partial, the gradient is not.
  const op_layouts r = ops::reduce_sum_op{{}, {1}, false}.layouts(strategy{{2, 4}}, 8, {extents{16, 32}});
  CHECK(r.out == layout(mesh{2, 4}, {{0}}).with_partial(1));
  CHECK(r.out_grad == layout(mesh{2, 4}, {{0}}));
  CHECK(r.in_grad[0] == r.in[0]);
  // BiasAdd: dbias partial over the rows' axis.
  const op_layouts ba = ops::bias_add_op{}.layouts(strategy{{2, 4}, {4}}, 8, {extents{16, 32}, extents{32}});
  CHECK(ba.in_grad[1] == ba.in[1].with_partial(0));
  CHECK(ba.out_grad == ba.out);
  // Cross entropy: labels get no gradient.
  const ops::softmax_cross_entropy_op ce;
  CHECK(ops::differentiable_in(ce, 0));
  CHECK(!ops::differentiable_in(ce, 1));
  CHECK(ops::differentiable_in(ops::matmul_op{}, 1));
}

TEST_CASE("collectives: what an operator runs inside itself") {
  const ops::softmax_cross_entropy_op ce;
  const shape_list in{extents{16, 8}, extents{16, 8}};
  CHECK(ops::collectives_of(ce, strategy{{8, 1}, {8, 1}}, 8, in, 4).empty());
  // Classes split 4 ways: rows of 8 per rank; the maxima (8 floats) and the three row
  // sums (24 floats) all-reduced over the class axis, forward and backward.
  const auto c = ops::collectives_of(ce, strategy{{2, 4}, {2, 4}}, 8, in, 4);
  REQUIRE(c.size() == 4);
  CHECK(c[0].op == reduce_op::max);
  CHECK(c[0].bytes == cost::all_reduce(32, 4));
  CHECK(c[1].bytes == cost::all_reduce(96, 4));
  CHECK(!c[0].backward);
  CHECK(c[2].backward);
  CHECK(c[0].dev == mesh{2, 4});
  CHECK(c[0].axes == axis_list{1});
  // ReduceMax over a split dim: its backward resolves the maxima and the tie counts.
  const ops::reduce_max_op mx{{}, {1}, false};
  CHECK(ops::collectives_of(mx, strategy{{8, 1}}, 8, {extents{16, 8}}, 4).empty());
  const auto r = ops::collectives_of(mx, strategy{{2, 4}}, 8, {extents{16, 8}}, 4);
  REQUIRE(r.size() == 2);
  CHECK(r[0].bytes == cost::all_reduce(8 * 4, 4));
  CHECK(r[0].backward);
  // The hybrid AllReduce: over all ranks, or a group.
  CHECK(ops::collectives_of(ops::all_reduce_op{}, strategy{{1, 1}}, 8, {extents{4, 4}}, 4)[0].bytes == cost::all_reduce(64, 8));
  const ops::all_reduce_op grouped{{}, mesh{2, 4}, {1}};
  CHECK(ops::collectives_of(grouped, strategy{{1, 1}}, 8, {extents{4, 4}}, 4)[0].bytes == cost::all_reduce(64, 4));
  CHECK(grouped.attributes() == "op: sum, group: mesh (2, 4) axes (1,)");
}
