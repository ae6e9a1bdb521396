// The layers: Dense (MindSpore's nn.Dense, with its activation fused into the
// product's epilogue), ReLU, Sigmoid, Tanh, Flatten, Dropout, BatchNorm2d and
// SequentialCell. Each
// forward pass runs on tape values (autodiff::var), so value_and_grad differentiates a
// network of them. Without a strategy, a layer runs
// data parallel: Dense multiplies this rank's rows of the batch by replicated weights
// and the element-wise layers keep their input's layout, all on local shards without
// communication; with one (`shard`) the sharded operators of ops/ run it. Every layer
// takes the device of its parameters and tape values as a second template argument.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/kernels/fused.hpp>
#include <tessera/nn/init.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/ops/batch_norm.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/matmul.hpp>

namespace tessera::nn {

/// The activations nn::dense fuses (MindSpore's Dense(..., activation='relu')): none,
/// relu, sigmoid, tanh (kernels/fused.hpp).
using activation = kernels::fused::activation;

namespace detail {

/// The value of `x` with its partial sums resolved: `x` itself when it holds none, else
/// a node on the tape that redistributes it to the same layout without partial axes
/// (the gradient of that sum reaches every partial term unchanged).
template <class T, class D>
autodiff::var<T, D> resolved(autodiff::var<T, D> x) {
  const tensor_on<T, D>& v = x.value();
  if (!v.layout().has_partial()) return x;
  autodiff::tape<T, D>& t = *x.t;
  tensor_on<T, D> r = redistribute(v, v.layout().without_partial(), t.ctx());
  return t.record(std::move(r),
                  [ix = x.id](autodiff::tape<T, D>& tp, tensor_on<T, D>&& g) { tp.add_grad(ix, std::move(g)); },
                  t.requires_grad(x.id));
}

/// Whether D is the host (the layers' host paths are written against xtensor).
template <class D>
inline constexpr bool on_host = std::is_same_v<D, cpu_device>;

/// f(std::integral_constant<activation, a>{}) for the run-time activation a: the
/// fused kernels take the activation as a type.
template <class F>
decltype(auto) with_activation(kernels::fused::activation a, F&& f) {
  using kernels::fused::activation;
  switch (a) {
    case activation::relu: return f(std::integral_constant<activation, activation::relu>{});
    case activation::sigmoid: return f(std::integral_constant<activation, activation::sigmoid>{});
    case activation::tanh: return f(std::integral_constant<activation, activation::tanh>{});
    default: return f(std::integral_constant<activation, activation::none>{});
  }
}

/// act(x) on x's shards, in x's layout (partial sums resolved first), one fused pass;
/// the backward is one pass too, dy * act'(x) from the output.
template <class T, class D>
autodiff::var<T, D> activate(autodiff::var<T, D> x, kernels::fused::activation a, const char* fn) {
  using K = kernels::backend<D>;
  x = resolved(x);
  autodiff::tape<T, D>& t = *x.t;
  const tensor_on<T, D>& xv = x.value();
  auto y = with_activation(a, [&](auto A) {
    return K::template fused_map<T>(fn, kernels::fused::act_value<A.value>{}, xv.local());
  });
  auto self = std::make_shared<int>(-1);  // y's id, known once it is recorded
  const autodiff::var<T, D> out = t.record(
      tensor_on<T, D>(xv.layout(), xv.global_shape(), xv.rank(), std::move(y)),
      [ix = x.id, self, a, fn](autodiff::tape<T, D>& tp, tensor_on<T, D>&& g) {
        const tensor_on<T, D>& yv = tp.value(*self);
        laid_out<T, D> dy = placed_as(g, yv.layout(), tp.ctx());
        // dy's elements in y's layout (g itself, or its redistributed copy): dx is written
        // over them.
        tensor_on<T, D>& mine = dy.owned() ? *dy.owned() : g;
        auto dx = with_activation(a, [&](auto A) {
          return K::template fused_map<T>(fn, kernels::fused::act_grad<A.value>{}, std::move(mine.local()),
                                          yv.local());
        });
        tp.add_grad(ix, tensor_on<T, D>(yv.layout(), yv.global_shape(), yv.rank(), std::move(dx)));
      },
      t.requires_grad(x.id));
  *self = out.id;
  return out;
}

/// The traced activation `a` of module m's output y (none: y itself).
template <class M>
graph::value traced_activation(const M& m, kernels::fused::activation a, graph::value y) {
  using kernels::fused::activation;
  switch (a) {
    case activation::relu: return apply_named(m.op_name("relu"), ops::relu_op{}, y);
    case activation::sigmoid: return apply_named(m.op_name("sigmoid"), ops::sigmoid_op{}, y);
    case activation::tanh: return apply_named(m.op_name("tanh"), ops::tanh_op{}, y);
    default: return y;
  }
}

template <class... M>
struct first_module {
  using type = void;
};
template <class M, class... Rest>
struct first_module<M, Rest...> {
  using type = M;
};

}  // namespace detail

// ---- Dense ---------------------------------------------------------------------------

/// MindSpore's nn.Dense: y = act(x weight^T + bias), x (batch, in_channels), weight
/// (out_channels, in_channels), bias (out_channels,), act none (the default), relu,
/// sigmoid or tanh.
///
///     nn::dense<float> fc(784, 512, "normal", "zeros");   // the seed's layer
///     fc.shard(strategy{{2, 1}, {4, 1}});                  // optional: MatMul's strategy
///     nn::dense<float> hidden(784, 512, {}, {}, true, nn::activation::relu);
///
/// Defaults as MindSpore's (and PyTorch's Linear): weight he_uniform(sqrt 5), i.e.
/// U(-1/sqrt(in), 1/sqrt(in)); bias U(-1/sqrt(in), 1/sqrt(in)).
///
/// The strategy is MatMul's for (x, weight) with weight transposed: ((m, k), (n, k)),
/// x split m ways by rows and k ways by columns, the weight n ways by rows. Unset, it
/// is data parallel, ((device_num, 1), (1, 1)): the batch split over every rank, the
/// weight and bias replicated, and the weight's and bias's gradients partial sums over
/// the ranks (a gradient reducer resolves them). When k is 1 the product and the bias
/// run fused on local shards, the bias and the activation as one pass over the product
/// (and the activation's backward as one pass over the output gradient); otherwise
/// through ops::matmul and ops::bias_add, then the activation in one pass. On a device
/// other than the host (D = cuda_device) the fused path runs D's kernels (cuBLAS, the
/// fused row-broadcast map and the column-sum kernel) on the same layouts.
template <class T = float, class D = cpu_device>
class dense : public module<T, D> {
  index_t in_, out_;
  bool has_bias_;
  activation act_;

 public:
  dense(index_t in_channels, index_t out_channels, std::optional<initializer> weight_init = {},
        std::optional<initializer> bias_init = {}, bool has_bias = true, activation act = activation::none)
      : in_(checked(in_channels, out_channels, 0)),
        out_(checked(in_channels, out_channels, 1)),
        has_bias_(has_bias),
        act_(act),
        weight(extents{out_channels, in_channels},
               weight_init ? *weight_init : initializer::he_uniform(std::sqrt(5.0))),
        bias(extents{out_channels},
             bias_init ? *bias_init : initializer::uniform(1.0 / std::sqrt(double(in_channels)))) {}

  /// MatMul with weight transposed; an empty strategy (the default) is data parallel.
  ops::matmul_op matmul{{}, false, true};
  parameter<T, D> weight;
  parameter<T, D> bias;

  /// Sets MatMul's strategy ((m, k), (n, k)); call before build().
  dense& shard(const strategy& st) {
    matmul.st = st;
    return *this;
  }

  index_t in_channels() const { return in_; }
  index_t out_channels() const { return out_; }
  bool has_bias() const { return has_bias_; }
  activation act() const { return act_; }

  void visit(visitor<T, D>& v) override {
    v.param("weight", weight);
    if (has_bias_) v.param("bias", bias);
  }
  void reset_strategies() override { matmul.st = strategy{}; }

  void place(int device_num) override {
    op_ = matmul;
    if (op_.st.n == 0) op_.st = strategy{{device_num, 1}, {1, 1}};
    try {
      rule_ = op_.rule(device_num);
    } catch (const error& e) {
      throw error(std::string("dense: ") + e.what());
    }
    const int m = op_.st.in[0].v[0], k = op_.st.in[0].v[1], n = op_.st.in[1].v[0];
    fused_ = k == 1;
    weight.set_target_layout(rule_.b);
    if (fused_) {
      bias_layout_ = layout(rule_.dev, {rule_.c.split[1]});
      bias_grad_layout_ = bias_layout_;
      bias_grad_layout_.partial = rule_.grad_b.partial;
    } else {
      bias_op_ = ops::bias_add_op{strategy{{m, n}, {n}}};
      bias_layout_ = bias_op_.rule(device_num, shape_list{extents{m, out_}, extents{out_}}).in[1];
    }
    bias.set_target_layout(bias_layout_);
  }
  autodiff::var<T, D> operator()(autodiff::var<T, D> x) {
    autodiff::tape<T, D>& t = *x.t;
    if (x.value().ndim() != 2 || x.value().global_shape()[1] != in_)
      throw error("dense: the input is " + to_string(x.value().global_shape()) + ", expected (batch, " +
                  std::to_string(in_) + ")");
    if (rule_.dev.ndim == 0)
      throw error("dense: not placed yet: call build(ctx) on the network first");
    // The leaves first: recording moves the tape's values (references to them would dangle).
    const autodiff::var<T, D> w = weight.on(t);
    std::optional<autodiff::var<T, D>> b;
    if (has_bias_) b = bias.on(t);
    const tensor_on<T, D>& xv = x.value();
    if (!fused_) {
      autodiff::var<T, D> y = autodiff::apply(op_, x, w);
      if (b) y = autodiff::apply(bias_op_, y, *b);
      return act_ == activation::none ? y : detail::activate(y, act_, "dense");
    }
    using K = kernels::backend<D>;
    using array = typename storage<T, D>::array;
    context& ctx = t.ctx();
    const laid_out<T, D> lx = detail::placed_as(xv, rule_.a, ctx);
    const laid_out<T, D> lw = detail::placed_as(w.value(), rule_.b, ctx);
    // The epilogue: bias and activation in one pass over the product, in place.
    array y = K::template matmul<T>(lx->local(), lw->local(), false, true);
    if (b) {
      const laid_out<T, D> lb = detail::placed_as(b->value(), bias_layout_, ctx);
      y = detail::with_activation(act_, [&](auto A) {
        return K::template fused_bias_map<T>("dense", std::move(y), lb->local(), kernels::fused::bias_act<A.value>{});
      });
    } else if (act_ != activation::none) {
      y = detail::with_activation(act_, [&](auto A) {
        return K::template fused_map<T>("dense", kernels::fused::act_value<A.value>{}, y);
      });
    }
    const bool rg = t.requires_grad(x.id) || t.requires_grad(w.id) || (b && t.requires_grad(b->id));
    tensor_on<T, D> out(rule_.c, extents{xv.global_shape()[0], out_}, ctx.rank(), std::move(y));
    auto self = std::make_shared<int>(-1);  // the output's id, for the activation's backward
    const autodiff::var<T, D> result =
        t.record(std::move(out),
                 [r = rule_, bgl = bias_grad_layout_, ix = x.id, iw = w.id, ib = b ? b->id : -1, wp = &weight,
                  bp = &bias, act = act_, self](autodiff::tape<T, D>& tp, const tensor_on<T, D>& g) {
                   context& c = tp.ctx();
                   const laid_out<T, D> dy0 = detail::placed_as(g, r.c.without_partial(), c);
                   // dz = dy * act'(z) from the output, one pass; dy itself without one.
                   std::optional<array> dz_own;
                   if (act != activation::none)
                     dz_own = detail::with_activation(act, [&](auto A) {
                       return K::template fused_map<T>("dense_backward", kernels::fused::act_grad<A.value>{},
                                                       dy0->local(), tp.value(*self).local());
                     });
                   const array& dz = dz_own ? *dz_own : dy0->local();
                   const tensor_on<T, D>& xv2 = tp.value(ix);
                   const tensor_on<T, D>& wv = tp.value(iw);
                   const laid_out<T, D> lx2 = detail::placed_as(xv2, r.a, c);
                   const laid_out<T, D> lw2 = detail::placed_as(wv, r.b, c);
                   if (ib >= 0 && tp.requires_grad(ib)) {
                     array db;
                     if constexpr (detail::on_host<D>) {
                       db = bp->take_grad_storage(local_shape(bgl, bp->shape()));
                       column_sums(dz, db);
                     } else {
                       db = K::template reduce_sum<T>(dz, std::vector<int>{0}, false);
                     }
                     tp.add_grad(ib, tensor_on<T, D>(bgl, bp->shape(), c.rank(), std::move(db)));
                   }
                   if (tp.requires_grad(iw)) {
                     // dW (out, in) = dz^T x, written over the last step's storage.
                     array dw;
                     if constexpr (detail::on_host<D>) {
                       dw = wp->take_grad_storage(local_shape(r.grad_b, wp->shape()));
                       const array& xl = lx2->local();
                       const int rows = int(dz.shape()[0]), outs = int(dz.shape()[1]), ins = int(xl.shape()[1]);
                       K::template gemm<T>(true, false, outs, ins, rows, T(1), dz.data(), outs, xl.data(), ins, T(0),
                                           dw.data(), ins);
                     } else {
                       dw = K::template matmul<T>(dz, lx2->local(), true, false);
                     }
                     tp.add_grad(iw, tensor_on<T, D>(r.grad_b, wv.global_shape(), c.rank(), std::move(dw)));
                   }
                   if (tp.requires_grad(ix)) {
                     array dx = K::template matmul_grad_a<T>(dz, lx2->local(), lw2->local(), false, true);
                     tp.add_grad(ix, tensor_on<T, D>(r.grad_a, xv2.global_shape(), c.rank(), std::move(dx)));
                   }
                 },
                 rg);
    *self = result.id;
    return result;
  }

  /// Traced: MatMul (the weight transposed) with the layer's strategy, BiasAdd (split as
  /// the product's columns when a strategy is set) and the activation, named
  /// "<layer>.matmul", "<layer>.bias_add", "<layer>.<activation>". Without a strategy the
  /// parallel mode gives them theirs.
  graph::value operator()(graph::value x) {
    if (x.shape().ndim != 2 || x.shape()[1] != in_)
      throw error("dense: the input is " + to_string(x.shape()) + ", expected (batch, " + std::to_string(in_) + ")");
    const graph::value w = weight.on(x);
    graph::value y = apply_named(this->op_name("matmul"), ops::matmul_op{matmul.st, false, true}, x, w);
    if (has_bias_) {
      strategy bst;
      if (matmul.st.n == 2) bst = strategy{{matmul.st.in[0].v[0], matmul.st.in[1].v[0]}, {matmul.st.in[1].v[0]}};
      y = apply_named(this->op_name("bias_add"), ops::bias_add_op{bst}, y, bias.on(x));
    }
    return detail::traced_activation(*this, act_, y);
  }

 private:
  static index_t checked(index_t in, index_t out, int which) {
    if (in < 1 || out < 1)
      throw error("dense: in_channels and out_channels must be positive: got " + std::to_string(in) + " and " +
                  std::to_string(out));
    return which == 0 ? in : out;
  }
  // out = the sums of each column of a (rows, cols) array: the bias's gradient.
  static void column_sums(const xt::xarray<T>& dy, xt::xarray<T>& out) {
    const std::size_t cols = dy.shape()[1], rows = dy.shape()[0];
    T* o = out.data();
    std::fill(o, o + cols, T(0));
    const T* g = dy.data();
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) o[j] += g[r * cols + j];
  }

  ops::matmul_op op_{};
  matmul_layouts rule_{};
  bool fused_ = true;
  layout bias_layout_{}, bias_grad_layout_{};
  ops::bias_add_op bias_op_{};
};

// ---- ReLU --------------------------------------------------------------------------

/// max(x, 0). Without a strategy it keeps the input's layout (partial sums resolved
/// first); with one, ops::relu runs it: `relu.shard(strategy{{2, 4}})`.
template <class T = float, class D = cpu_device>
class relu : public module<T, D> {
 public:
  std::optional<ops::relu_op> op;

  relu& shard(const strategy& st) {
    op = ops::relu_op{st};
    return *this;
  }
  void visit(visitor<T, D>&) override {}
  void reset_strategies() override { op.reset(); }
  /// Traced: ReLU with the layer's strategy (none: the parallel mode's).
  graph::value operator()(graph::value x) {
    return apply_named(this->op_name("relu"), op ? *op : ops::relu_op{}, x);
  }

  autodiff::var<T, D> operator()(autodiff::var<T, D> x) {
    if (op) return autodiff::apply(*op, x);
    x = detail::resolved(x);
    autodiff::tape<T, D>& t = *x.t;
    const tensor_on<T, D>& xv = x.value();
    tensor_on<T, D> y(xv.layout(), xv.global_shape(), xv.rank(), forward(xv.local()));
    return t.record(std::move(y),
                    [ix = x.id](autodiff::tape<T, D>& tp, const tensor_on<T, D>& g) {
                      const tensor_on<T, D>& xv2 = tp.value(ix);
                      const laid_out<T, D> dy = detail::placed_as(g, xv2.layout(), tp.ctx());
                      tp.add_grad(ix, tensor_on<T, D>(xv2.layout(), xv2.global_shape(), xv2.rank(),
                                                      backward(dy->local(), xv2.local())));
                    },
                    t.requires_grad(x.id));
  }

 private:
  using array = typename storage<T, D>::array;
  static array forward(const array& x) { return kernels::backend<D>::template relu<T>(x); }
  static array backward(const array& dy, const array& x) { return kernels::backend<D>::template relu_grad<T>(dy, x); }
};

// ---- Sigmoid, Tanh ------------------------------------------------------------------

/// An element-wise activation that keeps its input's layout (partial sums resolved
/// first), forward and backward each one fused pass (kernels/fused.hpp).
template <activation A, class T = float, class D = cpu_device>
class activation_layer : public module<T, D> {
 public:
  void visit(visitor<T, D>&) override {}
  void reset_strategies() override {}
  autodiff::var<T, D> operator()(autodiff::var<T, D> x) {
    return detail::activate(x, A, name_of());
  }
  /// Traced: Sigmoid or Tanh (the parallel mode gives its strategy).
  graph::value operator()(graph::value x) { return detail::traced_activation(*this, A, x); }

 private:
  static constexpr const char* name_of() { return A == activation::sigmoid ? "sigmoid" : "tanh"; }
};

/// 1 / (1 + e^-x), MindSpore's nn.Sigmoid.
template <class T = float, class D = cpu_device>
using sigmoid = activation_layer<activation::sigmoid, T, D>;
/// tanh x, MindSpore's nn.Tanh.
template <class T = float, class D = cpu_device>
using tanh = activation_layer<activation::tanh, T, D>;

// ---- Flatten -----------------------------------------------------------------------

/// (batch, d1, d2, ...) -> (batch, d1 * d2 * ...), MindSpore's nn.Flatten. The batch dim
/// keeps its split; the other dims are gathered first if some rank splits them.
template <class T = float, class D = cpu_device>
class flatten : public module<T, D> {
 public:
  void visit(visitor<T, D>&) override {}
  /// Traced: Flatten (the parallel mode gives its strategy).
  graph::value operator()(graph::value x) { return apply_named(this->op_name("flatten"), ops::flatten_op{}, x); }

  autodiff::var<T, D> operator()(autodiff::var<T, D> x) {
    autodiff::tape<T, D>& t = *x.t;
    const tensor_on<T, D>& xv = x.value();
    if (xv.ndim() < 1) throw error("flatten: the input must have a batch dim, got shape ()");
    const extents& gs = xv.global_shape();
    index_t features = 1;
    for (int d = 1; d < gs.ndim; ++d) features *= gs[d];
    layout in = xv.layout();
    for (int d = 1; d < in.ndim; ++d) in.split[d] = axis_list{};
    const laid_out<T, D> lx = detail::placed_as(xv, in, t.ctx());
    layout out_l(in.dev, {in.split[0], axis_list{}});
    out_l.partial = in.partial;
    out_l.op = in.op;
    typename storage<T, D>::array y = lx->local();
    tensor_on<T, D> out(out_l, extents{gs[0], features}, xv.rank(), std::move(y));
    return t.record(std::move(out),
                    [ix = x.id, in, out_l](autodiff::tape<T, D>& tp, tensor_on<T, D>&& g) {
                      const tensor_on<T, D>& xv2 = tp.value(ix);
                      laid_out<T, D> dy = detail::placed_as(g, out_l.without_partial(), tp.ctx());
                      // dy's elements (g's own, or its redistributed copy's) become dx's.
                      tensor_on<T, D>& mine = dy.owned() ? *dy.owned() : g;
                      tp.add_grad(ix, tensor_on<T, D>(in.without_partial(), xv2.global_shape(), xv2.rank(),
                                                      std::move(mine.local())));
                    },
                    t.requires_grad(x.id));
  }
};

// ---- Dropout -----------------------------------------------------------------------

/// MindSpore's nn.Dropout(p): in training mode each element is zeroed with
/// probability p and the others scaled by 1 / (1 - p); in evaluation mode the identity.
/// The mask is a function of (seed, the layer's name, the call count, the element's
/// global index): replicas of a tensor draw the same mask, the shards of a split one
/// the pieces of the one-rank mask, so a run on N ranks drops what a run on one does.
/// On a device other than the host the mask is drawn on the host and copied, so
/// every device drops the same elements and scales by the same factor.
template <class T = float, class D = cpu_device>
class dropout : public module<T, D> {
 public:
  explicit dropout(double p = 0.5) {
    if (!(p >= 0.0 && p < 1.0))
      throw error("dropout: p must be in [0, 1): got " + std::to_string(p));
    op_.p = p;
    op_.key = stream_key(0, "dropout");
  }
  double p() const { return op_.p; }
  /// Training-mode calls so far, eager or traced (the mask of call s is keyed by s).
  std::uint64_t calls() const { return op_.state->calls.load(); }
  /// The operator the layer applies (ops/dropout_rule.hpp); its copies share the calls.
  const ops::dropout_op& op() const { return op_; }

  void visit(visitor<T, D>&) override {}
  void named(std::string_view full_name, std::uint64_t seed) override {
    nn::module<T, D>::named(full_name, seed);
    op_.key = stream_key(seed, full_name);
  }
  void training_changed(bool mode) override { op_.state->training.store(mode); }

  /// Whether call `call` keeps the element at global index i.
  bool keep(std::uint64_t call, std::uint64_t i) const { return ops::dropout_keeps(op_.key, op_.p, call, i); }

  /// Traced: Dropout, sharing the layer's calls and mode (the parallel mode gives its
  /// strategy).
  graph::value operator()(graph::value x) { return apply_named(this->op_name("dropout"), op_, x); }

  /// Eager: x times the mask of the next call, in x's own layout.
  autodiff::var<T, D> operator()(autodiff::var<T, D> x) {
    if (!op_.active()) return x;
    using K = kernels::backend<D>;
    autodiff::tape<T, D>& t = *x.t;
    const tensor_on<T, D>& xv = x.value();
    ops::dropout_op op = op_;
    op.next_call();
    tensor_on<T, D> y(xv.layout(), xv.global_shape(), xv.rank(),
                      K::template mul<T>(xv.local(), ops::dropout_factors<T, D>(op, xv.layout(), xv.global_shape(),
                                                                                   xv.rank())));
    return t.record(std::move(y),
                    [ix = x.id, op](autodiff::tape<T, D>& tp, const tensor_on<T, D>& g) {
                      const tensor_on<T, D>& xv2 = tp.value(ix);
                      const layout l = xv2.layout().without_partial();
                      const laid_out<T, D> dy = detail::placed_as(g, l, tp.ctx());
                      tp.add_grad(ix, tensor_on<T, D>(l, xv2.global_shape(), xv2.rank(),
                                                      K::template mul<T>(dy->local(), ops::dropout_factors<T, D>(
                                                                                          op, l, xv2.global_shape(),
                                                                                          xv2.rank()))));
                    },
                    t.requires_grad(x.id));
  }

 private:
  ops::dropout_op op_;
};

// ---- BatchNorm2d -------------------------------------------------------------------

/// MindSpore's nn.BatchNorm2d(num_features, eps, momentum): per channel of x (N, C, H,
/// W), y = gamma * (x - mean) / sqrt(variance + eps) + beta, with the batch's mean and
/// biased variance over (N, H, W) in training mode and the running statistics in
/// evaluation mode. Its parameters are MindSpore's four: "gamma" (ones) and "beta"
/// (zeros), and the running statistics "moving_mean" (zeros) and "moving_variance"
/// (ones), which require no gradient (trainable_params() leaves them out, so optimizers
/// and gradient reducers never see them) and are laid out as gamma. They are the one copy
/// of the running statistics: build() binds the operator's shared state to them
/// (ops::bind_running_statistics), every training forward, eager or in a traced graph,
/// updates them in place (running = momentum * running + (1 - momentum) * batch,
/// MindSpore's momentum), every evaluation forward reads them, and a checkpoint saves and
/// loads them with the other parameters. A built layer must stay where it is (as every
/// module whose parameters an optimizer holds).
///
///     nn::batch_norm2d<float> bn(16);
///     bn.shard(strategy{{2, 4, 1, 1}, {4}, {4}});   // optional: BatchNorm's strategy
///     bn.set_train(false);                         // evaluation: running statistics
///
/// `sync` (default true): with the batch split over n ranks, the statistics of the whole
/// batch (MindSpore's and PyTorch's SyncBatchNorm); false: each rank's batch shard's own
/// (MindSpore's BatchNorm2d and PyTorch DDP's default). `use_batch_statistics` as
/// MindSpore's: unset, the batch's statistics in training and the running ones in
/// evaluation; true, always the batch's (and the running statistics updated); false,
/// always the running ones. The strategy is BatchNorm's ((n, c, 1, 1), (c,), (c,));
/// unset, data parallel ((device_num, 1, 1, 1), (1,), (1,)), gamma's and beta's gradients
/// partial sums over the ranks (a gradient reducer resolves them).
template <class T = float, class D = cpu_device>
class batch_norm2d : public module<T, D> {
 public:
  explicit batch_norm2d(index_t num_features, double eps = 1e-5, double momentum = 0.9, bool sync = true,
                        std::optional<bool> use_batch_statistics = {})
      : gamma(extents{checked(num_features)}, initializer::ones()),
        beta(extents{num_features}, initializer::zeros()),
        moving_mean(extents{num_features}, initializer::zeros(), false),
        moving_variance(extents{num_features}, initializer::ones(), false),
        features_(num_features),
        use_batch_statistics_(use_batch_statistics) {
    if (!(eps > 0.0)) throw error("batch_norm2d: eps must be positive: got " + std::to_string(eps));
    if (!(momentum >= 0.0 && momentum <= 1.0))
      throw error("batch_norm2d: momentum must be in [0, 1]: got " + std::to_string(momentum));
    op_.eps = eps;
    op_.momentum = momentum;
    op_.sync = sync;
    op_.state->training.store(use_batch_statistics.value_or(true));
  }

  parameter<T, D> gamma;
  parameter<T, D> beta;
  parameter<T, D> moving_mean;      ///< the running mean; no gradient
  parameter<T, D> moving_variance;  ///< the running (unbiased) variance; no gradient

  /// Sets BatchNorm's strategy ((n, c, 1, 1), (c,), (c,)); call before build().
  batch_norm2d& shard(const strategy& st) {
    op_.st = st;
    return *this;
  }

  /// ReLU applied to the output in the same pass (the fused batch norm + ReLU of oneDNN
  /// and cuDNN: BatchNorm then ReLU, with one tensor kept for the backward where the two
  /// layers keep two); call before build().
  batch_norm2d& fuse_relu(bool on = true) {
    op_.relu = on;
    return *this;
  }
  bool fused_relu() const { return op_.relu; }
  index_t num_features() const { return features_; }
  double eps() const { return op_.eps; }
  double momentum() const { return op_.momentum; }
  bool sync() const { return op_.sync; }
  /// The operator the layer applies (ops/batch_norm_rule.hpp); its copies share the
  /// mode and the running statistics (the layer's moving_mean and moving_variance once
  /// built).
  const ops::batch_norm_op& op() const { return op_; }
  /// This rank's shard of moving_mean (moving_variance) as floats on the host (empty
  /// before build).
  std::vector<float> running_mean() const { return host_values(moving_mean); }
  std::vector<float> running_var() const { return host_values(moving_variance); }

  void visit(visitor<T, D>& v) override {
    v.param("gamma", gamma);
    v.param("beta", beta);
    v.param("moving_mean", moving_mean);
    v.param("moving_variance", moving_variance);
  }
  void reset_strategies() override { op_.st = strategy{}; }
  void training_changed(bool mode) override { op_.state->training.store(use_batch_statistics_.value_or(mode)); }

  void place(int device_num) override {
    placed_ = op_;
    if (placed_.st.n == 0) placed_.st = placed_.data_parallel(device_num, {});
    const extents any{dynamic_extent, features_, dynamic_extent, dynamic_extent};
    try {
      const batch_norm_layouts r = placed_.rule(device_num, shape_list{any, extents{features_}, extents{features_}});
      for (parameter<T, D>* p : {&gamma, &beta, &moving_mean, &moving_variance}) p->set_target_layout(r.param);
    } catch (const error& e) {
      throw error(std::string("batch_norm2d: ") + e.what());
    }
    // The running statistics are the parameters, wherever their storage is when a
    // forward runs (a model lays parameters out anew; a checkpoint loads into them).
    ops::bind_running_statistics<T, D>(
        op_, [this]() -> tensor_on<T, D>& { return moving_mean.data(); },
        [this]() -> tensor_on<T, D>& { return moving_variance.data(); });
  }

  /// Eager: BatchNorm with the layer's strategy (data parallel when none is set).
  autodiff::var<T, D> operator()(autodiff::var<T, D> x) {
    check_input(x.value().global_shape());
    if (placed_.st.n == 0) throw error("batch_norm2d: not placed yet: call build(ctx) on the network first");
    autodiff::tape<T, D>& t = *x.t;
    const autodiff::var<T, D> g = gamma.on(t);
    const autodiff::var<T, D> b = beta.on(t);
    return autodiff::apply(placed_, x, g, b);
  }

  /// Traced: BatchNorm named "<layer>.batch_norm", sharing the layer's mode and running
  /// statistics (without a strategy the parallel mode gives it one). moving_mean and
  /// moving_variance are not graph parameters: the graph's operator reads and updates
  /// them through the shared state.
  graph::value operator()(graph::value x) {
    check_input(x.shape());
    return apply_named(this->op_name("batch_norm"), op_, x, gamma.on(x), beta.on(x));
  }

 private:
  static index_t checked(index_t n) {
    if (n < 1) throw error("batch_norm2d: num_features must be positive: got " + std::to_string(n));
    return n;
  }
  static std::vector<float> host_values(const parameter<T, D>& p) {
    if (!p.built()) return {};
    const xt::xarray<T> h = storage<T, D>::to_host(p.data().local());
    return std::vector<float>(h.begin(), h.end());
  }
  void check_input(const extents& s) const {
    if (s.ndim != 4 || s[1] != features_)
      throw error("batch_norm2d: the input is " + to_string(s) + ", expected (N, " + std::to_string(features_) +
                  ", H, W)");
  }

  index_t features_;
  std::optional<bool> use_batch_statistics_;
  ops::batch_norm_op op_;
  ops::batch_norm_op placed_;
};

// ---- SequentialCell ----------------------------------------------------------------

/// MindSpore's SequentialCell: layers applied in order, named "0", "1", ....
///
///     nn::sequential seq(nn::dense(784, 512, "normal", "zeros"), nn::relu(),
///                        nn::dense(512, 10, "normal", "zeros"));
///     seq.get<0>().shard(...);
template <class... M>
class sequential : public module<typename detail::first_module<M...>::type::value_type,
                                 typename detail::first_module<M...>::type::device_type> {
 public:
  using value_type = typename detail::first_module<M...>::type::value_type;
  using device_type = typename detail::first_module<M...>::type::device_type;
  static_assert(sizeof...(M) > 0, "sequential: needs at least one layer");
  static_assert((std::is_same_v<typename M::value_type, value_type> && ...),
                "sequential: every layer must have the same element type");
  static_assert((std::is_same_v<typename M::device_type, device_type> && ...),
                "sequential: every layer must be on the same device");
  static_assert((std::is_base_of_v<module<value_type, device_type>, M> && ...),
                "sequential: every layer must be a module");

  explicit sequential(M... layers) : layers_(std::move(layers)...) {}

  static constexpr std::size_t size() { return sizeof...(M); }
  template <std::size_t I>
  auto& get() {
    return std::get<I>(layers_);
  }

  void visit(visitor<value_type, device_type>& v) override {
    visit_each(v, std::index_sequence_for<M...>{});
  }

  template <class V>
  V operator()(V x) {
    return apply_from<0>(x);
  }

 private:
  template <std::size_t... I>
  void visit_each(visitor<value_type, device_type>& v, std::index_sequence<I...>) {
    (v.child(std::to_string(I), std::get<I>(layers_)), ...);
  }
  template <std::size_t I, class V>
  V apply_from(V x) {
    if constexpr (I == sizeof...(M)) return x;
    else return apply_from<I + 1>(std::get<I>(layers_)(x));
  }

  std::tuple<M...> layers_;
};

}  // namespace tessera::nn
