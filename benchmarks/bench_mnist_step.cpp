// The data-parallel training step of seed 002's MNIST network (Flatten, Dense 784 ->
// 512, ReLU, Dense 512 -> 512, ReLU, Dense 512 -> 10; CrossEntropyLoss; SGD(1e-2);
// batch 32 per rank): value_and_grad, DistributedGradReducer, optimizer(grads).
//
//   OPENBLAS_CORETYPE=SkylakeX mpiexec -n 2 --bind-to none bench_mnist_step
//       --benchmark_out=results/bench_mnist_step_np2.json --benchmark_out_format=json
//
// Under tessera-run (no MPI) the ranks are a Gloo job: `tessera-run --worker-num 2
// bench_mnist_step ...`; the JSON's context names the communicator.
//
// Each iteration is one step timed on every rank (a steady clock) and reported as the
// slowest rank's time; steps are preceded by a barrier so the ranks start together.
// Counters: median_ms, min_ms (a shared machine preempts a few steps), the step's
// parts on the slowest rank (forward_backward_ms: value_and_grad, with the buckets'
// reductions started during it; reduce_wait_ms: the reducer waiting for them;
// update_ms: the optimizer), the gradient bytes each rank reduces, and the peak
// resident memory of each rank (peak_rss_mib_rank<r>, from getrusage) and their
// maximum, and training_mib: the most any rank's peak grew over its peak before the
// first network was built, against memory_budget_mib, twice the parameters, gradients,
// optimizer state and activations of a step. Peers: `compute_only` runs the same step on each rank alone (a one-rank
// communicator: no reduction), the floor the reduction adds to; the PyTorch DDP peer is
// benchmarks/peers/ddp_mnist.py. `adam/data_parallel` and `adam/parallel_optimizer` run
// the step with Adam(1e-3), through the reducer and with optimizer parallel (the
// gradients reduce-scattered, each rank updating its piece of every parameter, the
// pieces all-gathered); optimizer_state_bytes_per_rank is Adam's two moments on a rank.
// `pipeline/2_stages/micro=M` (an even number of ranks) cuts the network in two
// pipeline stages (Flatten, Dense, ReLU | Dense, ReLU, Dense, the loss), each on half
// the ranks (data parallel inside), and runs the same global batch as M micro-batches
// in the 1F1B order (train::pipeline; over MPI only, whose communicator has the
// non-blocking sends it needs); grad_bytes_per_rank is then the stage's share.
// `graph_pipeline/2_stages/micro=M` runs the same two stages from the traced graph
// (graph_builder's set_pipeline_stage, parallel_config::pipeline_stages, the executor's
// 1F1B): the graph's pipeline against the eager one, in the same run.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/adam.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>
#include <tessera/train/pipeline.hpp>
#include "rank_reporting.hpp"

extern "C" void openblas_set_num_threads(int);

namespace {

// Seconds on a steady clock.
double seconds_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }


using namespace tessera;
using bench::peak_rss_mib;

any_communicator* world_ptr = nullptr;
double baseline_rss_mib = 0;  // each rank's peak resident memory before any network exists
constexpr index_t per_rank_batch = 32;
constexpr int warmup_steps = 20, timed_steps = 300;

// Seed 002's network.
struct network : nn::module<float> {
  nn::flatten<float> flatten;
  nn::sequential<nn::dense<float>, nn::relu<float>, nn::dense<float>, nn::relu<float>, nn::dense<float>>
      dense_relu_sequential{nn::dense<float>(28 * 28, 512, "normal", "zeros"), nn::relu<float>(),
                            nn::dense<float>(512, 512, "normal", "zeros"), nn::relu<float>(),
                            nn::dense<float>(512, 10, "normal", "zeros")};
  void visit(nn::visitor<float>& v) override {
    v.child("flatten", flatten);
    v.child("dense_relu_sequential", dense_relu_sequential);
  }
  template <class V>
  V operator()(V x) {
    return dense_relu_sequential(flatten(x));
  }
};

// The network cut in two pipeline stages.
struct first_stage : nn::module<float> {
  nn::flatten<float> flatten;
  nn::dense<float> fc1{28 * 28, 512, "normal", "zeros"};
  nn::relu<float> act;
  void visit(nn::visitor<float>& v) override { v.child("fc1", fc1); }
  template <class V>
  V operator()(V x) {
    return act(fc1(flatten(x)));
  }
};
struct second_stage : nn::module<float> {
  nn::dense<float> fc2{512, 512, "normal", "zeros"}, fc3{512, 10, "normal", "zeros"};
  nn::relu<float> act;
  void visit(nn::visitor<float>& v) override {
    v.child("fc2", fc2);
    v.child("fc3", fc3);
  }
  template <class V>
  V operator()(V x) {
    return fc3(act(fc2(x)));
  }
};

// A batch of images (batch, 1, 28, 28) in [0, 1) and labels, this rank's rows.
std::pair<dist_tensor<float>, dist_tensor<std::int32_t>> make_batch(context& ctx) {
  const int p = ctx.size();
  const index_t b = per_rank_batch * p;
  dist_tensor<float> x(layout(mesh{p}, {{0}, {}, {}, {}}), extents{b, 1, 28, 28}, ctx.rank());
  const nn::random_stream s(7);
  x.fill_global([&](const auto& i) { return float(s.uniform01(std::uint64_t(i[0] * 784 + i[2] * 28 + i[3]))); });
  dist_tensor<std::int32_t> y(layout(mesh{p}, {{0}}), extents{b}, ctx.rank());
  y.fill_global([](const auto& i) { return std::int32_t(i[0] * 7 % 10); });
  return {std::move(x), std::move(y)};
}

struct step_times {
  double total = 0, forward_backward = 0, reduce = 0, update = 0;
};

// The step's optimizer: the seed's SGD(1e-2), or Adam(1e-3) through the reducer or with
// optimizer parallel (no reducer: the step reduce-scatters and gathers).
enum class optimizer_kind { sgd, adam, adam_parallel };

struct run_result {
  std::vector<step_times> times;
  std::size_t grad_bytes = 0;   // the gradients of a rank
  std::size_t state_bytes = 0;  // the optimizer's state on a rank
};

// Runs timed_steps steps of the network on the ranks of `ctx` (which may be one rank
// alone); returns each step's times on this rank.
run_result run_steps(context& ctx, const typename train::distributed_grad_reducer<float>::options& ro,
                     optimizer_kind kind = optimizer_kind::sgd) {
  network net;
  net.build(ctx, 1);
  nn::cross_entropy_loss<float> loss_fn;
  std::unique_ptr<optim::optimizer<float>> opt;
  if (kind == optimizer_kind::sgd) opt = std::make_unique<optim::sgd<float>>(net.trainable_params(), 1e-2f);
  else opt = std::make_unique<optim::adam<float>>(net.trainable_params(), 1e-3f);
  if (kind == optimizer_kind::adam_parallel) opt->enable_parallel_optimizer(ctx);
  std::unique_ptr<train::distributed_grad_reducer<float>> grad_reducer;
  if (!opt->reduces_gradients())
    grad_reducer = std::make_unique<train::distributed_grad_reducer<float>>(opt->parameters(), ctx, ro);
  auto forward_fn = [&](auto x, const dist_tensor<std::int32_t>& y) { return loss_fn(net(x), y); };
  auto grad_fn = train::value_and_grad(forward_fn, net.trainable_params(), ctx);
  const auto [x, y] = make_batch(ctx);
  run_result out;
  for (auto* p : opt->parameters()) out.grad_bytes += p->data().data().size() * sizeof(float);
  for (int s = 0; s < warmup_steps + timed_steps; ++s) {
    world_ptr->barrier();
    const double t0 = seconds_now();
    auto [loss, grads] = grad_fn(x, y);
    const double t1 = seconds_now();
    if (grad_reducer) grads = (*grad_reducer)(grads);
    const double t2 = seconds_now();
    (*opt)(grads);
    const double t3 = seconds_now();
    if (s >= warmup_steps) out.times.push_back({t3 - t0, t1 - t0, t2 - t1, t3 - t2});
  }
  if (kind != optimizer_kind::sgd)  // Adam's two moments, each the size of a piece of state
    for (std::size_t i = 0; i < opt->parameters().size(); ++i)
      out.state_bytes +=
          2 * std::size_t(local_shape(opt->state_layout(i), opt->parameters()[i]->shape()).size()) * sizeof(float);
  return out;
}

// Runs timed_steps steps of the two-stage pipeline over the ranks of `ctx` (an even
// number), the global batch (per_rank_batch a rank) cut into `micro` micro-batches.
run_result run_pipeline_steps(context& ctx, int micro) {
  train::pipeline<float> pp(ctx, 2);
  context& sc = pp.stage_context();
  const int q = sc.size();
  first_stage a;
  second_stage b;
  std::vector<nn::parameter<float>*> params;
  if (pp.first_stage()) {
    a.build(sc, 1);
    params = a.trainable_params();
  } else {
    b.build(sc, 1);
    params = b.trainable_params();
  }
  nn::cross_entropy_loss<float> loss_fn;
  optim::sgd<float> opt(params, 1e-2f);
  const index_t rows = per_rank_batch * ctx.size() / micro;  // a micro-batch, over the stage's q ranks
  std::vector<dist_tensor<float>> xs;
  std::vector<dist_tensor<std::int32_t>> ys;
  const nn::random_stream rs(7);
  for (int m = 0; m < micro; ++m) {
    dist_tensor<float> x(layout(mesh{q}, {{0}, {}, {}, {}}), extents{rows, 1, 28, 28}, sc.rank());
    x.fill_global([&](const auto& i) { return float(rs.uniform01(std::uint64_t((m * rows + i[0]) * 784 + i[2] * 28 + i[3]))); });
    dist_tensor<std::int32_t> y(layout(mesh{q}, {{0}}), extents{rows}, sc.rank());
    y.fill_global([&](const auto& i) { return std::int32_t((m * rows + i[0]) * 7 % 10); });
    xs.push_back(std::move(x));
    ys.push_back(std::move(y));
  }
  using tape_t = autodiff::tape<float>;
  using var_t = autodiff::var<float>;
  run_result out;
  for (auto* p : params) out.grad_bytes += p->data().data().size() * sizeof(float);
  for (int s = 0; s < warmup_steps + timed_steps; ++s) {
    world_ptr->barrier();
    const double t0 = seconds_now();
    auto r = pp.step(params, micro, [&](tape_t& tp, int m, std::optional<var_t> x) -> var_t {
      if (!x) return a(tp.leaf(xs[std::size_t(m)], false));
      return loss_fn(b(*x), ys[std::size_t(m)]);
    });
    const double t1 = seconds_now();
    opt(r.grads);
    const double t2 = seconds_now();
    if (s >= warmup_steps) out.times.push_back({t2 - t0, t1 - t0, 0, t2 - t1});
  }
  return out;
}

// The same two stages as a traced graph, parallelized with pipeline_stages 2 and run by
// the graph executor (micro-batches in the 1F1B order), from the same data.
run_result run_graph_pipeline_steps(context& ctx, int micro) {
  const index_t global = per_rank_batch * ctx.size(), rows = global / micro;  // a micro-batch
  graph::graph_builder b;
  const graph::value x = b.input("x", {rows, 1, 28, 28}), y = b.input("y", {rows});
  const graph::value w1 = b.parameter("w1", {512, 784}), b1 = b.parameter("b1", {512});
  const graph::value w2 = b.parameter("w2", {512, 512}), b2 = b.parameter("b2", {512});
  const graph::value w3 = b.parameter("w3", {10, 512}), b3 = b.parameter("b3", {10});
  b.set_pipeline_stage(0);
  const graph::value h = b.relu(b.bias_add(b.matmul(b.flatten(x), w1, false, true), b1));
  b.set_pipeline_stage(1);
  const graph::value h2 = b.relu(b.bias_add(b.matmul(h, w2, false, true), b2));
  const graph::value logits = b.bias_add(b.matmul(h2, w3, false, true), b3);
  const graph::traced_graph g = b.build(b.reduce_mean(b.sparse_softmax_cross_entropy(logits, y)));
  graph::parallel_config cfg;
  cfg.mode = graph::parallel_mode::data_parallel;
  cfg.device_num = ctx.size();
  cfg.pipeline_stages = 2;
  cfg.micro_size = micro;
  graph::executor<float> ex(graph::parallelize(g, cfg), ctx);
  const nn::random_stream rs(7);
  for (int p : g.parameters()) {
    xt::xarray<float> v = storage<float, cpu_device>::empty(g.at(p).shape);
    for (std::size_t i = 0; i < v.size(); ++i) v.data()[i] = float(0.01 * (rs.uniform01(i + 1000 * std::size_t(p)) - 0.5));
    ex.set_parameter(g.at(p).name, v);
  }
  xt::xarray<float> images = storage<float, cpu_device>::empty(extents{global, 1, 28, 28});
  xt::xarray<float> labels = storage<float, cpu_device>::empty(extents{global});
  for (std::size_t i = 0; i < images.size(); ++i) images.data()[i] = float(rs.uniform01(std::uint64_t(i)));
  for (std::size_t i = 0; i < labels.size(); ++i) labels.data()[i] = float(i * 7 % 10);
  const std::vector<xt::xarray<float>> batch = ex.slice_batch({images, labels});
  optim::sgd<float> opt(1e-2f);
  run_result out;
  for (const auto& p : ex.parameters()) out.grad_bytes += p.local().size() * sizeof(float);
  for (int s = 0; s < warmup_steps + timed_steps; ++s) {
    world_ptr->barrier();
    const double t0 = seconds_now();
    auto r = ex.value_and_grad(batch);
    const double t1 = seconds_now();
    opt.step(ex.parameters(), r.grads);
    const double t2 = seconds_now();
    if (s >= warmup_steps) out.times.push_back({t2 - t0, t1 - t0, 0, t2 - t1});
  }
  return out;
}

void report(benchmark::State& state, std::vector<step_times> mine, std::size_t grad_bytes,
            std::size_t state_bytes = 0) {
  any_communicator& world = *world_ptr;
  // The slowest rank, step by step (each part on the rank whose step was slowest).
  std::vector<double> total(mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) total[i] = mine[i].total;
  std::vector<double> slowest(total.size());
  world.all_reduce(std::span<const double>(total), std::span<double>(slowest), reduce_op::max);
  double fb = 0, red = 0, upd = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    fb += mine[i].forward_backward;
    red += mine[i].reduce;
    upd += mine[i].update;
  }
  std::vector<double> parts{fb, red, upd};
  world.all_reduce(std::span<double>(parts), reduce_op::max);
  std::size_t k = 0;
  for (auto _ : state) state.SetIterationTime(slowest[k++ % slowest.size()]);
  std::vector<double> sorted = slowest;
  std::sort(sorted.begin(), sorted.end());
  const double n = double(sorted.size());
  state.counters["median_ms"] = 1e3 * sorted[sorted.size() / 2];
  state.counters["min_ms"] = 1e3 * sorted.front();
  state.counters["forward_backward_ms"] = 1e3 * parts[0] / n;
  state.counters["reduce_wait_ms"] = 1e3 * parts[1] / n;
  state.counters["update_ms"] = 1e3 * parts[2] / n;
  state.counters["grad_bytes_per_rank"] = double(grad_bytes);
  state.counters["optimizer_state_bytes_per_rank"] = double(state_bytes);
  state.counters["ranks"] = world.size();
  std::vector<double> rss(std::size_t(world.size()), 0.0), all(rss.size());
  rss[std::size_t(world.rank())] = peak_rss_mib();
  world.all_reduce(std::span<const double>(rss), std::span<double>(all), reduce_op::sum);
  for (std::size_t r = 0; r < all.size(); ++r) state.counters["peak_rss_mib_rank" + std::to_string(r)] = all[r];
  state.counters["peak_rss_mib"] = *std::max_element(all.begin(), all.end());
  // What training added to the process (the peak over the baseline of MPI, BLAS and the
  // program), against the budget: twice the parameters, gradients, optimizer
  // state (none for SGD without momentum; Adam's is reported above, not budgeted) and
  // one batch's activations (the input and every layer's output, before and after ReLU).
  std::vector<double> added{peak_rss_mib() - baseline_rss_mib};
  world.all_reduce(std::span<double>(added), reduce_op::max);
  const double params = 784.0 * 512 + 512 + 512.0 * 512 + 512 + 512.0 * 10 + 10;
  const double activations = double(per_rank_batch) * (784 + 4 * 512 + 10);
  state.counters["training_mib"] = added[0];
  state.counters["memory_budget_mib"] = 2 * (2 * params + activations) * sizeof(float) / double(1 << 20);
  state.counters["samples_per_s"] = double(per_rank_batch * world.size()) / (sorted[sorted.size() / 2]);
}

using reducer_options = train::distributed_grad_reducer<float>::options;

void bm_data_parallel(benchmark::State& state, reducer_options ro, optimizer_kind kind = optimizer_kind::sgd) {
  context ctx(*world_ptr);
  run_result r = run_steps(ctx, ro, kind);
  report(state, std::move(r.times), r.grad_bytes, r.state_bytes);
}

void bm_pipeline(benchmark::State& state, int micro) {
  context ctx(*world_ptr);
  run_result r = run_pipeline_steps(ctx, micro);
  report(state, std::move(r.times), r.grad_bytes);
}

void bm_graph_pipeline(benchmark::State& state, int micro) {
  context ctx(*world_ptr);
  run_result r = run_graph_pipeline_steps(ctx, micro);
  report(state, std::move(r.times), r.grad_bytes);
}

void bm_compute_only(benchmark::State& state) {
  any_communicator one{local_communicator{}};
  context ctx(one);
  run_result r = run_steps(ctx, train::distributed_grad_reducer<float>::options{});
  report(state, std::move(r.times), 0);
}

}  // namespace

int main(int argc, char** argv) {
  train::retain_freed_memory();  // a training process: keep freed step memory for the next step
  return tessera::run(argc, argv, [&](any_communicator& world) {
    world_ptr = &world;
    baseline_rss_mib = peak_rss_mib();
    bench::keep_output_on_rank0(argc, argv, world.rank());
    openblas_set_num_threads(1);  // one core per rank
    benchmark::Initialize(&argc, argv);
    auto add = [](const char* name, auto f) {
      benchmark::RegisterBenchmark(name, f)->UseManualTime()->Iterations(timed_steps)->Unit(benchmark::kMillisecond);
    };
    // The defaults: 25 MiB buckets, gradients of 1 MiB or more alone, overlapped.
    add("mnist_step/data_parallel", [](benchmark::State& s) { bm_data_parallel(s, reducer_options{}); });
    add("mnist_step/data_parallel/one_bucket",
        [](benchmark::State& s) { bm_data_parallel(s, reducer_options{.alone_bytes = std::size_t(1) << 30}); });
    add("mnist_step/data_parallel/bucket=256KiB",
        [](benchmark::State& s) { bm_data_parallel(s, reducer_options{.bucket_bytes = std::size_t(256) << 10}); });
    add("mnist_step/data_parallel/no_overlap",
        [](benchmark::State& s) { bm_data_parallel(s, reducer_options{.overlap = false}); });
    add("mnist_step/compute_only", [](benchmark::State& s) { bm_compute_only(s); });
    add("mnist_step/adam/data_parallel",
        [](benchmark::State& s) { bm_data_parallel(s, reducer_options{}, optimizer_kind::adam); });
    add("mnist_step/adam/parallel_optimizer",
        [](benchmark::State& s) { bm_data_parallel(s, reducer_options{}, optimizer_kind::adam_parallel); });
    benchmark::AddCustomContext("communicator", std::string(world.backend()));
    if (world.size() % 2 == 0 && world.backend() == std::string_view("mpi"))
      for (int micro : {1, 2, 4, 8})
        add(("mnist_step/pipeline/2_stages/micro=" + std::to_string(micro)).c_str(),
            [micro](benchmark::State& s) { bm_pipeline(s, micro); });
    if (world.size() % 2 == 0)  // over MPI or Gloo
      for (int micro : {1, 2, 4, 8})
        add(("mnist_step/graph_pipeline/2_stages/micro=" + std::to_string(micro)).c_str(),
            [micro](benchmark::State& s) { bm_graph_pipeline(s, micro); });
    bench::run_on_every_rank(world.rank());
    benchmark::Shutdown();
  });
}
