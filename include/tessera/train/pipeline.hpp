// Pipeline parallel (MindSpore's pipeline_stages, with PipelineCell's micro-batches):
// the ranks split into stages of equal size, each holding one part of the network; a
// training step cuts the batch into micro-batches that flow through the stages, each
// stage's output sent to the next stage's ranks and the gradient of its input sent back,
// in the 1F1B order (one forward, one backward), which keeps the activations of at
// most as many micro-batches as there are stages on a stage (each micro-batch's are
// released by its backward pass). Inside a stage the ranks run data or model parallel
// as anywhere else: the stage is their world. (The traced graph's pipeline stages,
// graph/pipeline.hpp and parallel_config::pipeline_stages, run the same orders on a
// network's graph, each stage sharded by the parallel pass.)
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/autodiff/tape.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/graph/pipeline.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/train/grad.hpp>

namespace tessera::train {

/// The ranks of `ctx` as `stages` pipeline stages of equal size: stage s holds world
/// ranks [s q, (s + 1) q), q = size / stages (MindSpore's order), and rank i of stage s
/// sends its shard of the stage's output to rank i of stage s + 1. Each rank builds only
/// its own stage's layers, on stage_context(), the ranks of its stage.
///
///     train::pipeline<float> pp(ctx, 2);   // 8 ranks: 2 stages of 4
///     auto& sc = pp.stage_context();
///     if (pp.stage() == 0) first.build(sc); else second.build(sc);
///     auto r = pp.step(params, 4, [&](auto& tape, int m, auto x) {   // 4 micro-batches
///       if (pp.stage() == 0) return first(tape.leaf(inputs(m), false));
///       return loss_fn(second(*x), labels(m));      // the last stage: micro-batch m's loss
///     });
///     opt(r.grads);                                 // this stage's parameters
///
/// A step equals the same training on one rank with the whole batch (to float rounding)
/// when the micro-batches are equal parts of it and each stage's loss is a mean over
/// its micro-batch: the step's loss is the mean of the micro-batches' losses, and the
/// gradients their mean's.
///
/// Needs a backend with non-blocking sends (isend: MPI; activations cross the gradients
/// between two stages, and two blocking sends would deadlock), host tensors.
template <class T, class D = cpu_device>
class pipeline {
  static_assert(std::is_same_v<D, cpu_device>, "train::pipeline: host tensors only (D = cpu_device)");

 public:
  using tensor = tensor_on<T, D>;
  using tape_t = autodiff::tape<T, D>;
  using var_t = autodiff::var<T, D>;

  /// What a step gives: the loss of the whole batch on every rank (the mean of the
  /// micro-batches' losses), and the gradient of each of this stage's parameters, in
  /// its layout (summed over the stage's ranks, as a gradient reducer's mean).
  struct step_result {
    T loss = T(0);
    std::vector<tensor> grads;
  };

  /// Throws unless `stages` divides the ranks: "pipeline: 3 stages do not divide 8
  /// ranks into stages of equal size".
  pipeline(context& ctx, int stages) : world_(&ctx), stages_(stages) {
    const int p = ctx.size();
    if (stages < 1 || p % stages != 0)
      throw error("pipeline: " + std::to_string(stages) + " stages do not divide " + std::to_string(p) +
                  " ranks into stages of equal size");
    per_stage_ = p / stages;
    stage_ = ctx.rank() / per_stage_;
    any_communicator& group = ctx.on(mesh{stages, per_stage_}).group(axis_list{1});
    stage_ctx_ = std::make_unique<context>(group);
  }

  int stages() const { return stages_; }
  /// This rank's stage, 0 for the first.
  int stage() const { return stage_; }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  /// The ranks of this rank's stage: build the stage's layers and its data on it.
  context& stage_context() { return *stage_ctx_; }

  /// One training step of `micro` micro-batches (at least 1). `stage_fn(tape, m, x)` is
  /// this stage's part for micro-batch m, recorded on `tape` (one tape for the step:
  /// the stage's parameters are bound to it once): x is the previous stage's output (a
  /// leaf on the tape, std::nullopt on the first stage, which reads micro-batch m's
  /// inputs itself). The last stage returns micro-batch m's loss, a scalar; the others
  /// their output, which the next stage's ranks receive shard for shard. `params` are
  /// this stage's parameters (those its stage_fn uses), in the order of the gradients
  /// returned. Every rank of the world calls it with the same `micro`. What a
  /// micro-batch records on the tape is released once its backward pass is done (the
  /// parameters excepted): stage_fn must not use a value recorded for another
  /// micro-batch.
  template <class F>
  step_result step(const std::vector<nn::parameter<T, D>*>& params, int micro, F&& stage_fn) {
    if (micro < 1 || micro > max_micro)
      throw error("pipeline: the number of micro-batches must be in [1, " + std::to_string(max_micro) + "], got " +
                  std::to_string(micro));
    context& sc = *stage_ctx_;
    tape_t tape(sc);
    for (std::size_t i = 0; i < params.size(); ++i) params[i]->expect_grad(tape.serial(), int(i));
    flight_ flight;
    std::vector<std::optional<var_t>> inputs(static_cast<std::size_t>(micro)),
        outputs(static_cast<std::size_t>(micro));
    std::vector<int> first_node(static_cast<std::size_t>(micro));  // the first node each micro-batch recorded
    T loss_sum = T(0);

    auto forward = [&](int m) {
      first_node[std::size_t(m)] = tape.size();
      std::optional<var_t> x;
      if (!first_stage()) x = tape.leaf(receive_activation(m), true);
      const var_t y = stage_fn(tape, m, x);
      inputs[std::size_t(m)] = x;
      outputs[std::size_t(m)] = y;
      if (last_stage()) {
        if (y.value().ndim() != 0)
          throw error("pipeline: the last stage must return micro-batch " + std::to_string(m) +
                      "'s loss, a scalar; it returned shape " + to_string(y.value().global_shape()));
        loss_sum += scalar(y.value(), sc);
      } else {
        if (y.value().ndim() == 0)
          throw error("pipeline: stage " + std::to_string(stage_) + " of " + std::to_string(stages_) +
                      " returned a scalar for micro-batch " + std::to_string(m) +
                      "; only the last stage returns the loss");
        const tensor& v = y.value();  // partial sums resolved before they leave the stage
        send_activation(flight, v.layout().has_partial() ? redistribute(v, v.layout().without_partial(), sc) : v, m);
      }
    };
    auto backward = [&](int m) {
      const var_t y = *outputs[std::size_t(m)];
      if (last_stage()) {
        // The step's loss is the mean of the micro-batches': each seeds 1 / micro.
        const tensor& l = y.value();
        tensor seed(l.layout().without_partial(), l.global_shape(), l.rank());
        tensor::storage_type::fill(seed.local(), T(1) / T(micro));
        tape.backward(y, std::move(seed));
      } else {
        tape.backward(y, receive_gradient(y.value(), m));
      }
      if (!first_stage()) send_gradient(flight, tape.grad(*inputs[std::size_t(m)]), m);
      tape.release_range(first_node[std::size_t(m)], y.id);  // micro-batch m's values, parameters kept
    };

    // 1F1B: stage s runs the forwards of the first (stages - s - 1) micro-batches, then
    // alternates one forward and one backward, then the backwards left (the order the
    // graph executor runs too, graph/pipeline.hpp).
    for (const graph::pipeline_unit& u : graph::schedule_order(graph::pipeline_schedule::one_f_one_b, stages_, 1, micro, stage_))
      u.forward ? forward(u.micro) : backward(u.micro);
    flight.wait();

    step_result r;
    r.grads.reserve(params.size());
    for (nn::parameter<T, D>* q : params) {
      const int id = q->leaf_id(tape.serial());
      r.grads.push_back(id >= 0 ? tape.grad(var_t{&tape, id}) : tensor(q->layout(), q->shape(), sc.rank()));
      q->unbind();
    }
    // The loss, from the last stage's first rank to every rank.
    std::vector<double> loss{last_stage() && sc.rank() == 0 ? double(loss_sum) / micro : 0.0};
    world_->world().all_reduce(std::span<double>(loss), reduce_op::sum);
    r.loss = T(loss[0]);
    return r;
  }

  /// The most micro-batches a step takes (each uses three message tags).
  static constexpr int max_micro = 4096;

 private:
  // What the receiver of an activation must know to hold it: its global shape and
  // layout on the stage's device matrix, sent as bytes (every rank runs the same
  // build, so the types' bytes mean the same everywhere).
  struct header {
    extents shape;
    layout l;
  };
  static_assert(std::is_trivially_copyable_v<header>);

  // Sends in flight and what they read: kept until the step's end.
  struct flight_ {
    std::deque<header> headers;
    std::deque<tensor> tensors;
    std::vector<any_request> requests;
    void wait() {
      for (auto& q : requests) q.wait();
      requests.clear();
    }
  };

  int peer(int stage_offset) const { return world_->rank() + stage_offset * per_stage_; }
  static int tag(int m, int kind) { return 3 * m + kind; }  // 0 header, 1 activation, 2 gradient

  void send_activation(flight_& f, const tensor& y, int m) {
    f.headers.push_back(header{y.global_shape(), y.layout()});
    const header& h = f.headers.back();
    any_communicator& w = world_->world();
    f.requests.push_back(
        w.isend(std::span<const char>(reinterpret_cast<const char*>(&h), sizeof(header)), peer(1), tag(m, 0)));
    f.tensors.push_back(y);
    const tensor& t = f.tensors.back();
    f.requests.push_back(w.isend(std::span<const T>(t.local().data(), t.local().size()), peer(1), tag(m, 1)));
  }

  tensor receive_activation(int m) {
    header h;
    any_communicator& w = world_->world();
    w.recv(std::span<char>(reinterpret_cast<char*>(&h), sizeof(header)), peer(-1), tag(m, 0));
    if (h.l.dev.size() != per_stage_)
      throw error("pipeline: stage " + std::to_string(stage_) + " received micro-batch " + std::to_string(m) +
                  "'s input on device matrix " + to_string(h.l.dev) + ", not one of its " +
                  std::to_string(per_stage_) + " ranks");
    tensor x(h.l, h.shape, stage_ctx_->rank());
    w.recv(std::span<T>(x.local().data(), x.local().size()), peer(-1), tag(m, 1));
    return x;
  }

  // The gradient of this stage's output y for micro-batch m, in the layout y was sent
  // in (y's, partial sums resolved).
  tensor receive_gradient(const tensor& y, int m) {
    tensor g(y.layout().without_partial(), y.global_shape(), stage_ctx_->rank());
    world_->world().recv(std::span<T>(g.local().data(), g.local().size()), peer(1), tag(m, 2));
    return g;
  }

  // dx in the layout of the input x: the layout the previous stage sent its output in,
  // in which it receives the gradient.
  void send_gradient(flight_& f, tensor dx, int m) {
    f.tensors.push_back(std::move(dx));
    const tensor& t = f.tensors.back();
    f.requests.push_back(
        world_->world().isend(std::span<const T>(t.local().data(), t.local().size()), peer(-1), tag(m, 2)));
  }

  context* world_;
  int stages_;
  int per_stage_ = 1;
  int stage_ = 0;
  std::unique_ptr<context> stage_ctx_;
};

}  // namespace tessera::train
