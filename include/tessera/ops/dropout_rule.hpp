// Dropout's definition: in training each element is zeroed with probability p and the
// others scaled by 1 / (1 - p), by a mask that depends only on the layer's key, the
// call and the element's global index (so N ranks drop what one rank drops); the
// identity in evaluation. The element-wise rule of a one-input operator; linear in its
// input. Standard library only; the forward and backward are in ops/dropout.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/elementwise_rule.hpp>

namespace tessera::ops {

/// What the copies of one dropout layer's definition share: the number of calls drawn
/// so far (each call its own mask) and whether the layer trains (else it is the
/// identity).
struct dropout_state {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<bool> training{true};
};

/// Dropout(p) with a shard strategy, as `Dropout(p).shard(((8, 1),))`: the element-wise
/// rule of one input (the output is laid out as the input). `key` names the layer's
/// random stream (kernels::stream_key of the seed and the layer's name); `call` is the
/// mask drawn, set by next_call() before each application from the shared state.
struct dropout_op {
  strategy st;
  double p = 0.5;
  std::uint64_t key = 0;
  std::shared_ptr<dropout_state> state = std::make_shared<dropout_state>();
  std::uint64_t call = 0;  ///< this application's mask

  static constexpr std::string_view type() { return "Dropout"; }
  static constexpr std::string_view name() { return "dropout"; }
  static constexpr int arity = 1;

  linearity linear() const { return linearity::jointly(1u); }
  std::string attributes() const { return "p: " + std::to_string(p); }
  extents output_shape(const shape_list& in) const { return relu_op{}.output_shape(in); }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return relu_op{}.check(s, device_num, in);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    return relu_op{}.layouts(s, device_num, in);
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return relu_op{}.candidates(device_num, in);
  }
  strategy data_parallel(int device_num, const shape_list& in) const { return relu_op{}.data_parallel(device_num, in); }

  /// Draws this application's call number from the shared state (every application of
  /// a definition, eager or in the graph executor, calls it first).
  void next_call() { call = state->calls.fetch_add(1); }
  /// Whether the layer drops (training, and p > 0).
  bool active() const { return p > 0.0 && state->training.load(); }

  /// The layer's layouts; throws tessera::error naming the rule broken and the strategy.
  elementwise_layouts rule(int device_num, const shape_list& shapes) const {
    return relu_op{st}.rule(device_num, shapes);
  }
};

}  // namespace tessera::ops
