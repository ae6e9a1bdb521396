// The calling convention of an operator's forward and backward (ops/definition.hpp):
// the inputs as a span of tensors, the gradients as one optional tensor per input, and
// run_internal, through which an operator runs the collectives its definition lists
// (so that the elements it moves are the ones the graph prices).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// An operator's inputs, in order: forward(op, x, ctx) reads *x[i].
template <class T, class D = cpu_device>
using op_inputs = std::span<const tensor_on<T, D>* const>;

/// An operator's input gradients, one per input: nullopt where an input gets none (labels,
/// indices).
template <class T, class D = cpu_device>
using op_grads = std::vector<std::optional<tensor_on<T, D>>>;

/// The gradients of a backward, one per argument: grads_of(std::move(da), std::move(db)).
template <class T, class D, class... More>
op_grads<T, D> grads_of(tensor_on<T, D>&& first, More&&... more) {
  op_grads<T, D> g;
  g.reserve(1 + sizeof...(More));
  g.emplace_back(std::move(first));
  (g.emplace_back(std::move(more)), ...);
  return g;
}

/// Runs `op` forward: its forward(op, x, ctx), found by argument-dependent lookup (in
/// the namespace of the operator's type, or of a base it derives from).
template <class Op, class T, class D, class C>
tensor_on<T, D> run_forward(const Op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return forward(op, x, ctx);
}

/// The inputs whose gradients a backward is asked for: all of them unless the caller
/// says (autodiff::apply asks for those of inputs that require a gradient).
struct grads_wanted {
  std::uint64_t bits = ~std::uint64_t(0);
  /// Whether input i's gradient is wanted.
  bool operator[](std::size_t i) const { return i >= 64 || ((bits >> i) & 1u); }
  /// Marks input i's gradient as not wanted.
  void skip(std::size_t i) {
    if (i < 64) bits &= ~(std::uint64_t(1) << i);
  }
};

namespace detail {

template <class Op, class T, class D, class C, class Dy>
op_grads<T, D> run_backward(const Op& op, Dy&& dy, op_inputs<T, D> x, const tensor_on<T, D>& y,
                            device_context<C>& ctx, grads_wanted want) {
  constexpr bool takes_want = requires { backward(op, dy, x, y, ctx, want); };
  if constexpr (!takes_want && !requires { backward(op, dy, x, y, ctx); }) {
    throw error(std::string(Op::name()) + ": has no backward (none of its inputs is differentiable)");
  } else {
    op_grads<T, D> g;
    if constexpr (takes_want) g = backward(op, std::forward<Dy>(dy), x, y, ctx, want);
    else g = backward(op, std::forward<Dy>(dy), x, y, ctx);
    if (g.size() != x.size())
      throw error(std::string(Op::name()) + ": the backward gave " + std::to_string(g.size()) + " gradients for " +
                  std::to_string(x.size()) + " inputs");
    return g;
  }
}

}  // namespace detail

/// Runs `op` backward: its backward(op, dy, x, y, ctx), found as run_forward finds its
/// forward, or backward(op, dy, x, y, ctx, want) where the operator takes `want`; one
/// gradient per input (nullopt where an input gets none; the inputs `want` skips may
/// get one or not).
template <class Op, class T, class D, class C>
op_grads<T, D> run_backward(const Op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x, const tensor_on<T, D>& y,
                            device_context<C>& ctx, grads_wanted want = {}) {
  return detail::run_backward(op, dy, x, y, ctx, want);
}
/// As above with dy given away: an operator whose backward takes dy as an rvalue (the
/// element-wise ones) may hand its elements on as an input's gradient, or write that
/// gradient over them, instead of a new array.
template <class Op, class T, class D, class C>
op_grads<T, D> run_backward(const Op& op, tensor_on<T, D>&& dy, op_inputs<T, D> x, const tensor_on<T, D>& y,
                            device_context<C>& ctx, grads_wanted want = {}) {
  return detail::run_backward(op, std::move(dy), x, y, ctx, want);
}

/// Runs the internal collective `c` of an operator's definition on `buf`, this rank's
/// buffer of exactly c.elements elements: the AllReduce (c.op) over c.axes of c.dev. A
/// buffer of another size is a defect of the operator, reported with both numbers.
template <class U, class C>
void run_internal(const internal_collective& c, std::span<U> buf, device_context<C>& ctx, std::string_view op) {
  if (index_t(buf.size()) != c.elements)
    throw error(std::string(op) + ": the " + c.purpose + " buffer has " + std::to_string(buf.size()) +
                " elements, the definition's collective " + std::to_string(c.elements));
  if (c.axes.empty() || group_size(c.dev, c.axes) == 1) return;
  ctx.on(c.dev).group(c.axes).all_reduce(buf, c.op);
}

}  // namespace tessera::ops
