// Error codes of the layout algebra, their text (written once), and how they
// surface: a static_assert at compile time, a tessera::error at run time.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tessera {

// X(code, what must hold, numbers) -- the first text is the static_assert
// message; a run-time error appends the second with the numbers filled in
// ({dim}, {axis}, {a}, {b}).
#define TESSERA_ERRORS(X)                                                                           \
  X(mesh_ndim, "mesh: the number of mesh axes must be between 1 and max_mesh_ndim",                 \
    "mesh has {a} axes, limit {b}")                                                                 \
  X(mesh_axis_size, "mesh: every mesh axis size must be positive", "mesh axis {axis} has size {a}") \
  X(layout_ndim, "layout: the tensor rank must be between 0 and max_tensor_ndim",                   \
    "tensor rank {a}, limit {b}")                                                                   \
  X(axis_out_of_range, "layout: a mesh axis index is out of range",                                 \
    "dim {dim} names mesh axis {axis}, mesh has {a} axes")                                          \
  X(partial_axis_out_of_range, "layout: a partial mesh axis is out of range",                        \
    "partial mesh axis {axis}, mesh has {a} axes")                                                  \
  X(axis_used_twice, "layout: a mesh axis splits more than one tensor dim, or one dim twice",       \
    "mesh axis {axis} is used again at dim {dim}")                                                  \
  X(partial_axis_splits, "layout: a partial mesh axis cannot also split a tensor dim",              \
    "mesh axis {axis} is partial and splits dim {dim}")                                             \
  X(partial_op, "layout: a partial layout reduces with sum, max or min", "")                        \
  X(shape_ndim, "layout: the shape's rank must equal the layout's tensor rank",                     \
    "shape has rank {a}, layout has rank {b}")                                                      \
  X(negative_extent, "layout: a tensor extent must not be negative", "dim {dim} has extent {a}")    \
  X(dim_not_divisible, "layout: a tensor dim must be divisible by the product of its splits",       \
    "dim {dim} has extent {a}, split into {b} pieces")                                              \
  X(mesh_size_mismatch, "mesh: the mesh size must equal the number of ranks",                       \
    "mesh size {a}, communicator size {b}")                                                         \
  X(rank_out_of_range, "mesh: a rank must lie in [0, mesh size)", "rank {a}, mesh size {b}")        \
  X(strategy_ndim, "strategy: each input's split tuple must have between 0 and max_tensor_ndim "    \
                   "entries", "input {dim} has {a} entries")                                        \
  X(strategy_inputs, "strategy: a strategy has at most max_strategy_inputs inputs",                \
    "{a} inputs, limit {b}")                                                                        \
  X(strategy_split, "strategy: every split must be positive", "input {dim}, dim {axis}: split {a}") \
  X(strategy_device_num, "strategy: the product of an input's splits must divide the device count",\
    "input {dim}: product of splits {a}, device count {b}")                                         \
  X(tensor_map_value, "tensor_map: each entry must be -1 or name a device-matrix axis",            \
    "dim {dim} maps to {a}, device matrix has {b} axes")                                            \
  X(mesh_no_refinement, "mesh: two device matrices of one rank list must nest to share a refinement", \
    "suffix products {a} and {b} do not divide")                                                    \
  X(mesh_refinement_ndim, "mesh: a common refinement has at most max_mesh_ndim axes",            \
    "{a} axes needed, limit {b}")                                                                   \
  X(op_inputs, "operator: a strategy has one split tuple per operator input",                     \
    "{a} split tuples for {b} inputs")                                                              \
  X(op_input_ndim, "operator: each split tuple has one entry per dim of its input",                 \
    "input {dim} has {a} entries, the input has rank {b}")                                          \
  X(matmul_contraction, "matmul: both inputs must split the contraction dim into the same number "  \
                        "of pieces", "input 0 splits it {a} ways, input 1 {b} ways")                \
  X(op_device_num, "operator: the device matrix of a strategy must divide the device count",        \
    "device matrix size {a}, device count {b}")                                                     \
  X(plan_mesh_mismatch, "redistribute: both layouts must be on the same mesh", "")                  \
  X(plan_ndim_mismatch, "redistribute: both layouts must have the same tensor rank",                \
    "tensor ranks {a} and {b}")                                                                     \
  X(plan_partial_op, "redistribute: partial layouts must reduce with the same operation", "")       \
  X(static_shape_mismatch, "dist_tensor: a run-time shape must agree with the static shape",      \
    "dim {dim} has extent {a}, the static shape says {b}")                                          \
  X(static_layout_mismatch, "dist_tensor: a run-time layout must equal the static layout", "")     \
  X(buffer_size, "tensor: the local buffer size must equal the layout's local shard size",          \
    "buffer holds {a} elements, the shard needs {b}")                                               \
  X(elementwise_shapes, "elementwise: the input shapes must broadcast",                             \
    "input {dim}, output dim {axis}: extent {a}, an earlier input has {b}")                         \
  X(elementwise_split_mismatch, "elementwise: inputs must split a shared dim alike",                \
    "input {dim} splits output dim {axis} {a} ways, an earlier input {b} ways")                     \
  X(broadcast_dim_split, "elementwise: a broadcast dim cannot be split",                            \
    "input {dim}, dim {axis} has extent 1 and split {a}")                                           \
  X(reduce_axis_range, "reduce: each axis must name a dim of the input",                            \
    "axis {a}, input rank {b}")                                                                     \
  X(reduce_axis_twice, "reduce: an axis must not name a dim twice", "dim {dim} is named twice")    \
  X(cross_entropy_rank, "softmax_cross_entropy: logits must have rank 2 (batch, classes)",         \
    "input {dim} has rank {a}")                                                                     \
  X(cross_entropy_shapes, "softmax_cross_entropy: logits and labels must have the same shape",      \
    "dim {dim}: labels has extent {a}, logits {b}")                                                 \
  X(cross_entropy_split, "softmax_cross_entropy: logits and labels must be split alike",            \
    "dim {dim}: labels split {a} ways, logits {b} ways")                                            \
  X(batch_matmul_no_batch, "batch_matmul: at least one input must have batch dims (rank 3 or more)", \
    "inputs have ranks {a} and {b}")                                                                \
  X(batch_matmul_rank, "batch_matmul: an input has rank 2 (shared by every batch entry) or the "    \
                       "output's rank", "input {dim} has rank {a}, the output {b}")                  \
  X(batch_matmul_batch_shape, "batch_matmul: both inputs must have the same batch dims",            \
    "dim {dim}: input 1 has extent {a}, input 0 {b}")                                               \
  X(batch_matmul_contraction_shape, "batch_matmul: the contraction dims of both inputs must have "  \
                                    "the same extent", "input 0 has {a}, input 1 {b}")             \
  X(batch_matmul_batch_split, "batch_matmul: both inputs must split each batch dim alike",          \
    "dim {dim}: input 1 splits it {a} ways, input 0 {b} ways")                                      \
  X(batch_matmul_contraction, "batch_matmul: both inputs must split the contraction dim into the "  \
                              "same number of pieces", "input 0 splits it {a} ways, input 1 {b} ways") \
  X(one_hot_inputs, "one_hot: a strategy is ((output splits),) or ((output splits), (), ())",       \
    "{a} split tuples")                                                                             \
  X(one_hot_value_split, "one_hot: the on and off values are scalars, with empty split tuples",     \
    "input {dim} has {a} entries")                                                                  \
  X(one_hot_ndim, "one_hot: the strategy splits the output, whose shape is indices.shape + (depth,)", \
    "{a} entries for an output of rank {b}")                                                        \
  X(one_hot_depth, "one_hot: depth must not be negative", "depth {a}")                              \
  X(softmax_axis, "softmax: the axis must name a dim of the input", "axis {a}, input rank {b}")     \
  X(transpose_perm_size, "transpose: perm must have one entry per input dim",                       \
    "perm has {a} entries, the input has rank {b}")                                                 \
  X(transpose_perm, "transpose: perm must be a permutation of the input's dims",                    \
    "entry {dim} is {a}, input rank {b}")                                                           \
  X(reshape_target, "reshape: each target dim must be non-negative, or -1 (inferred) for one dim",  \
    "dim {dim} is {a}")                                                                             \
  X(reshape_size, "reshape: the target shape must have the input's number of elements",             \
    "the input has {a} elements, the target {b}")                                                   \
  X(slice_lengths, "strided_slice: begin, end and strides must have the same length (strides may "  \
                   "be empty)", "begin has {a} entries, end or strides {b}")                        \
  X(slice_rank, "strided_slice: begin must not name more dims than the input has",                  \
    "{a} entries, input rank {b}")                                                                  \
  X(slice_stride, "strided_slice: a stride must not be 0", "dim {dim}")                             \
  X(concat_inputs, "concat: needs between 1 and max_strategy_inputs inputs", "{a} inputs")          \
  X(concat_axis, "concat: the axis must name a dim of the inputs", "axis {a}, input rank {b}")      \
  X(concat_rank, "concat: every input must have input 0's rank", "input {dim} has rank {a}, input 0 {b}") \
  X(concat_shapes, "concat: the inputs' dims other than the axis must agree",                       \
    "input {dim}, dim {axis}: extent {a}, input 0 {b}")                                             \
  X(concat_split_mismatch, "concat: every input must be split alike",                               \
    "input {dim}, dim {axis}: split {a}, input 0 {b}")                                              \
  X(concat_axis_split, "concat: the concat axis cannot be split", "input {dim} splits dim {axis} {a} ways") \
  X(window_rank, "window: the input must be 4-D (N, C, H, W) and a kernel 4-D (O, C / groups, KH, KW)",  \
    "input {dim} has rank {a}")                                                                     \
  X(window_fit, "window: the window must fit in the padded input", "dim {dim}: input {a} + padding < "  \
    "window extent {b}")                                                                            \
  X(window_split_stride, "window: a split height or width must hold a multiple of the stride on "   \
                         "each rank", "dim {dim}: {a} rows per rank, stride {b}")                   \
  X(window_split_output, "window: a split height or width needs output = input / stride (padding "  \
                         "as pad_mode same)", "dim {dim}: output {a}, input / stride {b}")          \
  X(window_halo, "window: a split height or width must hold the kernel's halo on each rank (split "  \
                 "less finely)", "dim {dim}: halo {a} rows, {b} rows per rank")                     \
  X(conv2d_channels, "conv2d: w must have x's channels / groups input channels, and groups must "    \
                     "divide the output channels", "x has {a} channels, w needs {b}")               \
  X(conv2d_split, "conv2d: w is split (co, ci, 1, 1) with ci as x's channel split",                 \
    "w dim {dim}: split {a}, wanted {b}")                                                           \
  X(conv2d_group_split, "conv2d: a grouped convolution splits neither channel dim",                 \
    "groups {a}, channel split {b}")                                                                \
  X(sparse_cross_entropy_rank, "sparse_softmax_cross_entropy: logits must have rank 2 (batch, "     \
                               "classes) and labels rank 1 (batch)", "input {dim} has rank {a}")   \
  X(sparse_cross_entropy_shapes, "sparse_softmax_cross_entropy: labels must have one entry per row " \
                                 "of the logits", "labels has {a} entries, logits {b} rows")        \
  X(sparse_cross_entropy_split, "sparse_softmax_cross_entropy: labels must be split as the logits' " \
                                "batch dim", "labels split {a} ways, the logits' batch dim {b} ways") \
  X(batch_norm_rank, "batch_norm: x must have rank 4 (N, C, H, W), gamma and beta rank 1 (C,)",       \
    "input {dim} has rank {a}, expected {b}")                                                       \
  X(batch_norm_shapes, "batch_norm: gamma and beta must have one entry per channel of x",           \
    "input {dim} has {a} entries, x has {b} channels")                                              \
  X(batch_norm_split, "batch_norm: a strategy is ((n, c, 1, 1), (c,), (c,)): height and width "     \
                      "whole, gamma and beta split as x's channels",                                \
    "input {dim}, dim {axis}: split {a}, expected {b}")

/// What went wrong, as plain values (a structural type: usable as a template argument).
enum class errc : int {
  ok = 0,
#define TESSERA_X(code, text, detail) code,
  TESSERA_ERRORS(TESSERA_X)
#undef TESSERA_X
};

/// A check's outcome with the numbers involved (-1 where a field does not apply).
struct status {
  errc code = errc::ok;
  int dim = -1;
  int axis = -1;
  std::int64_t a = -1;
  std::int64_t b = -1;

  constexpr bool ok() const { return code == errc::ok; }
  friend constexpr bool operator==(const status&, const status&) = default;
};

constexpr status fail(errc code, int dim = -1, int axis = -1, std::int64_t a = -1,
                      std::int64_t b = -1) {
  return status{code, dim, axis, a, b};
}

/// The rule that `code` states (also the static_assert message).
constexpr std::string_view what_must_hold(errc code) {
  switch (code) {
    case errc::ok: return "ok";
#define TESSERA_X(code, text, detail) \
  case errc::code: return text;
    TESSERA_ERRORS(TESSERA_X)
#undef TESSERA_X
  }
  return "unknown error";
}

namespace detail {

constexpr std::string_view detail_format(errc code) {
  switch (code) {
    case errc::ok: return "";
#define TESSERA_X(code, text, detail) \
  case errc::code: return detail;
    TESSERA_ERRORS(TESSERA_X)
#undef TESSERA_X
  }
  return "";
}

inline std::string format_status(const status& s) {
  std::string out(what_must_hold(s.code));
  std::string_view fmt = detail_format(s.code);
  if (fmt.empty()) return out;
  out += ": ";
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '{') {
      std::size_t close = fmt.find('}', i);
      std::string_view key = fmt.substr(i + 1, close - i - 1);
      if (key == "dim") out += std::to_string(s.dim);
      else if (key == "axis") out += std::to_string(s.axis);
      else if (key == "a") out += std::to_string(s.a);
      else if (key == "b") out += std::to_string(s.b);
      i = close;
    } else {
      out += fmt[i];
    }
  }
  return out;
}

}  // namespace detail

/// The exception every run-time check throws. `what()` is the rule followed by the
/// numbers, optionally prefixed by a context (the operator or function name):
/// "layout: a tensor dim must be divisible by the product of its splits: dim 1 has
/// extent 10, split into 4 pieces".
class error : public std::runtime_error {
 public:
  explicit error(const status& s, std::string_view context = {})
      : std::runtime_error(context.empty() ? detail::format_status(s)
                                           : std::string(context) + ": " + detail::format_status(s)),
        status_(s) {}
  explicit error(const std::string& message) : std::runtime_error(message) {}
  /// The rule and numbers of `s`, followed by "; " and `where` (e.g. the strategy).
  error(const status& s, std::string_view context, std::string_view where)
      : std::runtime_error((context.empty() ? std::string() : std::string(context) + ": ") +
                           detail::format_status(s) + "; " + std::string(where)),
        status_(s) {}

  /// The failed check (code ok for errors raised with a plain message).
  const status& why() const noexcept { return status_; }

 private:
  status status_{};
};

/// Throws tessera::error when `s` is a failure. Evaluated during constant evaluation,
/// a failure makes the expression non-constant, which is a compile error.
constexpr void require(const status& s, std::string_view context = {}) {
  if (!s.ok()) throw error(s, context);
}

namespace detail {
/// Turns a failed status known at compile time into a static_assert whose message is
/// the rule; the compiler's "required from" note shows the numbers (the template
/// argument S).
template <status S>
constexpr bool static_require() {
#define TESSERA_X(name, text, detail) static_assert(S.code != errc::name, text);
  TESSERA_ERRORS(TESSERA_X)
#undef TESSERA_X
  return true;
}
}  // namespace detail

}  // namespace tessera

#undef TESSERA_ERRORS
