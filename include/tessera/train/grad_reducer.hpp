// DistributedGradReducer: resolves the gradients of data-parallel parameters over the
// ranks that hold their replicas, in buckets: small gradients are packed together, and
// each bucket's all-reduce is started (non-blocking) as soon as the backward pass has
// finished with its last gradient, so that communication overlaps the rest of the pass.
// Also parameter_broadcast: every replica of every parameter set to rank 0's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/tensor/host_form.hpp>

namespace tessera::train {

namespace detail {

/// The mesh axes over which a layout holds replicas (split nothing), in order.
inline axis_list replica_axis_list(const layout& l) {
  axis_list a;
  const axis_mask r = l.replica_axes();
  for (int i = 0; i < l.dev.ndim; ++i)
    if (r >> i & 1u) a.push_back(i);
  return a;
}

/// The world ranks of `rank`'s group over `axes` of mesh `m`, in group order.
inline std::vector<int> group_ranks(const mesh& m, const axis_list& axes, int rank) {
  std::vector<int> out;
  const int g = group_size(m, axes);
  for (int i = 0; i < g; ++i) out.push_back(group_member(m, axes, rank, i));
  return out;
}

}  // namespace detail

/// Sets every replica of each parameter to the value its replica group's member
/// `root` holds (member 0 of a data-parallel group is world rank 0): MindSpore's
/// parameter_broadcast. Collective over the ranks of the parameters' meshes.
/// Parameters on a device other than the host need a communicator of that device's
/// buffers (staged_communicator over MPI for GPU shards).
template <class T, class D>
void broadcast_parameters(const std::vector<nn::parameter<T, D>*>& params, context& ctx, int root = 0) {
  for (nn::parameter<T, D>* p : params) {
    tensor_on<T, D>& d = p->data();
    const axis_list axes = detail::replica_axis_list(d.layout());
    if (group_size(d.layout().dev, axes) == 1) continue;
    ctx.on(d.layout().dev).group(axes).broadcast(std::span<T>(d.local().data(), d.local().size()), root);
  }
}

/// MindSpore's nn.DistributedGradReducer for the parameters of a network built on the
/// ranks of `ctx`.
///
/// What it returns, gradient by gradient, in the parameter's own layout:
///  - mean (MindSpore's gradients_mean=True, the default here and the seeds' setting):
///    the gradient of the GLOBAL loss. For a data-parallel network whose loss is the
///    mean over the global batch, each rank's gradient is a partial sum (its own rows'
///    share) and the reducer adds them up. This equals the mean over the ranks of each
///    rank's gradient of its local-batch mean loss, which is what MindSpore computes.
///  - sum (mean = false): that times the number of replicas, which equals the sum over
///    the ranks of the local-batch gradients (MindSpore's AllReduce.Sum alone).
///
/// How: parameters are assigned to buckets in reverse order (the order the backward
/// pass finishes their gradients), a bucket holding at most `bucket_bytes` of
/// gradients, and only parameters whose replicas live on the same ranks; a gradient of
/// `alone_bytes` or more gets a bucket of its own. The reducer registers itself with
/// its parameters; a training step (train::value_and_grad) hands it each gradient as
/// soon as it is final, and it copies small ones into their bucket's buffer and starts
/// the bucket's iall_reduce when the bucket is complete (a bucket of one gradient is
/// reduced in place; the step's last bucket, with nothing left to overlap, by a
/// blocking all_reduce). operator() waits for the buckets and returns the gradients.
/// Gradients that come without a step (computed otherwise) are reduced when
/// operator() is called. A host gradient held in a kernel's layout only (the
/// convolutions' dw in oneDNN's, tensor/host_form.hpp) is brought to row-major order
/// into its bucket (or a buffer of its own, when alone), which every rank shares
/// whatever layout its kernels chose, and written back into its layout once reduced:
/// the optimizer then updates weights kept in that layout in place.
///
///     train::distributed_grad_reducer grad_reducer(optimizer.parameters(), ctx);
///     auto [loss, grads] = grad_fn(images, labels);   // buckets start during the backward pass
///     grads = grad_reducer(grads);                     // waits; gradients in the parameters' layouts
///     optimizer(grads);
///
/// Until operator() has returned, a gradient being reduced must not be read. The
/// reducer must outlive the steps that use it and not move (its parameters point to it).
///
/// Parameters on a device D other than the host (a GPU) have device gradients, which C
/// must carry (staged_communicator over MPI, through pinned host memory). Their buckets
/// are the host's, parameter for parameter (the plan depends only on the parameters'
/// sizes and layouts): a bucket buffer in D's memory (storage<T, D>::array), each
/// gradient copied into it at its offset and back on completion by D's copy_n (on a GPU
/// a device-to-device copy on tessera's stream, ordered with the kernels that made the
/// gradient and with the communicator's staging).
template <class T, class D = cpu_device>
class distributed_grad_reducer final : public nn::grad_listener<T, D> {
 public:
  using tensor = tensor_on<T, D>;

  struct options {
    /// gradients_mean (see above).
    bool mean = true;
    /// Largest bucket, in bytes (PyTorch DDP's bucket_cap_mb, 25 MiB).
    std::size_t bucket_bytes = std::size_t(25) << 20;
    /// A gradient of at least this many bytes is reduced alone, in place: packing it
    /// would copy it twice and save no latency worth the copies.
    std::size_t alone_bytes = std::size_t(1) << 20;
    /// Broadcast every parameter from rank 0 on construction (MindSpore's
    /// parameter_broadcast); the parameters must be built.
    bool parameter_broadcast = false;
    /// Start each bucket's reduction during the backward pass (non-blocking). Off, the
    /// buckets are reduced one after the other when the reducer is called, each by a
    /// blocking all_reduce: no overlap, but no progress to wait for either.
    bool overlap = true;
  };

  /// What happened during the last step, in order: gradients handed over and buckets
  /// started (for tests and profiling).
  struct event {
    enum class kind { grad_ready, bucket_started } what;
    std::size_t index;  ///< the parameter (grad_ready) or the bucket (bucket_started)
    int nodes_left;     ///< tape nodes the backward pass still had to visit
  };

  /// One bucket: its parameters (indices into parameters()), size and group.
  struct bucket_info {
    std::vector<std::size_t> params;
    std::size_t bytes = 0;
    int group_size = 1;
  };

  distributed_grad_reducer(std::vector<nn::parameter<T, D>*> params, context& ctx)
      : distributed_grad_reducer(std::move(params), ctx, options{}) {}
  distributed_grad_reducer(std::vector<nn::parameter<T, D>*> params, context& ctx, options opt)
      : params_(std::move(params)), ctx_(&ctx), opt_(opt) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i]) throw error("distributed_grad_reducer: parameter " + std::to_string(i) + " is null");
      params_[i]->set_listener(this);
    }
    if (opt_.parameter_broadcast) {
      for (auto* p : params_)
        if (!p->built())
          throw error("distributed_grad_reducer: parameter_broadcast needs built parameters: parameter '" +
                      p->name() + "' is not built; call build(ctx) on the network first");
      broadcast_parameters(params_, ctx);
    }
    bool all_built = true;
    for (auto* p : params_) all_built = all_built && p->built();
    if (all_built) make_plan();
  }

  distributed_grad_reducer(const distributed_grad_reducer&) = delete;
  distributed_grad_reducer& operator=(const distributed_grad_reducer&) = delete;

  ~distributed_grad_reducer() override {
    for (auto* p : params_)
      if (p->listener() == this) p->set_listener(nullptr);
    for (bucket& b : buckets_)
      if (b.req) b.req->wait();
  }

  const std::vector<nn::parameter<T, D>*>& parameters() const { return params_; }
  const options& config() const { return opt_; }

  /// The buckets (after the first step, or at once when the parameters were built).
  std::vector<bucket_info> buckets() const {
    std::vector<bucket_info> out;
    for (const bucket& b : buckets_) out.push_back({b.members, b.elements * sizeof(T), b.group_size});
    return out;
  }
  /// The events of the last step.
  const std::vector<event>& events() const { return events_; }

  /// Waits for the gradients of this step (or reduces them now) and returns them in
  /// the parameters' layouts. The argument's shards are moved into the result.
  std::vector<tensor> operator()(std::vector<tensor>& grads) {
    if (grads.size() != params_.size())
      throw error("distributed_grad_reducer: " + std::to_string(grads.size()) + " gradients for " +
                  std::to_string(params_.size()) + " parameters");
    if (!planned_) make_plan();
    if (!in_step_) {
      begin_step();
      for (std::size_t i = 0; i < params_.size(); ++i) deliver(i, grads[i], 0);
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!state_[i].delivered)
        throw error("distributed_grad_reducer: the gradient of parameter '" + params_[i]->name() +
                    "' was not handed over during the step");
    for (bucket& b : buckets_)
      if (b.req) {
        b.req->wait();
        b.req.reset();
      }
    std::vector<tensor> out;
    out.reserve(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) out.push_back(finish(i, grads[i]));
    in_step_ = false;
    return out;
  }
  std::vector<tensor> operator()(std::vector<tensor>&& grads) { return (*this)(grads); }

  // ---- grad_listener ----------------------------------------------------------

  void backward_begin() override {
    if (opt_.overlap) begin_step();
  }

  void grad_ready(nn::parameter<T, D>& p, tensor& g, int nodes_left) override {
    if (!opt_.overlap) return;  // operator() reduces everything
    const auto it = std::find(params_.begin(), params_.end(), &p);
    if (it == params_.end()) return;
    if (!in_step_) begin_step();
    deliver(std::size_t(it - params_.begin()), g, nodes_left);
  }

 private:
  void begin_step() {
    if (!planned_) make_plan();
    if (in_step_)
      throw error("distributed_grad_reducer: a new step began before the last step's gradients were collected "
                  "(call the reducer with them)");
    in_step_ = true;
    events_.clear();
    for (auto& s : state_) s = param_state{s.bucket, s.offset, false, false, nullptr, false, {}};
    for (bucket& b : buckets_) b.ready = 0;
    started_ = 0;
  }

  static constexpr bool on_host = std::is_same_v<D, cpu_device>;

  using request_t = any_request;
  struct bucket {
    any_communicator* comm = nullptr;
    int group_size = 1;
    std::vector<int> ranks;
    std::vector<std::size_t> members;
    std::size_t elements = 0;
    typename storage<T, D>::array buffer;  // packed gradients (buckets of two or more), in D's memory
    std::size_t ready = 0;
    std::optional<request_t> req;
  };
  struct param_state {
    std::size_t bucket = 0, offset = 0;
    bool delivered = false;
    bool on_plan = false;  // partial exactly over its replica axes: reduced in its bucket
    T* data = nullptr;     // the gradient's buffer (reduced in place in a bucket of one)
    // A gradient held in a kernel's layout only (a host form: the convolutions' dw) is
    // reduced in row-major order, which every rank shares whatever layout its kernels
    // chose, and written back into its form: `plain` holds it in a bucket of one.
    bool form = false;
    typename storage<T, D>::array plain;
  };

  void make_plan() {
    state_.assign(params_.size(), param_state{});
    buckets_.clear();
    // The open bucket of each group of ranks.
    std::vector<std::pair<std::vector<int>, std::size_t>> open;
    for (std::size_t k = params_.size(); k-- > 0;) {
      nn::parameter<T, D>& p = *params_[k];
      const layout& l = p.layout();
      if (l.has_partial())
        throw error("distributed_grad_reducer: parameter '" + p.name() + "' has a partial layout " + to_string(l));
      const axis_list axes = detail::replica_axis_list(l);
      std::vector<int> ranks = detail::group_ranks(l.dev, axes, ctx_->rank());
      const std::size_t n = std::size_t(p.data().local_shape().size());
      auto it = std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == ranks; });
      const bool alone = n * sizeof(T) >= opt_.alone_bytes;
      if (alone && it != open.end()) {  // a large gradient closes the group's open bucket
        open.erase(it);
        it = open.end();
      }
      if (it == open.end() || (buckets_[it->second].elements + n) * sizeof(T) > opt_.bucket_bytes) {
        bucket b;
        b.group_size = int(ranks.size());
        b.comm = b.group_size > 1 ? &ctx_->on(l.dev).group(axes) : nullptr;
        b.ranks = ranks;
        buckets_.push_back(std::move(b));
        if (it == open.end()) it = open.insert(open.end(), {std::move(ranks), buckets_.size() - 1});
        else it->second = buckets_.size() - 1;
      }
      bucket& b = buckets_[it->second];
      state_[k].bucket = it->second;
      state_[k].offset = b.elements;
      b.members.push_back(k);
      b.elements += n;
      if (alone) open.erase(it);  // nothing joins it
    }
    for (bucket& b : buckets_)
      if (b.members.size() > 1 && b.comm) {
        b.buffer = storage<T, D>::empty(extents{index_t(b.elements)});
        storage<T, D>::fill(b.buffer, T(0));
      }
    planned_ = true;
  }

  // True when g is p's layout made partial (sum) over exactly p's replica axes of size
  // more than one: then the sum over the bucket's group resolves it.
  static bool on_plan(const nn::parameter<T, D>& p, const tensor& g) {
    const layout& pl = p.layout();
    const layout& gl = g.layout();
    if (!(gl.without_partial() == pl) || (gl.has_partial() && gl.op != reduce_op::sum)) return false;
    const axis_mask replicas = pl.replica_axes();
    for (int a = 0; a < pl.dev.ndim; ++a) {
      const bool is_replica = replicas >> a & 1u;
      if (gl.is_partial(a) && !is_replica) return false;
      if (is_replica && pl.dev.dims[a] > 1 && !gl.is_partial(a)) return false;
    }
    return true;
  }

  void deliver(std::size_t i, tensor& g, int nodes_left) {
    param_state& s = state_[i];
    if (s.delivered)
      throw error("distributed_grad_reducer: the gradient of parameter '" + params_[i]->name() +
                  "' was handed over twice in one step");
    if (!(g.global_shape() == params_[i]->shape()))
      throw error("distributed_grad_reducer: the gradient of parameter '" + params_[i]->name() + "' is " +
                  to_string(g.global_shape()) + ", the parameter " + to_string(params_[i]->shape()));
    s.delivered = true;
    s.on_plan = on_plan(*params_[i], g);
    events_.push_back({event::kind::grad_ready, i, nodes_left});
    bucket& b = buckets_[s.bucket];
    const bool packed = b.members.size() > 1;
    if constexpr (on_host) s.form = s.on_plan && b.comm && g.form() && !g.plain_current();
    if (s.form) {
      if constexpr (on_host) {
        if (!packed) s.plain = storage<T, D>::empty(g.local_shape());
        g.form()->to_plain(packed ? b.buffer.data() + s.offset : s.plain.data());
        s.data = packed ? nullptr : s.plain.data();
      }
    } else if (b.comm) {  // a group of one rank has nothing to reduce
      s.data = g.local().data();
      if (packed) {
        T* dst = b.buffer.data() + s.offset;
        const std::size_t n = std::size_t(g.local().size());
        if (s.on_plan) storage<T, D>::copy_n(g.local().data(), dst, n);
        else storage<T, D>::fill_n(dst, n, T(0));
      }
    }
    if (++b.ready == b.members.size()) start(s.bucket, nodes_left);
    progress();
  }

  void start(std::size_t k, int nodes_left) {
    bucket& b = buckets_[k];
    events_.push_back({event::kind::bucket_started, k, nodes_left});

    struct count_start {
      std::size_t& n;
      ~count_start() { ++n; }
    } counted{started_};
    if (!b.comm) return;
    bool any = false;
    for (std::size_t m : b.members) any = any || state_[m].on_plan;
    if (!any) return;  // every member resolved otherwise (the same on every rank)
    T* data = b.members.size() > 1 ? b.buffer.data() : state_[b.members[0]].data;
    // The step's last bucket has nothing left to overlap with: a blocking all_reduce
    // (faster than the non-blocking one's progress) finishes it at once.
    if (opt_.overlap && started_ + 1 < buckets_.size())
      b.req.emplace(b.comm->iall_reduce(std::span<T>(data, b.elements), reduce_op::sum));
    else b.comm->all_reduce(std::span<T>(data, b.elements), reduce_op::sum);
  }

  // Lets the library move pending reductions along (MPI progresses on calls).
  void progress() {
    for (bucket& b : buckets_)
      if (b.req) {
        if constexpr (requires(request_t& r) { r.test(); }) (void)b.req->test();
      }
  }

  // Multiplies every element of the array by `factor` (the host loop, or D's kernel).
  static void scale(typename tensor::array_type& a, T factor) {
    if constexpr (on_host) {
      for (T& v : std::span<T>(a.data(), a.size())) v *= factor;
    } else {
      kernels::backend<D>::scale(a, factor);
    }
  }

  tensor finish(std::size_t i, tensor& g) {
    nn::parameter<T, D>& p = *params_[i];
    param_state& s = state_[i];
    const bucket& b = buckets_[s.bucket];
    const layout& pl = p.layout();
    T factor = T(1);
    if (!opt_.mean) factor = T(group_size(pl.dev, detail::replica_axis_list(pl)));
    if (!s.on_plan) {
      tensor r = g.layout() == pl ? std::move(g) : redistribute(g, pl, *ctx_);
      if (factor != T(1)) scale(r.local(), factor);
      return r;
    }
    if (s.form) {  // back into the gradient's form, in place
      if constexpr (on_host) {
        host_form<T>& f = *g.form_for_update();
        f.from_plain(b.members.size() > 1 ? b.buffer.data() + s.offset : s.plain.data());
        if (factor != T(1))
          for (T& v : f.values()) v *= factor;
        s.plain = typename storage<T, D>::array();
      }
      return std::move(g).relabeled(pl);
    }
    if (!b.comm) return std::move(g).relabeled(pl);  // a group of one rank: nothing reduced, factor 1
    T* dst = g.local().data();
    if (b.members.size() > 1 && b.comm) {
      const T* src = b.buffer.data() + s.offset;
      const std::size_t n = std::size_t(g.local().size());
      if constexpr (on_host) {
        if (factor == T(1)) std::memcpy(dst, src, n * sizeof(T));
        else
          for (std::size_t j = 0; j < n; ++j) dst[j] = factor * src[j];
      } else {
        storage<T, D>::copy_n(src, dst, n);
        if (factor != T(1)) scale(g.local(), factor);
      }
    } else if (b.comm) {
      if (dst != s.data)
        throw error("distributed_grad_reducer: the gradient of parameter '" + p.name() +
                    "' is not the one handed over during the step (a copy?); pass the step's gradients "
                    "themselves: grads = reducer(grads)");
      if (factor != T(1)) scale(g.local(), factor);
    }
    return tensor(pl, p.shape(), g.rank(), std::move(g.local()));
  }

  std::vector<nn::parameter<T, D>*> params_;
  context* ctx_;
  options opt_;
  bool planned_ = false;
  bool in_step_ = false;
  std::size_t started_ = 0;  // buckets started in this step
  std::vector<bucket> buckets_;
  std::vector<param_state> state_;
  std::vector<event> events_;
};

}  // namespace tessera::train
