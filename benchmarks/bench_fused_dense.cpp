// Dense with its activation fused into the product's epilogue against the same layer
// followed by a separate activation layer, single process, on the host:
//
//   OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1 bench_fused_dense
//       --benchmark_out=results/bench_fused_dense.json --benchmark_out_format=json
//
// One iteration is a training step of the layer alone: the forward pass, an MSE loss
// against zeros, and the backward pass to the weight, bias and input gradients.
//   fused      nn::dense(in, out, ..., activation) : bias and activation in one pass
//              over the product, the activation's backward in one pass over dy;
//   separate   nn::dense(in, out) then nn::relu / nn::sigmoid / nn::tanh: one pass for
//              the bias, another for the activation (with its own output array), and
//              the activation's backward as its own layer.
//   paired     both alternating within each iteration (order rotated) on the same
//              data, reporting the medians and separate_over_fused, the median
//              per-iteration ratio: both sides see the same machine load.
// Shapes: the MNIST network's hidden layer (batch 32, 784 -> 512) and a wider one
// (batch 256, 1024 -> 1024).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>

namespace {

using namespace tessera;
using ctx_t = context;

struct shape {
  index_t batch, in, out;
};
constexpr shape shapes[] = {{32, 784, 512}, {256, 1024, 1024}};

dist_tensor<float> random_input(const shape& s) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t(s.batch), std::size_t(s.in)});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(int(i * 7919 % 201) - 100) / 100.f;
  return dist_tensor<float>(layout::replicated(mesh{1}, 2), extents{s.batch, s.in}, 0, std::move(x));
}

// One forward and backward pass of `net` (any callable on a tape value).
template <class Net>
void step(Net&& net, const std::vector<nn::parameter<float>*>& params, const dist_tensor<float>& x,
          const dist_tensor<float>& zeros, ctx_t& ctx) {
  autodiff::tape<float> tp(ctx);
  for (std::size_t i = 0; i < params.size(); ++i) params[i]->expect_grad(tp.serial(), int(i));
  const auto xv = tp.leaf(x, true);
  nn::mse_loss<float> mse;
  const auto loss = mse(net(xv), zeros);
  tp.backward(loss);
  benchmark::DoNotOptimize(tp.grad(xv).local().data());
  for (nn::parameter<float>* p : params) p->unbind();
}

template <class Act>
struct pair_of_layers {
  nn::dense<float> fused, plain;
  Act act;
  pair_of_layers(const shape& s, nn::activation a, ctx_t& ctx)
      : fused(s.in, s.out, "normal", "uniform", true, a), plain(s.in, s.out, "normal", "uniform") {
    fused.build(ctx, 1);
    plain.build(ctx, 1);
  }
  std::vector<nn::parameter<float>*> fused_params() { return {&fused.weight, &fused.bias}; }
  std::vector<nn::parameter<float>*> plain_params() { return {&plain.weight, &plain.bias}; }
};

double seconds_of(auto&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class Act>
void bm_paired(benchmark::State& state, nn::activation a) {
  const shape s = shapes[state.range(0)];
  any_communicator one{local_communicator{}};
  ctx_t ctx(one);
  pair_of_layers<Act> layers(s, a, ctx);
  const dist_tensor<float> x = random_input(s);
  const dist_tensor<float> zeros(layout::replicated(mesh{1}, 2), extents{s.batch, s.out}, 0,
                                 xt::xarray<float>(xt::zeros<float>({std::size_t(s.batch), std::size_t(s.out)})));
  const auto fp = layers.fused_params(), pp = layers.plain_params();
  auto fused = [&] { step([&](auto v) { return layers.fused(v); }, fp, x, zeros, ctx); };
  auto separate = [&] { step([&](auto v) { return layers.act(layers.plain(v)); }, pp, x, zeros, ctx); };
  std::vector<double> tf, ts, ratio;
  bool fused_first = true;
  for (auto _ : state) {
    double a_s = 0, b_s = 0;
    if (fused_first) {
      a_s = seconds_of(fused);
      b_s = seconds_of(separate);
    } else {
      b_s = seconds_of(separate);
      a_s = seconds_of(fused);
    }
    fused_first = !fused_first;
    tf.push_back(a_s);
    ts.push_back(b_s);
    ratio.push_back(b_s / a_s);
    state.SetIterationTime(a_s + b_s);
  }
  state.counters["fused_ms"] = median(tf) * 1e3;
  state.counters["separate_ms"] = median(ts) * 1e3;
  state.counters["separate_over_fused"] = median(ratio);
  state.SetLabel(std::string(kernels::fused::name(a)) + " batch " + std::to_string(s.batch) + ", " +
                 std::to_string(s.in) + " -> " + std::to_string(s.out));
}

void bm_relu(benchmark::State& st) { bm_paired<nn::relu<float>>(st, nn::activation::relu); }
void bm_sigmoid(benchmark::State& st) { bm_paired<nn::sigmoid<float>>(st, nn::activation::sigmoid); }
void bm_tanh(benchmark::State& st) { bm_paired<nn::tanh<float>>(st, nn::activation::tanh); }

}  // namespace

BENCHMARK(bm_relu)->Name("paired/relu")->DenseRange(0, 1)->UseManualTime()->Iterations(400);
BENCHMARK(bm_sigmoid)->Name("paired/sigmoid")->DenseRange(0, 1)->UseManualTime()->Iterations(400);
BENCHMARK(bm_tanh)->Name("paired/tanh")->DenseRange(0, 1)->UseManualTime()->Iterations(400);

BENCHMARK_MAIN();
