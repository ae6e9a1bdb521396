// AllReduce's definition: the sum of every rank's tensor over all ranks or over the
// group of some mesh axes, placed by the user in a hybrid_parallel network (the other
// modes place communication themselves). Each rank's tensor is whole (its strategy is
// all ones). Standard library only; the forward and backward are in ops/all_reduce.hpp.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>

namespace tessera::ops {

/// AllReduce (sum): every rank gets the sum of the ranks' tensors, over all ranks or over
/// the group of this rank on mesh axes `axes` of `group_mesh` (whose size must be the
/// device count). Its gradient is the AllReduce (sum) of the gradients over the same
/// group. Only hybrid_parallel runs it; its strategy is all ones.
struct all_reduce_op {
  strategy st;
  std::optional<mesh> group_mesh;  ///< none: every rank
  axis_list axes;

  static constexpr std::string_view type() { return "AllReduce"; }
  static constexpr std::string_view name() { return "all_reduce"; }
  static constexpr int arity = 1;
  /// A hybrid_parallel operator: the other modes place communication themselves.
  static constexpr bool hybrid_only = true;

  std::string attributes() const {
    if (!group_mesh) return "op: sum, group: all ranks";
    return "op: sum, group: mesh " + to_string(*group_mesh) + " axes " + tuple_text(axes);
  }
  extents output_shape(const shape_list& in) const { return in[0]; }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    if (s.n != 1) return fail(errc::op_inputs, -1, -1, s.n, 1);
    if (s.in[0].n != in[0].ndim) return fail(errc::op_input_ndim, 0, -1, s.in[0].n, in[0].ndim);
    return tessera::check(s, device_num);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list&) const {
    const layout l = strategy_layout(s.in[0], device_num);
    return {l.dev, {l}, l, {l}, l};
  }
  std::vector<strategy> candidates(int, const shape_list& in) const { return {all_ones(in)}; }
  strategy data_parallel(int, const shape_list& in) const { return all_ones(in); }
  /// The group against the device count: a group mesh of `device_num` ranks, its axes
  /// in range. Throws tessera::error otherwise.
  void validate(int device_num) const {
    if (group_mesh)
      if (const status s = check_mesh_size(*group_mesh, device_num); !s.ok())
        throw error(s, "group mesh " + to_string(*group_mesh));
    for (int i = 0; i < axes.n; ++i)
      if (axes[i] < 0 || axes[i] >= (group_mesh ? group_mesh->ndim : 1))
        throw error("mesh axis " + std::to_string(axes[i]) + " out of range");
  }
  /// The AllReduce itself (forward) and its gradient's (backward), of the whole tensor.
  std::vector<internal_collective> collectives(const strategy&, int device_num, const shape_list& in) const {
    return {sum(device_num, in[0].size(), false), sum(device_num, in[0].size(), true)};
  }
  /// The AllReduce of `elements` over the group on `device_num` devices.
  internal_collective sum(int device_num, index_t elements, bool backward) const {
    const auto [m, a] = group(device_num);
    internal_collective c = all_reduce_of(reduce_op::sum, m, a, elements,
                                          backward ? "the gradients' sum over the group" : "the sum over the group",
                                          backward);
    c.gives_output = true;
    return c;
  }
  /// The group's mesh and axes on `device_num` devices.
  std::pair<mesh, axis_list> group(int device_num) const {
    if (group_mesh) return {*group_mesh, axes};
    return {mesh{device_num}, axis_list{0}};
  }
};

}  // namespace tessera::ops
