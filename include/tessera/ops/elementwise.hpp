// Sharded element-wise operators with broadcasting: Add, Sub, Mul, Div, ReLU, Exp,
// Log, Neg, BiasAdd, Sigmoid and Tanh. The sharding rule is ops/elementwise_rule.hpp, the local math
// the tensors' device's backend (kernels/backend.hpp). Inputs in other layouts are
// redistributed first.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/kernels/fused.hpp>
#include <tessera/ops/elementwise_rule.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// The rule's layouts when partial sums pass through (see partial_pass).
constexpr elementwise_layouts with_pass(elementwise_layouts r, const partial_pass& p) {
  if (!p.passes()) return r;
  for (int i = 0; i < r.n; ++i) {
    r.in[i] = p.input(r.in[i], i);
    r.grad[i] = p.input_grad(r.grad[i], i);
  }
  r.out = p.output(r.out);
  r.dev = p.dev;
  return r;
}

namespace detail {

// The fused activation of Sigmoid and Tanh (kernels/fused.hpp).
constexpr kernels::fused::activation activation_of(elementwise_kind k) {
  return k == elementwise_kind::sigmoid ? kernels::fused::activation::sigmoid : kernels::fused::activation::tanh;
}

// The inputs in the rule's layouts, with the rule; partial sums pass through an input
// the operator is linear in (ops/linear_rule.hpp), the others are resolved.
template <class T, class D, std::size_t N>
struct elementwise_inputs {
  elementwise_layouts r;
  std::array<laid_out<T, D>, N> x;
};

template <elementwise_kind K, class T, class D, class C, class... X>
elementwise_inputs<T, D, sizeof...(X)> elementwise_prepare(const elementwise_op<K>& op,
                                                           device_context<C>& ctx, const X&... x) {
  static_assert(sizeof...(X) == std::size_t(kind_arity(K)));
  elementwise_layouts r = op.rule(ctx.size(), shape_list{x.global_shape()...});
  const std::array<layout, sizeof...(X)> actual{x.layout()...};
  r = with_pass(r, pass_partial(kind_linearity(K), actual.data(), r.in.data(), r.n, r.out));
  int i = 0;
  auto place = [&](const tensor_on<T, D>& t) { return in_layout(t, r.in[i++], ctx); };
  return {r, {place(x)...}};
}

// The local forward of operator K on shards already in the rule's layouts.
template <elementwise_kind K, class T, class D, std::size_t N>
auto elementwise_local(const std::array<laid_out<T, D>, N>& x) {
  using k = kernels::backend<D>;
  using enum elementwise_kind;
  if constexpr (K == add) return k::add(x[0]->local(), x[1]->local());
  else if constexpr (K == sub) return k::sub(x[0]->local(), x[1]->local());
  else if constexpr (K == mul) return k::mul(x[0]->local(), x[1]->local());
  else if constexpr (K == div) return k::div(x[0]->local(), x[1]->local());
  else if constexpr (K == bias_add) return k::bias_add(x[0]->local(), x[1]->local());
  else if constexpr (K == relu) return k::relu(x[0]->local());
  else if constexpr (K == sigmoid || K == tanh)
    return k::template fused_map<T>(kind_name(K).data(), kernels::fused::act_value<activation_of(K)>{}, x[0]->local());
  else if constexpr (K == exp) return k::exp(x[0]->local());
  else if constexpr (K == log) return k::log(x[0]->local());
  else return k::neg(x[0]->local());
}

// The local gradient of input `i` before it is summed back to the input's shard shape
// (the output's shard shape where the input broadcasts). A unary operator's is one
// fused pass over dy, written over dy's own elements when dy is an rvalue (the shards'
// shapes are dy's: nothing broadcasts).
template <elementwise_kind K, class T, class D, std::size_t N, class Dy>
auto elementwise_local_grad(Dy&& dy, const std::array<laid_out<T, D>, N>& x, int i) {
  using k = kernels::backend<D>;
  using A = typename tensor_on<T, D>::array_type;
  using enum elementwise_kind;
  namespace fused = kernels::fused;
  if constexpr (K == add || K == bias_add) return A(dy);
  else if constexpr (K == sub) return i == 0 ? A(dy) : k::neg(dy);
  else if constexpr (K == mul) return k::mul(dy, x[1 - i]->local());
  else if constexpr (K == div) {
    const A& a = x[0]->local();
    const A& b = x[1]->local();
    if (i == 0) return k::div(dy, b);
    // -dy a / b^2: one fused pass where nothing broadcasts (the shards' shapes are
    // equal, so dy's is theirs), else the broadcasting steps.
    if (x[0]->local_shape() == x[1]->local_shape())
      return k::template fused_map<T>("div_backward", fused::div_grad_divisor{}, dy, a, b);
    return k::neg(k::div(k::mul(dy, a), k::mul(b, b)));
  } else if constexpr (K == relu) {
    // From the output, or the input: either is positive exactly where the input is.
    return k::template fused_map<T>("relu_backward", fused::act_grad<fused::activation::relu>{},
                                    std::forward<Dy>(dy), x[0]->local());
  } else if constexpr (K == sigmoid || K == tanh) {
    // The derivative from the output (one pass each for the output and the gradient).
    constexpr auto a = activation_of(K);
    const A y = k::template fused_map<T>(kind_name(K).data(), fused::act_value<a>{}, x[0]->local());
    return k::template fused_map<T>(kind_name(K).data(), fused::act_grad<a>{}, std::forward<Dy>(dy), y);
  } else if constexpr (K == exp) {
    return k::template fused_map<T>("exp_backward", fused::exp_grad{}, std::forward<Dy>(dy), x[0]->local());
  } else if constexpr (K == log) {
    return k::template fused_map<T>("log_backward", fused::log_grad{}, std::forward<Dy>(dy), x[0]->local());
  } else {
    return k::template fused_map<T>("neg_backward", fused::neg_grad{}, std::forward<Dy>(dy));
  }
}

template <elementwise_kind K, class T, class D, class C, class... X>
tensor_on<T, D> elementwise_forward(const elementwise_op<K>& op, device_context<C>& ctx, const X&... x) {
  const auto in = elementwise_prepare<K, T, D>(op, ctx, x...);
  return tensor_on<T, D>(in.r.out, in.r.shape, ctx.rank(), elementwise_local<K, T, D>(in.x));
}

// dy is brought to the output's layout (its partial sums resolved: the gradient reaches
// every term); input i's gradient is the local gradient summed over the dims the input
// broadcasts, in the rule's grad layout (partial where the output is split along them).
// `given`: dy itself when the caller gave it away (an rvalue), else null. dy in the
// output's layout is then this call's to write over, as is its redistributed copy when
// it had to be moved there: a unary operator's gradient is computed over its elements,
// and Add's last input takes them as its gradient where that input does not broadcast
// (ResNet's residual Adds), instead of a new array each.
template <elementwise_kind K, class T, class D, class C, class... X>
std::array<tensor_on<T, D>, sizeof...(X)> elementwise_backward_of(const elementwise_op<K>& op,
                                                                  const tensor_on<T, D>& dy, tensor_on<T, D>* given,
                                                                  device_context<C>& ctx, const X&... x) {
  const auto in = elementwise_prepare<K, T, D>(op, ctx, x...);
  if (!(dy.global_shape() == in.r.shape))
    throw error(std::string(kind_name(K)) + "_backward: dy is " + to_string(dy.global_shape()) +
                ", expected " + to_string(in.r.shape));
  auto ldy = in_layout(dy, in.r.out.without_partial(), ctx);
  tensor_on<T, D>* mine = ldy.owned();  // dy's elements in the output's layout, ours to write over
  if (!mine && given && &*ldy == given) mine = given;
  int i = 0;
  auto grad = [&](const tensor_on<T, D>& xi) {
    if constexpr (K == elementwise_kind::add) {
      if (mine && i + 1 == int(sizeof...(X)) && extents_of(mine->local().shape()) == in.x[i]->local_shape()) {
        tensor_on<T, D> g(in.r.grad[i], xi.global_shape(), ctx.rank(), std::move(mine->local()));
        ++i;
        return g;
      }
    }
    if constexpr (kind_arity(K) == 1) {
      if (mine && extents_of(mine->local().shape()) == in.x[i]->local_shape()) {
        tensor_on<T, D> g(in.r.grad[i], xi.global_shape(), ctx.rank(),
                          elementwise_local_grad<K, T, D>(std::move(mine->local()), in.x, i));
        ++i;
        return g;
      }
    }
    auto local = elementwise_local_grad<K, T, D>(ldy->local(), in.x, i);
    // Summed back where the input broadcasts; as it is (not copied) where it does not.
    const bool broadcast = !(extents_of(local.shape()) == in.x[i]->local_shape());
    tensor_on<T, D> g(in.r.grad[i], xi.global_shape(), ctx.rank(),
                      broadcast ? kernels::backend<D>::reduce_to_shape(local, in.x[i]->local_shape())
                                : std::move(local));
    ++i;
    return g;
  };
  return {grad(x)...};
}

template <elementwise_kind K, class T, class D, class C, class... X>
std::array<tensor_on<T, D>, sizeof...(X)> elementwise_backward(const elementwise_op<K>& op,
                                                               const tensor_on<T, D>& dy,
                                                               device_context<C>& ctx, const X&... x) {
  return elementwise_backward_of<K, T, D>(op, dy, nullptr, ctx, x...);
}

}  // namespace detail

/// a + b with broadcasting, on this rank's shards. a and b are redistributed to the
/// rule's layouts if they are not in them; the result is in the rule's output layout.
template <class T, class D, class C>
tensor_on<T, D> add(const add_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                   device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::add, T, D>(op, ctx, a, b);
}
/// a - b with broadcasting (see add).
template <class T, class D, class C>
tensor_on<T, D> sub(const sub_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                   device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::sub, T, D>(op, ctx, a, b);
}
/// a * b with broadcasting (see add).
template <class T, class D, class C>
tensor_on<T, D> mul(const mul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                   device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::mul, T, D>(op, ctx, a, b);
}
/// a / b with broadcasting (see add).
template <class T, class D, class C>
tensor_on<T, D> div(const div_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                   device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::div, T, D>(op, ctx, a, b);
}
/// x + bias along x's last dim: x (..., c), bias (c,); strategy ((..., s), (s,)).
template <class T, class D, class C>
tensor_on<T, D> bias_add(const bias_add_op& op, const tensor_on<T, D>& x, const tensor_on<T, D>& bias,
                        device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::bias_add, T, D>(op, ctx, x, bias);
}
/// max(x, 0) on this rank's shard, in the strategy's layout.
template <class T, class D, class C>
tensor_on<T, D> relu(const relu_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::relu, T, D>(op, ctx, x);
}
/// e^x (see relu).
template <class T, class D, class C>
tensor_on<T, D> exp(const exp_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::exp, T, D>(op, ctx, x);
}
/// The natural log (see relu).
template <class T, class D, class C>
tensor_on<T, D> log(const log_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::log, T, D>(op, ctx, x);
}
/// -x (see relu).
template <class T, class D, class C>
tensor_on<T, D> neg(const neg_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::elementwise_forward<elementwise_kind::neg, T, D>(op, ctx, x);
}

// ---- backward: the inputs' gradients in the rule's grad layouts ---------------------
//
// Each takes dy (any layout of the output's shape) and the forward inputs, and returns
// dx_i in rule.grad[i]: x_i's layout, partial sums over the mesh axes that split an
// output dim x_i broadcasts. Example: bias_add ((2, 4), (4,)) on 8 devices: dbias is
// split 4 ways over axis 1 and partial over axis 0, the rows' axis.

/// (da, db) of y = a + b: dy summed back to each input's shape.
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> add_backward(const add_op& op, const tensor_on<T, D>& dy,
                                                       const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                                       device_context<C>& ctx) {
  auto g = detail::elementwise_backward<elementwise_kind::add, T, D>(op, dy, ctx, a, b);
  return {std::move(g[0]), std::move(g[1])};
}
/// (da, db) of y = a - b: dy and -dy, summed back to each input's shape.
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> sub_backward(const sub_op& op, const tensor_on<T, D>& dy,
                                                       const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                                       device_context<C>& ctx) {
  auto g = detail::elementwise_backward<elementwise_kind::sub, T, D>(op, dy, ctx, a, b);
  return {std::move(g[0]), std::move(g[1])};
}
/// (da, db) of y = a * b: dy b and dy a, summed back to each input's shape.
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> mul_backward(const mul_op& op, const tensor_on<T, D>& dy,
                                                       const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                                       device_context<C>& ctx) {
  auto g = detail::elementwise_backward<elementwise_kind::mul, T, D>(op, dy, ctx, a, b);
  return {std::move(g[0]), std::move(g[1])};
}
/// (da, db) of y = a / b: dy / b and -dy a / b^2, summed back to each input's shape.
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> div_backward(const div_op& op, const tensor_on<T, D>& dy,
                                                       const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                                       device_context<C>& ctx) {
  auto g = detail::elementwise_backward<elementwise_kind::div, T, D>(op, dy, ctx, a, b);
  return {std::move(g[0]), std::move(g[1])};
}
/// (dx, dbias) of y = bias_add(x, bias): dy, and dy summed over every dim but the last
/// (partial over the mesh axes that split those dims).
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> bias_add_backward(const bias_add_op& op,
                                                            const tensor_on<T, D>& dy,
                                                            const tensor_on<T, D>& x,
                                                            const tensor_on<T, D>& bias,
                                                            device_context<C>& ctx) {
  auto g = detail::elementwise_backward<elementwise_kind::bias_add, T, D>(op, dy, ctx, x, bias);
  return {std::move(g[0]), std::move(g[1])};
}
/// dx of y = relu(x): dy where x > 0, else 0.
template <class T, class D, class C>
tensor_on<T, D> relu_backward(const relu_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                             device_context<C>& ctx) {
  return std::move(detail::elementwise_backward<elementwise_kind::relu, T, D>(op, dy, ctx, x)[0]);
}
/// dx of y = exp(x): dy e^x.
template <class T, class D, class C>
tensor_on<T, D> exp_backward(const exp_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                            device_context<C>& ctx) {
  return std::move(detail::elementwise_backward<elementwise_kind::exp, T, D>(op, dy, ctx, x)[0]);
}
/// dx of y = log(x): dy / x.
template <class T, class D, class C>
tensor_on<T, D> log_backward(const log_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                            device_context<C>& ctx) {
  return std::move(detail::elementwise_backward<elementwise_kind::log, T, D>(op, dy, ctx, x)[0]);
}
/// dx of y = -x: -dy.
template <class T, class D, class C>
tensor_on<T, D> neg_backward(const neg_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                            device_context<C>& ctx) {
  return std::move(detail::elementwise_backward<elementwise_kind::neg, T, D>(op, dy, ctx, x)[0]);
}

/// The element-wise operators' forward and backward as every operator's (ops/run.hpp).
template <elementwise_kind K, class T, class D, class C>
tensor_on<T, D> forward(const elementwise_op<K>& op, op_inputs<T, D> x, device_context<C>& ctx) {
  if constexpr (kind_arity(K) == 2) return detail::elementwise_forward<K, T, D>(op, ctx, *x[0], *x[1]);
  else return detail::elementwise_forward<K, T, D>(op, ctx, *x[0]);
}
namespace detail {

// Both forms of backward below; `given` as elementwise_backward_of's.
template <elementwise_kind K, class T, class D, class C>
op_grads<T, D> elementwise_op_backward(const elementwise_op<K>& op, const tensor_on<T, D>& dy, tensor_on<T, D>* given,
                                       op_inputs<T, D> x, const tensor_on<T, D>& y, device_context<C>& ctx) {
  if constexpr (kind_arity(K) == 2) {
    auto g = elementwise_backward_of<K, T, D>(op, dy, given, ctx, *x[0], *x[1]);
    return grads_of(std::move(g[0]), std::move(g[1]));
  } else if constexpr (K == elementwise_kind::relu) {
    // The mask from the output, which is what a graph keeps (backward_reads_output):
    // y > 0 exactly where x > 0. y has x's shape and layout, so x is not read.
    (void)x;
    auto g = elementwise_backward_of<K, T, D>(op, dy, given, ctx, y);
    return grads_of(std::move(g[0]));
  } else {
    (void)y;
    auto g = elementwise_backward_of<K, T, D>(op, dy, given, ctx, *x[0]);
    return grads_of(std::move(g[0]));
  }
}

}  // namespace detail

template <elementwise_kind K, class T, class D, class C>
op_grads<T, D> backward(const elementwise_op<K>& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>& y, device_context<C>& ctx) {
  return detail::elementwise_op_backward<K, T, D>(op, dy, nullptr, x, y, ctx);
}
/// The backward with dy given away (ops::run_backward's rvalue form, as the tape runs
/// it): a unary operator's gradient is written over dy's elements, and Add's second
/// input takes them as its gradient where it can (elementwise_backward_of); Add's first
/// input's is a copy.
template <elementwise_kind K, class T, class D, class C>
op_grads<T, D> backward(const elementwise_op<K>& op, tensor_on<T, D>&& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>& y, device_context<C>& ctx) {
  return detail::elementwise_op_backward<K, T, D>(op, dy, &dy, x, y, ctx);
}

}  // namespace tessera::ops
