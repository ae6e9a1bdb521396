// Losses as modules: MSELoss and CrossEntropyLoss (sparse integer labels), each a
// scalar on the tape. The reduction is over the GLOBAL batch: with the batch split
// over ranks each rank adds up its own rows and divides by the global count, and the
// loss is a partial sum over the ranks (resolved when read, or left for the gradient
// reducer: the gradients of a partial loss are partial too).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>

namespace tessera::nn {

/// How a loss combines the per-element (or per-sample) terms.
enum class reduction { mean, sum };

namespace detail {

// The layout of a scalar computed from the local shards of `l` and summed over the
// ranks that split it: partial (sum) over the mesh axes that split some dim of `l`.
inline layout scalar_partial_layout(const layout& l) {
  layout s = layout::replicated(l.dev, 0);
  s.partial = l.split_axes();
  return s;
}

template <class T, class D>
void require_scalar_grad(const tensor_on<T, D>& g, const char* who) {
  if (g.ndim() != 0) throw error(std::string(who) + ": the gradient of the loss must be a scalar");
}

// The value of a scalar with its partial sums resolved (read back to the host).
template <class T, class D>
T scalar_value(const tensor_on<T, D>& g, context& ctx) {
  if constexpr (on_host<D>) {
    if (!g.layout().has_partial()) return g.local()();
    return redistribute(g, g.layout().without_partial(), ctx).local()();
  } else {
    if (!g.layout().has_partial()) return storage<T, D>::to_host(g.local())();
    return storage<T, D>::to_host(redistribute(g, g.layout().without_partial(), ctx).local())();
  }
}

// All the axes of an array of `ndim` dims.
inline std::vector<int> all_axes(int ndim) {
  std::vector<int> a(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) a[std::size_t(d)] = d;
  return a;
}


/// MSELoss as a device other than the host runs it, with D's kernels: the sum of the
/// squared differences (one reduction) times `scale`, and 2 scale (x - target) for the
/// gradient. `target` is x's shard of the target. (Generic over D, so the tests check
/// it on the host too.)
template <class T, class D>
autodiff::var<T, D> mse_by_backend(autodiff::var<T, D> x, const typename storage<T, D>::array& target,
                                      T scale) {
  using K = kernels::backend<D>;
  using array = typename storage<T, D>::array;
  autodiff::tape<T, D>& t = *x.t;
  const tensor_on<T, D>& xv = x.value();
  const array d = K::template sub<T>(xv.local(), target);
  array acc = K::template reduce_sum<T>(K::template mul<T>(d, d), all_axes(int(d.dimension())), false);
  K::template scale<T>(acc, scale);
  tensor_on<T, D> loss(scalar_partial_layout(xv.layout()), extents{}, xv.rank(), std::move(acc));
  return t.record(std::move(loss),
                  [ix = x.id, target_local = array(target), scale](autodiff::tape<T, D>& tp,
                                                                  const tensor_on<T, D>& g) {
                    require_scalar_grad(g, "mse_loss");
                    const tensor_on<T, D>& xv2 = tp.value(ix);
                    const T k = T(2) * scale * scalar_value(g, tp.ctx());
                    array dx = K::template sub<T>(xv2.local(), target_local);
                    K::template scale<T>(dx, k);
                    tp.add_grad(ix, tensor_on<T, D>(xv2.layout(), xv2.global_shape(), xv2.rank(), std::move(dx)));
                  },
                  t.requires_grad(x.id));
}

/// CrossEntropyLoss as a device other than the host runs it: the labels are checked on
/// the host (the host path's message), made values of T and copied to device D, then
/// the sharded SparseSoftmaxCrossEntropyWithLogits and the mean or sum over the batch
/// run there, whatever splits the logits. (Generic over D, so the tests check it on
/// the host too.)
template <class T, class D, std::integral I>
autodiff::var<T, D> cross_entropy_by_operator(autodiff::var<T, D> logits, const dist_tensor<I>& labels,
                                                 reduction r) {
  autodiff::tape<T, D>& t = *logits.t;
  const tensor_on<T, D>& xv = logits.value();
  const std::uint64_t cls = std::uint64_t(xv.global_shape()[1]);
  const index_t row0 = labels.local_offset()[0];
  xt::xarray<T> lab = xt::xarray<T>::from_shape(labels.local().shape());
  for (std::size_t i = 0; i < labels.local().size(); ++i) {
    const I v = labels.local().data()[i];
    if (v < 0 || std::uint64_t(v) >= cls)
      throw error("cross_entropy_loss: label " + std::to_string(v) + " of sample " +
                  std::to_string(row0 + index_t(i)) + " is out of range for " + std::to_string(cls) + " classes");
    lab.data()[i] = T(v);
  }
  // Before the leaf: recording moves the tape's values (xv would dangle).
  const int b = xv.layout().pieces(0), c = xv.layout().pieces(1);
  const autodiff::var<T, D> y = t.leaf(
      tensor_on<T, D>(labels.layout(), labels.global_shape(), labels.rank(), storage<T, D>::from_host(lab)), false);
  const ops::sparse_softmax_cross_entropy_op op{strategy{{b, c}, {b}}};
  const autodiff::var<T, D> per_sample = autodiff::apply(op, logits, y);
  if (r == reduction::mean) return autodiff::apply(ops::reduce_mean_op{strategy{{b}}, {}, false}, per_sample);
  return autodiff::apply(ops::reduce_sum_op{strategy{{b}}, {}, false}, per_sample);
}

}  // namespace detail

/// MindSpore's nn.MSELoss: mean (or sum) over every element of (x - target)^2. The
/// target is data (no gradient) of x's shape, in any layout.
template <class T = float, class D = cpu_device>
class mse_loss : public module<T, D> {
 public:
  explicit mse_loss(reduction r = reduction::mean) : r_(r) {}
  void visit(visitor<T, D>&) override {}

  /// `target` is on the network's device D.
  autodiff::var<T, D> operator()(autodiff::var<T, D> x, const tensor_on<T, D>& target) {
    x = detail::resolved(x);
    autodiff::tape<T, D>& t = *x.t;
    const tensor_on<T, D>& xv = x.value();
    if (!(target.global_shape() == xv.global_shape()))
      throw error("mse_loss: the target is " + to_string(target.global_shape()) + ", the input " +
                  to_string(xv.global_shape()));
    const laid_out<T, D> ly = detail::placed_as(target, xv.layout(), t.ctx());
    const T scale = r_ == reduction::mean ? T(1) / T(xv.global_shape().size()) : T(1);
    if constexpr (!detail::on_host<D>) return detail::mse_by_backend(x, ly->local(), scale);
    else {
      const T* px = xv.local().data();
      const T* py = ly->local().data();
      double acc = 0;
      for (std::size_t i = 0; i < xv.local().size(); ++i) {
        const double d = double(px[i]) - double(py[i]);
        acc += d * d;
      }
      dist_tensor<T> loss(detail::scalar_partial_layout(xv.layout()), extents{}, xv.rank());
      loss.local()() = T(acc) * scale;
      return t.record(std::move(loss),
                      [ix = x.id, target_local = xt::xarray<T>(ly->local()), scale](autodiff::tape<T>& tp,
                                                                                     const dist_tensor<T>& g) {
                        detail::require_scalar_grad(g, "mse_loss");
                        const dist_tensor<T>& xv2 = tp.value(ix);
                        const T k = T(2) * scale * detail::scalar_value(g, tp.ctx());
                        dist_tensor<T> dx(xv2.layout(), xv2.global_shape(), xv2.rank());
                        const T* a = xv2.local().data();
                        const T* b = target_local.data();
                        T* o = dx.local().data();
                        for (std::size_t i = 0; i < dx.local().size(); ++i) o[i] = k * (a[i] - b[i]);
                        tp.add_grad(ix, std::move(dx));
                      },
                      t.requires_grad(x.id));
    }
  }

 private:
  reduction r_;
};

/// MindSpore's nn.CrossEntropyLoss with class-index labels: for logits x (batch, C) and
/// labels y (batch,) of an integer type, the mean (or sum) over the batch of
///   -log softmax(x_i)[y_i] = logsumexp(x_i) - x_i[y_i]   (computed around the row max).
/// The gradient wrt the logits is (softmax(x_i) - onehot(y_i)) / batch for the mean.
/// A label outside [0, C) is an error:
/// "cross_entropy_loss: label 12 of sample 3 is out of range for 10 classes".
///
/// With the class dim whole on every rank (data parallel, or the batch split any way)
/// each rank computes its rows locally; with the class dim split it runs
/// ops::sparse_softmax_cross_entropy and ops::reduce_mean.
template <class T = float, class D = cpu_device>
class cross_entropy_loss : public module<T, D> {
 public:
  explicit cross_entropy_loss(reduction r = reduction::mean) : r_(r) {}
  void visit(visitor<T, D>&) override {}

  /// The labels stay on the host whatever the device (they are checked there).
  template <std::integral I>
  autodiff::var<T, D> operator()(autodiff::var<T, D> logits, const dist_tensor<I>& labels) {
    logits = detail::resolved(logits);
    autodiff::tape<T, D>& t = *logits.t;
    const tensor_on<T, D>& xv = logits.value();
    const extents& gs = xv.global_shape();
    if (xv.ndim() != 2)
      throw error("cross_entropy_loss: the logits must be (batch, classes), got " + to_string(gs));
    if (labels.ndim() != 1 || labels.global_shape()[0] != gs[0])
      throw error("cross_entropy_loss: the labels are " + to_string(labels.global_shape()) + ", expected (" +
                  std::to_string(gs[0]) + ",) for logits " + to_string(gs));
    if constexpr (!detail::on_host<D>) {
      return detail::cross_entropy_by_operator(logits, labels, r_);
    } else {
      if (xv.layout().pieces(1) > 1) return class_split(logits, labels);

      context& ctx = t.ctx();
      const layout& xl = xv.layout();
      const laid_out<I> ly = detail::placed_as(labels, layout(xl.dev, {xl.split[0]}), ctx);
      const std::size_t rows = xv.local().shape()[0], cls = std::size_t(gs[1]);
      const index_t row0 = xv.local_offset()[0];
      std::vector<I> lab(ly->local().begin(), ly->local().end());
      for (std::size_t i = 0; i < rows; ++i)
        if (lab[i] < 0 || std::uint64_t(lab[i]) >= cls)
          throw error("cross_entropy_loss: label " + std::to_string(lab[i]) + " of sample " +
                      std::to_string(row0 + index_t(i)) + " is out of range for " + std::to_string(cls) +
                      " classes");
      const T scale = r_ == reduction::mean ? T(1) / T(gs[0]) : T(1);
      const T* px = xv.local().data();
      double acc = 0;
      for (std::size_t i = 0; i < rows; ++i) {
        const T* row = px + i * cls;
        const T m = *std::max_element(row, row + cls);
        double s = 0;
        for (std::size_t j = 0; j < cls; ++j) s += std::exp(double(row[j] - m));
        acc += std::log(s) + double(m) - double(row[std::size_t(lab[i])]);
      }
      dist_tensor<T> loss(detail::scalar_partial_layout(xl), extents{}, xv.rank());
      loss.local()() = T(acc) * scale;
      return t.record(std::move(loss),
                      [ix = logits.id, lab = std::move(lab), scale](autodiff::tape<T>& tp,
                                                                    const dist_tensor<T>& g) {
                        detail::require_scalar_grad(g, "cross_entropy_loss");
                        const dist_tensor<T>& xv2 = tp.value(ix);
                        const T k = scale * detail::scalar_value(g, tp.ctx());
                        const std::size_t r = xv2.local().shape()[0], c = xv2.local().shape()[1];
                        dist_tensor<T> dx(xv2.layout(), xv2.global_shape(), xv2.rank());
                        const T* x = xv2.local().data();
                        T* o = dx.local().data();
                        for (std::size_t i = 0; i < r; ++i) {
                          const T* row = x + i * c;
                          T* out = o + i * c;
                          const T m = *std::max_element(row, row + c);
                          T s = 0;
                          for (std::size_t j = 0; j < c; ++j) s += (out[j] = std::exp(row[j] - m));
                          const T inv = k / s;
                          for (std::size_t j = 0; j < c; ++j) out[j] *= inv;
                          out[std::size_t(lab[i])] -= k;
                        }
                        tp.add_grad(ix, std::move(dx));
                      },
                      t.requires_grad(logits.id));
    }
  }

 private:
  // The class dim is split: the sharded SparseSoftmaxCrossEntropyWithLogits (its row
  // max and sums combined over the class axis), then the mean or sum over the batch.
  template <std::integral I>
  autodiff::var<T> class_split(autodiff::var<T> logits, const dist_tensor<I>& labels) {
    autodiff::tape<T>& t = *logits.t;
    const dist_tensor<T>& xv = logits.value();
    const int b = xv.layout().pieces(0), c = xv.layout().pieces(1);
    const ops::sparse_softmax_cross_entropy_op op{strategy{{b, c}, {b}}};
    dist_tensor<T> per_sample = ops::sparse_softmax_cross_entropy(op, xv, labels, t.ctx());
    const autodiff::var<T> y = t.record(
        std::move(per_sample),
        [op, ix = logits.id, labels](autodiff::tape<T>& tp, const dist_tensor<T>& g) {
          tp.add_grad(ix, ops::sparse_softmax_cross_entropy_backward(op, g, tp.value(ix), labels, tp.ctx()));
        },
        t.requires_grad(logits.id));
    if (r_ == reduction::mean) return autodiff::apply(ops::reduce_mean_op{strategy{{b}}, {}, false}, y);
    return autodiff::apply(ops::reduce_sum_op{strategy{{b}}, {}, false}, y);
  }

  reduction r_;
};

}  // namespace tessera::nn
