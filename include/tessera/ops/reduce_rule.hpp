// The reductions' definition (ReduceSum, ReduceMean, ReduceMax, ReduceMin over a list
// of dims, with keep_dims): the sharding rule, from the input's split tuple to the
// layouts of input and output (constexpr), and the operator type ops::reduction_op<How>.
// Standard library only; the forward and backward are in ops/reduce.hpp.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>

namespace tessera {

/// The tensor dims a reduction runs over, e.g. dim_list{0, -1}: negative entries count
/// from the end; an empty list means every dim (MindSpore's axis=()). A structural type.
struct dim_list {
  int n = 0;
  std::array<int, max_tensor_ndim> v{};

  constexpr dim_list() = default;
  constexpr dim_list(std::initializer_list<int> dims) {
    for (int d : dims) {
      if (n < max_tensor_ndim) v[n] = d;
      ++n;
    }
  }
  constexpr int size() const { return n; }
  constexpr int operator[](int i) const { return v[i]; }
  friend constexpr bool operator==(const dim_list&, const dim_list&) = default;
};

/// The layouts of y = reduce(x, dims, keep_dims).
struct reduce_layouts {
  mesh dev;        ///< the operator's device matrix: the input's (strategy_layout)
  layout in;       ///< the input, split by the strategy
  layout out;      ///< kept dims keep their axes; partial over the axes of split reduced dims
  extents shape;   ///< the output's global shape
  unsigned reduced = 0;  ///< bit d set: input dim d is reduced
  index_t count = 1;     ///< global number of input elements per output element
  friend constexpr bool operator==(const reduce_layouts&, const reduce_layouts&) = default;
};

namespace detail {
// Bit d set for every input dim that `dims` names, or a failed status.
constexpr status reduced_dims(const dim_list& dims, int ndim, unsigned& mask) {
  mask = 0;
  if (dims.n == 0) {
    mask = ndim >= 32 ? ~0u : (1u << ndim) - 1u;
    return {};
  }
  if (dims.n > max_tensor_ndim) return fail(errc::reduce_axis_range, -1, -1, dims.n, ndim);
  for (int i = 0; i < dims.n; ++i) {
    const int a = dims.v[i];
    if (a < -ndim || a >= ndim) return fail(errc::reduce_axis_range, -1, -1, a, ndim);
    const int d = a < 0 ? a + ndim : a;
    if (mask >> d & 1u) return fail(errc::reduce_axis_twice, d);
    mask |= 1u << d;
  }
  return {};
}
}  // namespace detail

/// Checks a reduction's strategy on `device_num` devices for an input of shape `shape`:
/// one split tuple with one entry per input dim, positive splits whose product divides
/// the device count, and every named dim in range and named once.
constexpr status check_reduce(const strategy& st, int device_num, const extents& shape,
                              const dim_list& dims) {
  if (st.n != 1) return fail(errc::op_inputs, -1, -1, st.n, 1);
  if (st.in[0].n != shape.ndim) return fail(errc::op_input_ndim, 0, -1, st.in[0].n, shape.ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  unsigned mask = 0;
  return detail::reduced_dims(dims, shape.ndim, mask);
}

/// The reduction rule: the device matrix and the input's layout are strategy_layout's
/// for the input's split tuple. The output keeps the split axes of the kept dims
/// (a kept reduced dim of extent 1 is unsplit); a reduced dim that was split leaves
/// the local results partial over its mesh axis, combined with `how`: sum for
/// ReduceSum and ReduceMean (each rank divides its local sum by the global count, so
/// the partial terms add up to the mean), max for ReduceMax, min for ReduceMin.
/// Example: ReduceSum over dim 1 of (16, 32) with (2, 4) on 8 devices -> device matrix
/// (2, 4); x split rows by axis 0, columns by axis 1; y (16,) split by axis 0 and
/// partial (sum) over axis 1.
/// @pre check_reduce(st, device_num, shape, dims).ok()
constexpr reduce_layouts reduce_rule(const strategy& st, int device_num, const extents& shape,
                                     const dim_list& dims, bool keep_dims, reduce_op how) {
  reduce_layouts r;
  r.in = strategy_layout(st.in[0], device_num);
  r.dev = r.in.dev;
  detail::reduced_dims(dims, shape.ndim, r.reduced);
  r.out = layout::replicated(r.dev, 0);
  axis_list partial;
  for (int d = 0; d < shape.ndim; ++d) {
    const bool reduced = (r.reduced >> d & 1u) != 0;
    if (reduced) {
      if (shape.v[d] != dynamic_extent) r.count *= shape.v[d];
      if (st.in[0].v[d] > 1)
        for (int i = 0; i < r.in.split[d].n; ++i) partial.push_back(r.in.split[d].v[i]);
      if (!keep_dims) continue;
    }
    r.out.split[r.out.ndim] = reduced ? axis_list{} : r.in.split[d];
    r.shape.v[r.out.ndim] = reduced ? 1 : shape.v[d];
    ++r.out.ndim;
    ++r.shape.ndim;
  }
  const reduce_op op = how == reduce_op::mean ? reduce_op::sum : how;
  if (!partial.empty()) r.out = r.out.with_partial(partial, op);
  return r;
}

/// The rule for a static strategy, shape and dims; an invalid one fails to compile with
/// the rule it breaks as the message.
template <strategy St, int DeviceNum, extents Shape, dim_list Dims, bool KeepDims = false,
          reduce_op How = reduce_op::sum>
inline constexpr reduce_layouts static_reduce_rule = [] {
  constexpr status s = check_reduce(St, DeviceNum, Shape, Dims);
  detail::static_require<s>();
  if constexpr (s.ok()) return reduce_rule(St, DeviceNum, Shape, Dims, KeepDims, How);
  else return reduce_layouts{};
}();

namespace ops {

/// A reduction with a shard strategy, as `ReduceSum(keep_dims).shard(((2, 4),))` applied
/// over `dims`; How is sum, mean, max or min; rule reduce_rule (a split reduced dim
/// leaves the output partial). ReduceSum and ReduceMean are linear in their input.
/// Candidates: every split tuple of the input. Data parallel: the input's dim 0 split
/// over every device.
template <reduce_op How>
struct reduction_op {
  strategy st;
  dim_list dims;  ///< the reduced dims ({} = every dim; negative counts from the end)
  bool keep_dims = false;

  static constexpr std::string_view type() {
    switch (How) {
      case reduce_op::mean: return "ReduceMean";
      case reduce_op::max: return "ReduceMax";
      case reduce_op::min: return "ReduceMin";
      default: return "ReduceSum";
    }
  }
  static constexpr std::string_view name() {
    switch (How) {
      case reduce_op::mean: return "reduce_mean";
      case reduce_op::max: return "reduce_max";
      case reduce_op::min: return "reduce_min";
      default: return "reduce_sum";
    }
  }
  static constexpr int arity = 1;

  /// The backward of ReduceMax and ReduceMin compares x with y; ReduceSum's and
  /// ReduceMean's spread dy and read neither (ops/definition.hpp).
  static constexpr bool backward_reads(int) { return How == reduce_op::max || How == reduce_op::min; }
  static constexpr bool backward_reads_output() { return backward_reads(0); }

  linearity linear() const { return reduction_linearity(How); }
  std::string attributes() const { return "axis: " + tuple_text(dims) + ", keep_dims: " + bool_text(keep_dims); }
  extents output_shape(const shape_list& in) const {
    const strategy one{ones(in[0].ndim)};
    require_shapes(check_reduce(one, 1, in[0], dims));
    return reduce_rule(one, 1, in[0], dims, keep_dims, How).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_reduce(s, device_num, in[0], dims);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const reduce_layouts r = reduce_rule(s, device_num, in[0], dims, keep_dims, How);
    return {r.dev, {r.in}, r.out, {r.in}, r.out.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const { return split_dim(in[0], 0, device_num); }

  /// The backward of ReduceMax (ReduceMin) resolves the partial maxima (minima) and the
  /// counts of ties over the axes of split reduced dims: two AllReduces of the output's
  /// shard. None for the others, and none when no reduced dim is split.
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    if constexpr (How != reduce_op::max && How != reduce_op::min) {
      (void)s, (void)device_num, (void)in;
      return {};
    } else {
      return backward_collectives(reduce_rule(s, device_num, in[0], dims, keep_dims, How));
    }
  }
  /// The two AllReduces of collectives() for the rule `r`: [0] the extrema, [1] the
  /// counts of ties (empty when the output holds no partial results).
  static std::vector<internal_collective> backward_collectives(const reduce_layouts& r) {
    if (!r.out.has_partial()) return {};
    axis_list axes;
    for (int a = 0; a < r.dev.ndim; ++a)
      if (r.out.is_partial(a)) axes.push_back(a);
    const index_t n = local_shape(r.out, r.shape).size();
    return {all_reduce_of(How, r.dev, axes, n, How == reduce_op::max ? "the maxima" : "the minima", true),
            all_reduce_of(reduce_op::sum, r.dev, axes, n, "the counts of ties", true)};
  }

  /// The rule on `device_num` devices for an input of global shape `shape`; throws
  /// tessera::error naming the operator, the rule broken, the numbers and the strategy:
  /// "reduce_sum: reduce: each axis must name a dim of the input: axis 2, input rank 2;
  /// strategy ((2, 4),)".
  reduce_layouts rule(int device_num, const extents& shape) const {
    require_rule(check_reduce(st, device_num, shape, dims), name(), st);
    return reduce_rule(st, device_num, shape, dims, keep_dims, How);
  }
};

using reduce_sum_op = reduction_op<reduce_op::sum>;
using reduce_mean_op = reduction_op<reduce_op::mean>;
using reduce_max_op = reduction_op<reduce_op::max>;
using reduce_min_op = reduction_op<reduce_op::min>;

}  // namespace ops

}  // namespace tessera
