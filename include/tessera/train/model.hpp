// Model (MindSpore's mindspore.train.Model): a module network, a loss and an optimizer
// trained by train(epochs, dataset, callbacks) and measured by eval(dataset), in every
// parallel mode: the network is traced into a graph, parallelized and run by the graph
// executor, with the data-parallel gradients reduced in buckets during the backward
// pass. Also evaluate(), the accuracy of a network run eagerly. The network may live on
// any device (its parameters' device D, deduced from its type): the data pipeline's
// host batches are copied to D for each step and the loss read back.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/graph/parallel.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/nn/trace.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/ops/dropout_rule.hpp>
#include <tessera/optim/optimizer.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/train/callbacks.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>

namespace tessera::train {

/// One rank's rows of a batch: inputs (batch, ...) and labels as values of T: class
/// indices (batch,), or targets of the output's shape.
template <class T>
struct local_batch {
  xt::xarray<T> inputs;
  xt::xarray<T> labels;
};

namespace detail {

template <class T, class A>
xt::xarray<T> as_array(const xt::xarray<A>& a) {
  if constexpr (std::is_same_v<A, T>) return a;
  else {
    xt::xarray<T> out = xt::xarray<T>::from_shape(a.shape());
    for (std::size_t i = 0; i < a.size(); ++i) out.data()[i] = T(a.data()[i]);
    return out;
  }
}

/// The rows of a batch element as Model reads them: a pair (or tuple) of arrays
/// (inputs, labels), or a local_batch. Overloads for other batch types (data/'s rows)
/// are found by argument-dependent lookup: `to_local_batch(tag<T>, const B&)`.
template <class T>
struct tag {};

template <class T, class X, class Y>
local_batch<T> to_local_batch(tag<T>, const std::pair<xt::xarray<X>, xt::xarray<Y>>& b) {
  return {as_array<T>(b.first), as_array<T>(b.second)};
}
template <class T, class X, class Y>
local_batch<T> to_local_batch(tag<T>, const std::tuple<xt::xarray<X>, xt::xarray<Y>>& b) {
  return {as_array<T>(std::get<0>(b)), as_array<T>(std::get<1>(b))};
}
template <class T>
local_batch<T> to_local_batch(tag<T>, const local_batch<T>& b) {
  return b;
}

/// Pass e of a dataset: ds.epoch(e) when it has one (data::dataset), else the range.
template <class D>
decltype(auto) epoch_of(D& ds, std::int64_t e) {
  if constexpr (requires { ds.epoch(e); }) return ds.epoch(e);
  else return (ds);
}

/// Batches per epoch when the dataset knows (get_dataset_size() or size()), else -1.
template <class D>
std::int64_t batches_per_epoch(const D& ds) {
  if constexpr (requires { ds.get_dataset_size(); }) return std::int64_t(ds.get_dataset_size());
  else if constexpr (requires { ds.size(); }) return std::int64_t(ds.size());
  else return -1;
}

/// The device of a network's parameters (Net::device_type; the host for a network
/// that does not name one).
template <class Net>
struct device_of_net {
  using type = cpu_device;
};
template <class Net>
  requires requires { typename Net::device_type; }
struct device_of_net<Net> {
  using type = typename Net::device_type;
};
template <class Net>
using device_of_net_t = typename device_of_net<Net>::type;

// A small all-reduce of host values over the world of ctx: through its communicator
// when it takes host memory; when it takes device buffers, through its host
// communicator (any_communicator::host_communicator(): staged_communicator<any_communicator>), else
// through a copy in D's memory.
template <class D, class U>
void host_all_reduce(context& ctx, std::span<U> v, reduce_op op) {
  any_communicator& w = ctx.world();
  if (!w.device_buffers()) {
    w.all_reduce(v, op);
  } else if (any_communicator* h = w.host_communicator()) {
    h->all_reduce(v, op);
  } else if constexpr (!std::is_same_v<D, cpu_device>) {
    xt::xarray<U> h = xt::xarray<U>::from_shape({v.size()});
    std::copy(v.begin(), v.end(), h.data());
    auto d = storage<U, D>::from_host(h);
    w.all_reduce(std::span<U>(d.data(), d.size()), op);
    h = storage<U, D>::to_host(d);
    std::copy_n(h.data(), v.size(), v.begin());
  } else {
    throw error("model: host values to reduce over the " + std::string(w.backend()) +
                " backend, which takes device buffers and has no host communicator");
  }
}

// The ranks agree that each has a batch of the same size, or that all are done.
// Throws on every rank otherwise (a rank with fewer batches would leave the others
// waiting in a collective).
template <class D>
bool agree_on_batch(context& ctx, std::int64_t rows, bool have, const char* who) {
  std::vector<std::int64_t> v{have ? rows : -1, have ? -rows : -1, have ? 1 : 0, have ? -1 : 0};
  // max(rows), max(-rows) = -min(rows), whether any rank has a batch, -(whether all have)
  host_all_reduce<D>(ctx, std::span<std::int64_t>(v), reduce_op::max);
  const bool any = v[2] == 1, all = v[3] == -1;
  if (!any) return false;
  if (!all)
    throw error(std::string(who) + ": the ranks ran out of batches at different steps (shard the dataset into "
                                   "equal parts and batch with drop_remainder)");
  if (v[0] != -v[1])
    throw error(std::string(who) + ": the ranks' batches differ in size: " + std::to_string(-v[1]) + " to " +
                std::to_string(v[0]) + " rows (batch with drop_remainder)");
  return true;
}

// A host tensor on device D: itself on the host, its shard copied to D elsewhere.
template <class D, class T>
tensor_on<T, D> host_to(tensor_on<T, cpu_device>&& x) {
  if constexpr (std::is_same_v<D, cpu_device>) return std::move(x);
  else return tensor_on<T, D>(x.layout(), x.global_shape(), x.rank(), storage<T, D>::from_host(x.local()));
}

// This rank's rows as shards of the global batch, split over every rank: the inputs
// on device D (copied there), the labels on the host (as the losses take them).
template <class D, class T>
std::pair<tensor_on<T, D>, dist_tensor<std::int32_t>> to_tensors(local_batch<T>& b, context& ctx) {
  const int p = ctx.size();
  const index_t rows = index_t(b.inputs.shape()[0]);
  if (b.labels.dimension() != 1 || index_t(b.labels.shape()[0]) != rows) {
    extents ls;
    ls.ndim = int(b.labels.dimension());
    for (int d = 0; d < ls.ndim; ++d) ls.v[d] = index_t(b.labels.shape()[std::size_t(d)]);
    throw error("model: a batch has " + std::to_string(rows) + " inputs and labels of shape " + to_string(ls));
  }
  extents xs;
  xs.ndim = int(b.inputs.dimension());
  for (int d = 0; d < xs.ndim; ++d) xs.v[d] = index_t(b.inputs.shape()[std::size_t(d)]);
  xs.v[0] = rows * p;
  layout xl = layout::replicated(mesh{p}, xs.ndim);
  xl.split[0] = axis_list{0};
  dist_tensor<T> x(xl, xs, ctx.rank(), std::move(b.inputs));
  dist_tensor<std::int32_t> y(layout(mesh{p}, {{0}}), extents{rows * p}, ctx.rank(), as_array<std::int32_t>(b.labels));
  return {host_to<D>(std::move(x)), std::move(y)};
}

// Rows whose largest logit is at the label, counted once over the ranks that share
// them (the ranks of a row's replicas are told apart by their coordinates). Logits
// on a device are laid out there (the labels copied to it) and read back.
template <class T, class D>
double count_correct(const tensor_on<T, D>& logits, const dist_tensor<std::int32_t>& labels, context& ctx) {
  const layout rows(logits.layout().dev, {logits.layout().split[0], axis_list{}});
  const laid_out<T, D> lx = nn::detail::placed_as(logits, rows, ctx);
  // The labels on D (a copy off the host), then in the rows' layout.
  std::optional<tensor_on<std::int32_t, D>> labels_copy;
  const tensor_on<std::int32_t, D>* yd = nullptr;
  if constexpr (std::is_same_v<D, cpu_device>) {
    yd = &labels;
  } else {
    labels_copy.emplace(host_to<D>(dist_tensor<std::int32_t>(labels)));
    yd = &*labels_copy;
  }
  const laid_out<std::int32_t, D> ly = nn::detail::placed_as(*yd, layout(rows.dev, {rows.split[0]}), ctx);
  // Count only on the first replica of each row block.
  const mesh_coords c = rows.dev.coords(ctx.rank());
  for (int a = 0; a < rows.dev.ndim; ++a)
    if (!rows.split[0].contains(a) && c[a] != 0) return 0;
  // On the host: the shards themselves; elsewhere: their copies.
  const auto& x = storage<T, D>::to_host(lx->local());
  const auto& y = storage<std::int32_t, D>::to_host(ly->local());
  const std::size_t n = x.shape()[0], k = x.shape()[1];
  double correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t best = 0;
    for (std::size_t j = 1; j < k; ++j)
      if (x.data()[i * k + j] > x.data()[i * k + best]) best = j;
    correct += std::int32_t(best) == y.data()[i] ? 1 : 0;
  }
  return correct;
}

}  // namespace detail

/// The results of Model::eval over a dataset: MindSpore's metrics {"accuracy", "loss"}.
struct eval_result {
  double accuracy = 0;       ///< correct / samples (argmax of the logits equals the label)
  double loss = 0;           ///< the loss averaged over the batches
  std::int64_t samples = 0;  ///< samples seen, over all ranks
};

namespace detail {

/// What one evaluated batch gives: its loss, this rank's correct rows, its global rows.
struct batch_score {
  double loss = 0, correct = 0;
  std::int64_t rows = 0;
};

/// One pass over `dataset` with `net` in evaluation mode, the ranks agreeing on every
/// batch (`who` names the caller in the error of a rank that runs out early):
/// `score(local_batch<T>&)` evaluates a batch; the accuracy and the mean loss.
template <class T, class D, class Net, class Dataset, class Score>
eval_result eval_pass(Net& net, Dataset& dataset, context& ctx, const char* who, Score&& score) {
  const bool was_training = net.training();
  net.set_train(false);
  double correct = 0, loss_sum = 0;
  std::int64_t samples = 0, batches = 0;
  auto&& pass = epoch_of(dataset, 0);
  auto end = pass.end();
  for (auto it = pass.begin();; ++it) {
    const bool have = !(it == end);
    std::optional<local_batch<T>> b;
    if (have) b = to_local_batch(tag<T>{}, *it);
    if (!agree_on_batch<D>(ctx, b ? std::int64_t(b->inputs.shape()[0]) : 0, have, who)) break;
    const batch_score s = score(*b);
    loss_sum += s.loss;
    correct += s.correct;
    samples += s.rows;
    ++batches;
  }
  net.set_train(was_training);
  std::vector<double> c{correct};
  host_all_reduce<D>(ctx, std::span<double>(c), reduce_op::sum);
  eval_result r;
  r.samples = samples;
  r.accuracy = samples ? c[0] / double(samples) : 0.0;
  r.loss = batches ? loss_sum / double(batches) : 0.0;
  return r;
}

}  // namespace detail

/// The accuracy and mean loss of `net` over `dataset` (MindSpore's Model.eval with the
/// accuracy metric), in evaluation mode (no dropout, no gradients), over every rank's
/// rows: each sample counted once. Collective. The dataset is read as Model::train
/// reads it. A network on a device D (Net::device_type) is evaluated there: each
/// batch's inputs are copied to D, its loss and correct rows read back; ctx's
/// communicator must then carry D's buffers (device_communicator(world, D{})).
template <class Net, class Loss, class Dataset>
eval_result evaluate(Net& net, Loss& loss_fn, Dataset& dataset, context& ctx) {
  using T = typename Net::value_type;
  using D = detail::device_of_net_t<Net>;
  return detail::eval_pass<T, D>(net, dataset, ctx, "evaluate", [&](local_batch<T>& b) {
    const auto [x, y] = detail::to_tensors<D>(b, ctx);
    autodiff::tape<T, D> t(ctx);
    const auto logits = net(t.leaf_view(x, false));
    const auto loss = loss_fn(logits, y);
    return detail::batch_score{double(scalar(loss.value(), ctx)), detail::count_correct(logits.value(), y, ctx),
                               x.global_shape()[0]};
  });
}

/// The parallel configuration of a model by default: data parallel (the batch split
/// over every rank, the parameters replicated, their gradients reduced in buckets).
inline graph::parallel_config data_parallel_config() {
  graph::parallel_config c;
  c.mode = graph::parallel_mode::data_parallel;
  return c;
}

/// MindSpore's Model(net, loss_fn, optimizer): trains and evaluates a network written
/// as modules, in any parallel mode. At the first step (or eval) the network and its
/// loss are traced with the batch's shapes (nn::trace), the graph is parallelized as
/// options::parallel says (MindSpore's set_auto_parallel_context: stand_alone,
/// data_parallel, semi_auto_parallel with the strategies set on the modules,
/// auto_parallel by a search, hybrid_parallel), the parameters are laid out as the plan
/// says, and every step runs the plan (graph::executor) on this rank's rows:
///
///     train::model model(net, loss_fn, opt, ctx);   // data parallel
///     train::loss_monitor lm(10);
///     model.train(10, dataset, {&lm});
///     const auto m = model.eval(test_set);          // m.accuracy
///
///     train::model::options o;
///     o.parallel.mode = graph::parallel_mode::auto_parallel;
///     o.parallel.search = graph::search_mode::dynamic_programming;
///     train::model model(net, loss_fn, opt, ctx, o);
///
/// With pipeline stages (options::parallel's pipeline_stages, micro_size and schedule;
/// module::set_pipeline_stage on the modules) the network is traced for one
/// micro-batch (the global batch over micro_size), each rank holds and trains its
/// stage's parameters (laid out over its stage's ranks), and a step runs the
/// micro-batches in the schedule's order (graph::executor). The ranks of a stage split
/// the batch: under dataset_strategy data_parallel, rank r reads block r mod
/// (ranks / pipeline_stages) of the global batch, every stage the same rows. A
/// checkpoint holds every parameter whole (each sent from its stage). With optimizer
/// parallel, each stage's optimizer state is split over that stage's replicas and the
/// step reduce-scatters the gradients the micro-batches summed. eval runs the
/// micro-batches' forward passes through the stages. Not yet with pipeline stages:
/// batches of more than one shape (for eval too), devices other than the host.
///
/// In data_parallel the gradients go to a distributed_grad_reducer as the backward pass
/// finishes each (its buckets' all-reduces overlap the rest of the pass), or, with
/// optimizer parallel, to the optimizer as they are (its step reduce-scatters them); in
/// the other modes the plan resolves them. Every step moves exactly the bytes the plan
/// prices.
///
/// A dataset is anything whose elements are batches of this rank's rows, a pair
/// (inputs, labels) of xt::xarray (data::dataset rows once data/ is included): either
/// a range, iterated once per epoch, or an object with epoch(e) (each epoch its own
/// pass). Every rank must see batches of the same size, as many as the others: the
/// ranks check it together at each step (an error, not a hang, otherwise). With
/// dataset_strategy data_parallel (the default) each rank's rows are its slice of the
/// global batch; full_batch, or stand_alone and hybrid_parallel, read the whole batch.
///
/// The network, loss and optimizer may live on a device D other than the host (a GPU:
/// nn::module<float, cuda_device>, optim::sgd<float, cuda_device>), deduced from the
/// network's type; ctx's communicator must then carry D's buffers (a
/// staged_communicator<any_communicator> for GPU shards through the host world). The
/// batches stay host arrays: each step copies them to D and reads the loss back for
/// the callbacks, which are the host's (run_context's host_parameters gives checkpoints
/// the parameters' host copies).
template <class Net, class Loss>
class model {
  using D = detail::device_of_net_t<Net>;

 public:
  using T = typename Net::value_type;
  /// The device of the network's parameters (cpu_device, cuda_device).
  using device_type = D;

  struct options {
    bool gradients_mean = true;                         ///< see distributed_grad_reducer
    std::size_t bucket_bytes = std::size_t(25) << 20;   ///< the reducer's bucket size
    bool parameter_broadcast = false;                   ///< broadcast rank 0's parameters first
    /// How the traced network runs: mode, search, dataset strategy, machine balance
    /// (device_num and elem_bytes are the model's).
    graph::parallel_config parallel = data_parallel_config();
    std::uint64_t seed = 0;                             ///< the network's seed when the model builds it
  };

  model(Net& net, Loss& loss_fn, optim::optimizer<T, D>& opt, context& ctx)
      : model(net, loss_fn, opt, ctx, options{}) {}
  model(Net& net, Loss& loss_fn, optim::optimizer<T, D>& opt, context& ctx, options o)
      : net_(&net), loss_(&loss_fn), opt_(&opt), ctx_(&ctx), opt_config_(std::move(o)) {}

  Net& network() { return *net_; }

  /// Continues the training saved in checkpoint `file` by model_checkpoint (DIR/NAME, as
  /// it names them; io::latest_complete_checkpoint finds the newest whole one): the next
  /// train() starts where that training stopped, at the saved epoch and step, the
  /// batches already trained on skipped; the network's parameters, the optimizer's state
  /// and step count (the learning rate's schedule goes on from it) and the dropout
  /// layers' draws load once the network is compiled (the first step, or an eval
  /// before). A training killed and resumed so, on as many ranks, takes the steps the
  /// uninterrupted one takes: the same numbers.
  /// The parameters and the state load into this model's layouts, on any number of
  /// ranks; the network and the seed (options::seed, which keys the dropout layers'
  /// streams) must be the saved training's. Reads the checkpoint's metadata now; throws
  /// for a checkpoint saved without its training state (model_checkpoint's
  /// save_training_state off).
  void resume_from(const std::filesystem::path& file) {
    const std::map<std::string, std::string> md = io::checkpoint_metadata(file);
    const auto number = [&](const char* key) {
      const auto it = md.find(key);
      if (it == md.end())
        throw error("model.resume_from: " + file.string() + " holds no training state (no \"" + key +
                    "\"): save it with model_checkpoint's save_training_state on");
      try {
        std::size_t used = 0;
        const long long v = std::stoll(it->second, &used);
        if (used == it->second.size() && v >= 0) return std::int64_t(v);
      } catch (const std::exception&) {
      }
      throw error("model.resume_from: " + file.string() + ": \"" + key + "\" is \"" + it->second +
                  "\", expected a count");
    };
    resume_point r;
    r.file = file;
    r.epoch = number(state_keys::epoch);
    r.step_in_epoch = number(state_keys::step_in_epoch);
    r.step = number(state_keys::step);
    r.optimizer_step = number(state_keys::optimizer_step);
    if (const auto it = md.find(state_keys::dropout_calls); it != md.end()) r.dropout_calls = it->second;
    if (r.epoch < 1) throw error("model.resume_from: " + file.string() + ": the saved epoch is 0");
    resume_ = std::move(r);
  }

  /// Trains `epochs` passes over `dataset`, calling the callbacks' hooks. After
  /// resume_from, the epochs before the saved one are not run, and of that one the
  /// batches already trained on are read and skipped; the step count goes on from the
  /// saved one.
  template <class Dataset>
  void train(int epochs, Dataset& dataset, const std::vector<callback<T>*>& callbacks = {}) {
    if (epochs < 0) throw error("model.train: epochs must not be negative, got " + std::to_string(epochs));
    net_->set_train(true);
    run_context<T> rc;
    rc.epochs = epochs;
    rc.rank = ctx_->rank();
    rc.ranks = ctx_->size();
    rc.steps_per_epoch = detail::batches_per_epoch(dataset);
    int first_epoch = 0;
    std::int64_t skip = 0;  // batches of the first epoch trained on before the resumed run
    if (resume_) {
      first_epoch = int(resume_->epoch - 1);
      skip = resume_->step_in_epoch;
      rc.step = resume_->step;
      if (rc.steps_per_epoch > 0 && skip >= rc.steps_per_epoch) {  // saved at the end of its epoch
        ++first_epoch;
        skip = 0;
      }
    }
    rc.optimizer_state = [opt = opt_] { return opt->state_tensors(); };
    rc.training_state = [this, &rc] { return training_state(rc); };
    if constexpr (std::is_same_v<D, cpu_device>) {
      if (opt_config_.parallel.pipeline_stages > 1) set_pipeline_checkpoint(rc);
      else rc.parameters = net_->named_parameters();
    } else {
      rc.host_parameters = [net = net_] {
        std::vector<std::pair<std::string, dist_tensor<T>>> out;
        for (auto& [name, p] : net->named_parameters()) {
          const tensor_on<T, D>& d = p->data();
          out.emplace_back(name,
                           dist_tensor<T>(d.layout(), d.global_shape(), d.rank(), storage<T, D>::to_host(d.local())));
        }
        return out;
      };
    }
    for (auto* cb : callbacks) cb->on_train_begin(rc);
    for (int e = first_epoch; e < epochs && !rc.stop_requested; ++e) {
      rc.epoch = e + 1;
      rc.step_in_epoch = 0;
      for (auto* cb : callbacks) cb->on_epoch_begin(rc);
      auto&& pass = detail::epoch_of(dataset, e);
      auto it = pass.begin();
      auto end = pass.end();
      for (; skip > 0; --skip, ++rc.step_in_epoch, ++it)
        if (it == end)
          throw error("model.train: resuming after step " + std::to_string(rc.step_in_epoch + skip) + " of epoch " +
                      std::to_string(e + 1) + ", but the epoch has only " + std::to_string(rc.step_in_epoch) +
                      " batches");
      while (true) {
        const bool have = !(it == end);
        std::optional<local_batch<T>> b;
        if (have) b = to_local_batch(detail::tag<T>{}, *it);
        if (!detail::agree_on_batch<D>(*ctx_, b ? std::int64_t(b->inputs.shape()[0]) : 0, have, "model.train"))
          break;
        compile(*b);
        rc.batch_samples = global_rows(*b);
        for (auto* cb : callbacks) cb->on_step_begin(rc);
        const auto t0 = std::chrono::steady_clock::now();
        rc.loss = double(step(*b));
        rc.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++rc.step;
        ++rc.step_in_epoch;
        for (auto* cb : callbacks) cb->on_step_end(rc);
        if (rc.stop_requested) break;
        ++it;
      }
      for (auto* cb : callbacks) cb->on_epoch_end(rc);
    }
    resume_.reset();  // the position is spent (and the tensors loaded, unless no step ran)
    for (auto* cb : callbacks) cb->on_train_end(rc);
  }

  /// The accuracy (the argmax of the network's output against class labels) and the
  /// mean loss over `dataset`, in evaluation mode (no dropout, no gradients), each
  /// sample counted once over the ranks. Collective.
  ///
  /// With pipeline stages or micro-batches the batches are read as train() reads them
  /// and must have the training batches' shape; each runs its micro-batches' forward
  /// passes through the stages, and the last stage's ranks count the correct rows.
  template <class Dataset>
  eval_result eval(Dataset& dataset) {
    return detail::eval_pass<T, D>(*net_, dataset, *ctx_, "model.eval", [&](local_batch<T>& b) {
      compile(b);
      if (pipelined()) return pipelined_score(b);
      const int label_id = current_->graph.inputs()[1];
      const dist_tensor<std::int32_t> y(current_->plan->value_layout(label_id), current_->graph.at(label_id).shape,
                                        ctx_->rank(), detail::as_array<std::int32_t>(b.labels));
      auto e = current_->exec->evaluate({b.inputs, b.labels}, {current_->output});
      return detail::batch_score{double(e.loss), detail::count_correct(e.values[0], y, *ctx_), global_rows(b)};
    });
  }

  /// The gradient reducer (data_parallel, made at the first step; none when the
  /// optimizer reduces the gradients itself, with optimizer parallel, or in the other
  /// modes, where the plan resolves them).
  distributed_grad_reducer<T, D>* reducer() { return reducer_.get(); }

  /// The parallel plan of the traced network for the last batch's shapes (made at the
  /// first step or eval); throws before.
  const graph::parallel_graph& plan() const {
    if (!current_) throw error("model: no plan yet: the network is traced at the first step or eval");
    return *current_->plan;
  }
  /// What this rank's communicators moved during the last step's forward and backward
  /// passes and gradient reduction (equal to the plan's bytes for this rank; not the
  /// optimizer's step, whose optimizer parallel moves the reduction there: with
  /// pipeline stages, the plan's bytes less bytes_reduced_once).
  traffic last_step_traffic() const { return last_; }
  /// Writes this rank's dumps of the plan under `dir` (MindSpore's save_graphs).
  void save_graphs(const std::filesystem::path& dir) const { graph::save_graphs(plan(), dir, ctx_->rank()); }

 private:
  // A pipelined model's checkpoints: every parameter and its optimizer state whole,
  // each from its stage.
  void set_pipeline_checkpoint(run_context<T>& rc) {
    rc.host_parameters = [this] {
      std::vector<std::pair<std::string, dist_tensor<T>>> out;
      for (auto& [name, p] : net_->named_parameters()) out.emplace_back(name, job_whole(name, p->data()));
      return out;
    };
    rc.optimizer_state = [this] {
      std::vector<std::pair<std::string, dist_tensor<T>>> out;
      for (auto& [name, t] : opt_->state_tensors()) {
        const std::size_t dot = name.find('.');  // "<kind>.<parameter>"
        out.emplace_back(name, job_whole(dot == std::string::npos ? name : name.substr(dot + 1), t));
      }
      return out;
    };
  }

  // model.eval's batch with pipeline stages or micro-batches: the loss on every rank, the
  // correct rows counted by the ranks of the stage that computes the logits.
  detail::batch_score pipelined_score(const local_batch<T>& b) {
    compiled_network& c = *current_;
    const graph::parallel_graph& pg = *c.plan;
    auto e = c.exec->evaluate({b.inputs, b.labels}, {c.output});
    double correct = 0;
    if (pg.physical_stage(pg.stage(c.output)) == c.exec->stage()) {
      const int label_id = c.graph.inputs()[1], M = pg.micro_size();
      const xt::xarray<std::int32_t> labels = detail::as_array<std::int32_t>(b.labels);
      const std::size_t per = labels.size() / std::size_t(M);
      std::vector<std::size_t> shape(labels.shape().begin(), labels.shape().end());  // a micro-batch's
      if (!shape.empty()) shape[0] /= std::size_t(M);
      for (int m = 0; m < M; ++m) {
        xt::xarray<std::int32_t> part = xt::xarray<std::int32_t>::from_shape(shape);
        std::copy_n(labels.data() + per * std::size_t(m), per, part.data());
        const dist_tensor<std::int32_t> y(pg.value_layout(label_id), c.graph.at(label_id).shape,
                                          c.exec->context().rank(), std::move(part));
        correct += detail::count_correct(e.values.at(std::size_t(m)), y, c.exec->context());
      }
    }
    return detail::batch_score{double(e.loss), correct, global_rows(b)};
  }

  // The training state's keys in a checkpoint's metadata (written by training_state,
  // read by resume_from).
  struct state_keys {
    static constexpr const char* epoch = "train.epoch";
    static constexpr const char* step_in_epoch = "train.step_in_epoch";
    static constexpr const char* step = "train.step";
    static constexpr const char* optimizer_step = "train.optimizer_step";
    static constexpr const char* dropout_calls = "train.dropout_calls";  // "<key>=<calls>,..." per dropout layer
  };
  struct resume_point {
    std::filesystem::path file;
    std::int64_t epoch = 0, step_in_epoch = 0, step = 0, optimizer_step = 0;
    std::string dropout_calls;
    bool loaded = false;  // the tensors and draws loaded (at the first compile after resume_from)
  };

  // The dropout layers' shared draw counters of the current plan, by their streams' keys.
  std::map<std::uint64_t, ops::dropout_state*> dropout_states() const {
    std::map<std::uint64_t, ops::dropout_state*> out;
    if (!current_) return out;
    for (int id : current_->graph.ids(graph::node_kind::op))
      if (const auto* d = current_->graph.at(id).op->template definition<ops::dropout_op>()) out[d->key] = d->state.get();
    return out;
  }

  // What a checkpoint needs beside the tensors to resume after the step just taken.
  std::map<std::string, std::string> training_state(const run_context<T>& rc) const {
    std::string calls;
    for (const auto& [key, st] : dropout_states()) {
      if (!calls.empty()) calls += ',';
      calls.append(std::to_string(key)).append(1, '=').append(std::to_string(st->calls.load()));
    }
    return {{state_keys::epoch, std::to_string(rc.epoch)},
            {state_keys::step_in_epoch, std::to_string(rc.step_in_epoch)},
            {state_keys::step, std::to_string(rc.step)},
            {state_keys::optimizer_step, std::to_string(opt_->global_step())},
            {state_keys::dropout_calls, calls}};
  }

  // resume_from's loading, once the network is compiled (its parameters and the
  // optimizer's state in their training layouts): the parameters, the optimizer's
  // state and step, the dropout layers' draws.
  void load_resumed() {
    resume_point& r = *resume_;
    r.loaded = true;
    std::vector<std::pair<std::string, dist_tensor<T>>> tensors;
    std::vector<nn::parameter<T, D>*> params;
    for (auto& [name, p] : net_->named_parameters()) {
      tensors.emplace_back(name, dist_tensor<T>(p->data().layout(), p->shape(), p->data().rank()));
      params.push_back(p);
    }
    std::vector<std::pair<std::string, dist_tensor<T>>> state = opt_->state_tensors();
    std::vector<io::param_ref> refs;
    for (auto& [name, t] : tensors) refs.emplace_back(name, t);
    for (auto& [name, t] : state) refs.emplace_back(name, t);
    io::load_distributed_checkpoint(r.file, refs);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const dist_tensor<T>& t = tensors[i].second;
      if constexpr (std::is_same_v<D, cpu_device>) params[i]->set_data(t);
      else params[i]->set_data(tensor_on<T, D>(t.layout(), t.global_shape(), t.rank(), storage<T, D>::from_host(t.local())));
    }
    opt_->load_state(state, r.optimizer_step);
    const std::map<std::uint64_t, ops::dropout_state*> dropouts = dropout_states();
    std::string_view rest = r.dropout_calls;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      const std::size_t eq = item.find('=');
      try {
        if (eq == std::string_view::npos) throw std::invalid_argument("no '='");
        const std::uint64_t key = std::stoull(std::string(item.substr(0, eq)));
        const std::uint64_t calls = std::stoull(std::string(item.substr(eq + 1)));
        if (const auto it = dropouts.find(key); it != dropouts.end()) it->second->calls.store(calls);
        else throw error("model.resume_from: " + r.file.string() + " records draws of dropout stream " +
                         std::to_string(key) + ", which this network does not have: resume with the "
                         "network and the seed (options::seed) of the saved training");
      } catch (const std::logic_error&) {
        throw error("model.resume_from: " + r.file.string() + ": \"" + state_keys::dropout_calls + "\" holds \"" +
                    std::string(item) + "\", expected <stream>=<calls>");
      }
    }
  }

  struct compiled_network {
    graph::traced_graph graph;
    int output = -1;
    std::unique_ptr<graph::parallel_graph> plan;
    std::unique_ptr<graph::executor<T, D>> exec;
    std::vector<nn::parameter<T, D>*> params;  // per graph parameter, the network's
    std::vector<std::ptrdiff_t> slot;          // and its index in the optimizer's list (-1: none)
  };

  // The global shape of a local array under the dataset strategy of input `index`.
  extents global_shape(const xt::xarray<T>& a, int index) const {
    extents e;
    e.ndim = int(a.dimension());
    for (int d = 0; d < e.ndim; ++d) e.v[d] = index_t(a.shape()[std::size_t(d)]);
    const graph::parallel_config& cfg = opt_config_.parallel;
    const bool whole = cfg.mode == graph::parallel_mode::stand_alone || cfg.mode == graph::parallel_mode::hybrid_parallel;
    if (whole || e.ndim == 0) return e;
    switch (cfg.dataset.which()) {
      case graph::dataset_strategy::kind::full_batch: return e;
      case graph::dataset_strategy::kind::data_parallel: e.v[0] *= ctx_->size() / stages(); return e;
      default: {
        const auto& t = cfg.dataset.tuples();
        if (std::size_t(index) >= t.size() || t[std::size_t(index)].n != e.ndim)
          throw error("model: dataset_strategy " + cfg.dataset.to_string() + " has no split tuple of rank " +
                      std::to_string(e.ndim) + " for input " + std::to_string(index));
        for (int d = 0; d < e.ndim; ++d) e.v[d] *= t[std::size_t(index)].v[d];
        return e;
      }
    }
  }
  index_t global_rows(const local_batch<T>& b) const { return global_shape(b.inputs, 0).v[0]; }
  int stages() const { return std::max(1, opt_config_.parallel.pipeline_stages); }
  bool pipelined() const { return opt_config_.parallel.pipelined(); }

  // A tensor of parameter `name` (its value or optimizer state) whole on every rank of
  // the job, replicated: gathered over the ranks of the parameter's stage, then sent
  // from that stage's first rank. Collective over the job. A parameter the plan does
  // not use is whole where it is.
  dist_tensor<T> job_whole(const std::string& name, const dist_tensor<T>& t) {
    if (!current_) throw error("model: no plan yet: the network is traced at the first step");
    const graph::parallel_graph& pg = *current_->plan;
    const graph::traced_graph& g = current_->graph;
    const extents shape = t.global_shape();
    const layout whole = layout::replicated(mesh{ctx_->size()}, shape.ndim);
    int id = -1;
    for (int q : g.parameters())
      if (g.at(q).name == name) id = q;
    if (id < 0) {
      xt::xarray<T> v = redistribute(t, layout::replicated(t.layout().dev, shape.ndim), *ctx_).local();
      return dist_tensor<T>(whole, shape, ctx_->rank(), std::move(v));
    }
    const int owner = pg.physical_stage(pg.stage(g.consumers(id).front().first));
    xt::xarray<T> v = storage<T, cpu_device>::empty(shape);
    if (owner == pg.stage_of_rank(ctx_->rank()))
      v = redistribute(t, layout::replicated(t.layout().dev, shape.ndim), current_->exec->context()).local();
    ctx_->world().broadcast(std::span<T>(v.data(), v.size()), owner * pg.stage_device_num());
    return dist_tensor<T>(whole, shape, ctx_->rank(), std::move(v));
  }

  // The network traced, parallelized and bound for batches of b's shapes: at the first
  // batch of each shape (a test set's batches may differ from the training's), and
  // current from then on. The parameters are laid out as that plan says.
  void compile(const local_batch<T>& b) {
    const extents xs = global_shape(b.inputs, 0), ys = global_shape(b.labels, 1);
    const std::string key = to_string(xs) + to_string(ys);
    auto& slot = compiled_[key];
    if (!slot && pipelined() && compiled_.size() > 1) {
      compiled_.erase(key);
      throw error("model: with pipeline stages or micro-batches every batch has the first one's shape " +
                  compiled_.begin()->first + "; got " + to_string(xs) + to_string(ys) +
                  " (drop the last, smaller batch)");
    }
    if (!slot) slot = make_compiled(xs, ys);
    current_ = slot.get();
    if (pipelined()) {
      if (resume_ && !resume_->loaded) load_resumed();
      return;
    }
    // The parameters in this plan's layouts (moved when another plan laid them out).
    for (std::size_t i = 0; i < current_->params.size(); ++i) {
      nn::parameter<T, D>* p = current_->params[i];
      const layout& l = current_->plan->value_layout(current_->graph.parameters()[i]);
      if (!same_placement(p->data().layout(), l)) p->set_data(redistribute(p->data(), l, *ctx_));
    }
    if (resume_ && !resume_->loaded) load_resumed();
  }

  std::unique_ptr<compiled_network> make_compiled(const extents& xs, const extents& ys) {
    if (!net_->built()) net_->build(*ctx_, opt_config_.seed);
    graph::parallel_config cfg = opt_config_.parallel;
    cfg.device_num = ctx_->size();
    cfg.elem_bytes = index_t(sizeof(T));
    cfg.optimizer_slots = opt_->state_kinds();  // for memory_budget
    auto c = std::make_unique<compiled_network>();
    extents txs = xs, tys = ys;  // traced for one micro-batch
    if (cfg.micro_size > 1) {
      for (extents* e : {&txs, &tys})
        if (e->ndim == 0 || e->v[0] % cfg.micro_size != 0)
          throw error("model: micro_size " + std::to_string(cfg.micro_size) + " does not divide the global batch " +
                      to_string(*e) + " into micro-batches of equal rows");
      txs.v[0] /= cfg.micro_size;
      tys.v[0] /= cfg.micro_size;
    }
    if (pipelined()) {
      if constexpr (!std::is_same_v<D, cpu_device>)
        throw error("model: pipeline stages and micro-batches run on host networks");
    }
    nn::traced_network t = nn::trace(*net_, *loss_, txs, tys, net_->seed());
    c->graph = std::move(t.graph);
    c->output = t.output;
    c->plan = std::make_unique<graph::parallel_graph>(graph::parallelize(c->graph, cfg));
    c->exec = std::make_unique<graph::executor<T, D>>(*c->plan, *ctx_);
    // The parameters laid out as the plan says, and run from the network's storage.
    std::vector<std::pair<std::string, nn::parameter<T, D>*>> named = net_->named_parameters();
    const std::vector<nn::parameter<T, D>*>& trained = opt_->parameters();
    if (cfg.pipeline_stages > 1 && opt_config_.parameter_broadcast)  // rank 0's values, before the stages split them
      broadcast_parameters(trained, *ctx_);
    for (int id : c->graph.parameters()) {
      const std::string& name = c->graph.at(id).name;
      nn::parameter<T, D>* p = nullptr;
      for (auto& [n, q] : named)
        if (n == name) p = q;
      if (!p) throw error("model: the traced graph has a parameter '" + name + "' the network does not list");
      const layout& l = c->plan->value_layout(id);
      if (cfg.pipeline_stages > 1) {
        // Whole on every rank (collective), then this rank's shard of its stage's
        // layout where the parameter is its stage's; the others keep theirs, unused.
        const xt::xarray<T> whole = storage<T, D>::to_host(
            redistribute(p->data(), layout::replicated(p->data().layout().dev, p->shape().ndim), *ctx_).local());
        if (c->exec->holds_parameter(name)) {
          p->set_data(tensor_on<T, D>(l, p->shape(), c->exec->context().rank()));
          c->exec->bind_parameter(name, p->data());
          c->exec->set_parameter(name, whole);
        }
      } else {
        if (!same_placement(p->data().layout(), l)) p->set_data(redistribute(p->data(), l, *ctx_));
        c->exec->bind_parameter(name, p->data());
      }
      c->params.push_back(p);
      const auto it = std::find(trained.begin(), trained.end(), p);
      c->slot.push_back(it == trained.end() ? -1 : it - trained.begin());
      // With stages, the optimizer steps this rank's stage's parameters over the stage's
      // ranks and passes the others by.
      if (cfg.pipeline_stages > 1 && it != trained.end())
        opt_->place_parameter(std::size_t(it - trained.begin()),
                              c->exec->holds_parameter(name) ? &c->exec->context() : nullptr);
    }
    if (compiled_.size() > 1) return c;  // the reducer is made once
    const bool dp = cfg.mode == graph::parallel_mode::data_parallel && !c->plan->pipelined();
    const bool broadcast = opt_config_.parameter_broadcast && cfg.pipeline_stages <= 1;  // (staged: above)
    if (opt_->reduces_gradients()) {
      if (!opt_config_.gradients_mean)
        throw error("model.train: gradients_mean = false with optimizer parallel: its step sums the "
                    "gradients' partial sums (gradients_mean = true) and has no other mode");
      if (broadcast) broadcast_parameters(opt_->parameters(), *ctx_);
    } else if (dp) {
      reducer_ = std::make_unique<distributed_grad_reducer<T, D>>(
          opt_->parameters(), *ctx_,
          typename distributed_grad_reducer<T, D>::options{.mean = opt_config_.gradients_mean,
                                                           .bucket_bytes = opt_config_.bucket_bytes,
                                                           .parameter_broadcast = opt_config_.parameter_broadcast});
    } else if (broadcast) {
      broadcast_parameters(opt_->parameters(), *ctx_);
    }
    return c;
  }

  // One training step on this rank's rows; returns the loss.
  T step(const local_batch<T>& b) {
    compiled_network& c = *current_;
    const std::vector<nn::parameter<T, D>*>& trained = opt_->parameters();
    const bool raw = reducer_ || opt_->reduces_gradients();
    const traffic before = ctx_->total_stats();
    typename graph::executor<T, D>::result r;
    if (c.plan->pipelined()) {  // this rank's stage's gradients: resolved, or for optimizer parallel not
      if (opt_->reduces_gradients())
        r = c.exec->value_and_grad({b.inputs, b.labels}, [](std::size_t, tensor_on<T, D>&, int) {});
      else
        r = c.exec->value_and_grad({b.inputs, b.labels});
      std::vector<tensor_on<T, D>> held;
      std::size_t k = 0;
      for (nn::parameter<T, D>* p : c.params) {
        if (c.exec->holds_parameter(p->name())) held.push_back(std::move(r.grads[k++]));
        else held.emplace_back(p->layout(), p->shape(), ctx_->rank());  // another stage's: not read
      }
      r.grads = std::move(held);
    } else if (raw) {
      if (reducer_) reducer_->backward_begin();
      r = c.exec->value_and_grad({b.inputs, b.labels}, [&](std::size_t i, tensor_on<T, D>& g, int nodes_left) {
        if (reducer_ && c.slot[i] >= 0) reducer_->grad_ready(*trained[std::size_t(c.slot[i])], g, nodes_left);
      });
    } else {
      r = c.exec->value_and_grad({b.inputs, b.labels});
    }
    // The gradients in the optimizer's order; zeros for a parameter the network did not use.
    std::vector<std::optional<tensor_on<T, D>>> by_slot(trained.size());
    for (std::size_t i = 0; i < c.slot.size(); ++i)
      if (c.slot[i] >= 0) by_slot[std::size_t(c.slot[i])] = std::move(r.grads[i]);
    std::vector<tensor_on<T, D>> grads;
    grads.reserve(trained.size());
    for (std::size_t k = 0; k < trained.size(); ++k) {
      if (by_slot[k]) grads.push_back(std::move(*by_slot[k]));
      else grads.emplace_back(trained[k]->layout(), trained[k]->shape(), ctx_->rank());
    }
    if (reducer_) grads = (*reducer_)(grads);
    last_ = c.plan->pipelined() ? c.exec->last_step_traffic() : ctx_->total_stats() - before;
    (*opt_)(grads);
    return r.loss;
  }

  Net* net_;
  Loss* loss_;
  optim::optimizer<T, D>* opt_;
  context* ctx_;
  options opt_config_;
  std::map<std::string, std::unique_ptr<compiled_network>> compiled_;  // by the batches' global shapes
  compiled_network* current_ = nullptr;
  std::unique_ptr<distributed_grad_reducer<T, D>> reducer_;
  traffic last_{};
  std::optional<resume_point> resume_;  // set by resume_from until the next train() ends
};

}  // namespace tessera::train
