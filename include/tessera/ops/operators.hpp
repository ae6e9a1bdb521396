// The library's operators: every definition of ops/ (one type each, ops/definition.hpp)
// and the list the graph executor runs without being told (graph/execute.hpp; an
// operator defined elsewhere is added with executor::add_operator<Op>()). Standard
// library only: the forwards and backwards are in ops/<name>.hpp (autodiff/ops.hpp
// includes them all).
#pragma once

#include <tessera/ops/all_reduce_rule.hpp>
#include <tessera/ops/argmax_rule.hpp>
#include <tessera/ops/batch_matmul_rule.hpp>
#include <tessera/ops/batch_norm_rule.hpp>
#include <tessera/ops/conv2d_rule.hpp>
#include <tessera/ops/dropout_rule.hpp>
#include <tessera/ops/elementwise_rule.hpp>
#include <tessera/ops/matmul_rule.hpp>
#include <tessera/ops/one_hot_rule.hpp>
#include <tessera/ops/pool2d_rule.hpp>
#include <tessera/ops/reduce_rule.hpp>
#include <tessera/ops/shape_rule.hpp>
#include <tessera/ops/softmax_axis_rule.hpp>
#include <tessera/ops/softmax_rule.hpp>
#include <tessera/ops/sparse_cross_entropy_rule.hpp>

namespace tessera::ops {

/// A list of types.
template <class... Ts>
struct type_list {};

/// Every operator of the library.
using builtin_operators =
    type_list<matmul_op, batch_matmul_op, add_op, sub_op, mul_op, div_op, bias_add_op, relu_op, exp_op, log_op, neg_op,
              sigmoid_op, tanh_op, reduce_sum_op, reduce_mean_op, reduce_max_op, reduce_min_op,
              softmax_cross_entropy_op, sparse_softmax_cross_entropy_op, softmax_op, log_softmax_op, transpose_op,
              reshape_op, flatten_op, strided_slice_op, concat_op, one_hot_op, argmax_op, all_reduce_op, dropout_op,
              conv2d_op, max_pool2d_op, avg_pool2d_op, batch_norm_op>;

namespace detail {
template <class... Ops>
constexpr bool all_definitions(type_list<Ops...>) {
  return (operator_definition<Ops> && ...);
}
}  // namespace detail

static_assert(detail::all_definitions(builtin_operators{}),
              "ops: every operator of the library models operator_definition");

}  // namespace tessera::ops
