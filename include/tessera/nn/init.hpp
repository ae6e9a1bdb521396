// Parameter initializers (MindSpore's mindspore.common.initializer) drawn from a
// counter-based generator: the value at each global index depends only on the seed,
// the parameter's name and the index, so every rank computes its own shard and the
// shards of any layout, on any number of ranks, piece together the same global tensor.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/kernels/random.hpp>

namespace tessera::nn {

// ---- the counter-based generator (kernels/random.hpp) -----------------------------

using kernels::mix64;
using kernels::random_stream;
using kernels::stream_key;

// ---- fans ------------------------------------------------------------------------

/// fan_in and fan_out of a weight, MindSpore's and PyTorch's convention: a (out, in)
/// matrix has fan_in = in and fan_out = out; a (out, in, k1, k2, ...) kernel
/// multiplies both by k1 * k2 * .... Needs at least 2 dims:
/// "xavier_uniform: fan_in and fan_out need a tensor of at least 2 dims, got (512,)".
struct fans {
  double in = 0, out = 0;
};
inline fans compute_fans(const extents& shape, std::string_view who) {
  if (shape.ndim < 2)
    throw error(std::string(who) + ": fan_in and fan_out need a tensor of at least 2 dims, got " +
                to_string(shape));
  double receptive = 1;
  for (int d = 2; d < shape.ndim; ++d) receptive *= double(shape[d]);
  return {double(shape[1]) * receptive, double(shape[0]) * receptive};
}

// ---- initializers ----------------------------------------------------------------

/// How a parameter's global tensor is drawn. MindSpore's initializers, with its
/// defaults and formulas (fan_in, fan_out from compute_fans):
///
/// | initializer                         | value                                              |
/// |-------------------------------------|----------------------------------------------------|
/// | zeros(), ones(), constant(v)        | 0, 1, v                                            |
/// | normal(sigma = 0.01, mean = 0)      | N(mean, sigma^2)                                   |
/// | uniform(scale = 0.07)               | U(-scale, scale)                                   |
/// | xavier_uniform(gain = 1)            | U(-b, b), b = gain sqrt(6 / (fan_in + fan_out))    |
/// | xavier_normal(gain = 1)             | N(0, s^2), s = gain sqrt(2 / (fan_in + fan_out))   |
/// | he_uniform(a = 0, fan_in)           | U(-b, b), b = sqrt(2 / (1 + a^2)) sqrt(3 / fan)    |
/// | he_normal(a = 0, fan_in)            | N(0, s^2), s = sqrt(2 / (1 + a^2)) / sqrt(fan)     |
/// | values(v)                           | v[i] at row-major global index i                   |
///
/// (he_* take the negative slope `a` of a leaky ReLU after the layer, 0 for ReLU, and
/// `fan` = fan_in or fan_out.) An initializer converts from MindSpore's names:
/// "zeros", "ones", "normal", "uniform", "xavier_uniform", "xavier_normal",
/// "he_uniform", "he_normal" (with their defaults).
class initializer {
 public:
  enum class kind { constant, normal, uniform, xavier_uniform, xavier_normal, he_uniform, he_normal, values };

  /// From a MindSpore name; throws on an unknown one:
  /// "initializer: unknown name 'gaussian'; expected zeros, ones, normal, uniform, ...".
  initializer(const char* name) : initializer(from_name(name)) {}  // NOLINT: implicit like MindSpore's strings
  initializer(std::string_view name) : initializer(from_name(name)) {}  // NOLINT

  static initializer zeros() { return constant(0.0); }
  static initializer ones() { return constant(1.0); }
  static initializer constant(double v) { return {kind::constant, v, 0, true}; }
  static initializer normal(double sigma = 0.01, double mean = 0.0) { return {kind::normal, sigma, mean, true}; }
  static initializer uniform(double scale = 0.07) { return {kind::uniform, scale, 0, true}; }
  static initializer xavier_uniform(double gain = 1.0) { return {kind::xavier_uniform, gain, 0, true}; }
  static initializer xavier_normal(double gain = 1.0) { return {kind::xavier_normal, gain, 0, true}; }
  /// `fan_in_mode` false uses fan_out.
  static initializer he_uniform(double negative_slope = 0.0, bool fan_in_mode = true) {
    return {kind::he_uniform, negative_slope, 0, fan_in_mode};
  }
  static initializer he_normal(double negative_slope = 0.0, bool fan_in_mode = true) {
    return {kind::he_normal, negative_slope, 0, fan_in_mode};
  }
  /// Explicit global values, row-major; their number must equal the tensor's size.
  static initializer values(std::vector<double> v) {
    initializer i{kind::values, 0, 0, true};
    i.values_ = std::make_shared<const std::vector<double>>(std::move(v));
    return i;
  }

  static initializer from_name(std::string_view name) {
    if (name == "zeros") return zeros();
    if (name == "ones") return ones();
    if (name == "normal") return normal();
    if (name == "uniform") return uniform();
    if (name == "xavier_uniform") return xavier_uniform();
    if (name == "xavier_normal") return xavier_normal();
    if (name == "he_uniform") return he_uniform();
    if (name == "he_normal") return he_normal();
    throw error("initializer: unknown name '" + std::string(name) +
                "'; expected zeros, ones, normal, uniform, xavier_uniform, xavier_normal, "
                "he_uniform or he_normal");
  }

  kind type() const { return kind_; }

  /// A drawer for a tensor of global shape `shape` from the stream `key`: call it with
  /// a row-major global index. Throws where the shape does not suit the initializer
  /// (fans of a 1-D tensor, a values() list of the wrong size).
  class drawer {
   public:
    double operator()(std::uint64_t i) const {
      switch (k_) {
        case kind::constant: return a_;
        case kind::values: return (*v_)[std::size_t(i)];
        case kind::normal:
        case kind::xavier_normal:
        case kind::he_normal: return b_ + a_ * s_.normal(i);
        default: return s_.uniform(i, -a_, a_);
      }
    }

   private:
    friend class initializer;
    drawer(kind k, double a, double b, std::uint64_t key, std::shared_ptr<const std::vector<double>> v)
        : k_(k), a_(a), b_(b), s_(key), v_(std::move(v)) {}
    kind k_;
    double a_, b_;  // constant: value; normal: sigma, mean; uniform: bound
    random_stream s_;
    std::shared_ptr<const std::vector<double>> v_;
  };

  drawer draw(const extents& shape, std::uint64_t key) const {
    switch (kind_) {
      case kind::constant: return {kind_, a_, 0, key, nullptr};
      case kind::normal: return {kind_, a_, b_, key, nullptr};
      case kind::uniform: return {kind_, a_, 0, key, nullptr};
      case kind::xavier_uniform: {
        const fans f = compute_fans(shape, "xavier_uniform");
        return {kind_, a_ * std::sqrt(6.0 / (f.in + f.out)), 0, key, nullptr};
      }
      case kind::xavier_normal: {
        const fans f = compute_fans(shape, "xavier_normal");
        return {kind_, a_ * std::sqrt(2.0 / (f.in + f.out)), 0, key, nullptr};
      }
      case kind::he_uniform: {
        const fans f = compute_fans(shape, "he_uniform");
        const double gain = std::sqrt(2.0 / (1.0 + a_ * a_));
        return {kind_, gain * std::sqrt(3.0 / (fan_in_ ? f.in : f.out)), 0, key, nullptr};
      }
      case kind::he_normal: {
        const fans f = compute_fans(shape, "he_normal");
        const double gain = std::sqrt(2.0 / (1.0 + a_ * a_));
        return {kind_, gain / std::sqrt(fan_in_ ? f.in : f.out), 0, key, nullptr};
      }
      case kind::values:
        if (index_t(values_->size()) != shape.size())
          throw error("initializer: values: " + std::to_string(values_->size()) +
                      " values for a tensor of shape " + to_string(shape) + " (" +
                      std::to_string(shape.size()) + " elements)");
        return {kind_, 0, 0, key, values_};
    }
    return {kind::constant, 0, 0, key, nullptr};
  }

 private:
  initializer(kind k, double a, double b, bool fan_in) : kind_(k), a_(a), b_(b), fan_in_(fan_in) {}
  kind kind_;
  double a_, b_;
  bool fan_in_;
  std::shared_ptr<const std::vector<double>> values_;
};

}  // namespace tessera::nn
