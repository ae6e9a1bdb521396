// The convolutional network kernels of kernels/cpu/ (oneDNN) at ResNet-50's CIFAR-10
// shapes (batch 32, 32 x 32 images), forward and backward, single process:
//
//   OMP_NUM_THREADS=1 bench_conv --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//       --benchmark_out=results/bench_conv_t1.json --benchmark_out_format=json
//
// and its PyTorch peer on the same shapes with the same thread count (peers/torch_conv.py,
// which also prints the ratios from both files). One iteration:
//   conv/<shape>/<form>     conv2d_forward, conv2d_backward_data, conv2d_backward_weights
//                           (no bias, as ResNet's convolutions);
//   bn_relu/<C>[_<S>x<S>]/<form>  batch_norm_forward_training with the ReLU fused, and
//                           its backward (32 x 32, or S x S: the small planes of
//                           ResNet-50's last stages on 32 x 32 images);
//   conv/<shape>/onednn     the peer: the same three primitives through oneDNN's API
//                           directly (conv_step_onednn says how);
//   bn_relu_split/<C>[_<S>x<S>]/<form>  the split form a sharded batch norm runs (sums,
//                           moments, normalise + ReLU, backward sums, backward data) on
//                           one rank: the form ResNet-50's batch norms run (plain), and
//                           on activations kept blocked (the normalisation oneDNN's);
//   weights_to_plain/<O>x<I>x<KH>x<KW>/tessera  weights from OIhw16i16o (the layout of
//                           the backward's dW) to plain OIHW by the kernels' reorder, and
//                           /onednn, its peer: oneDNN's reorder primitive.
// Forms: plain   xt::xarray<float> in plain NCHW in and out (each primitive reorders to
//                and from the blocked layout it computes in: conv_layouts::blocked);
//        gemm    the same arrays through oneDNN's GEMM-based convolutions, which take
//                them as they are (conv_layouts::plain);
//        blocked dnnl_tensor operands already in oneDNN's blocked layout (nChw16c with
//                AVX-512, else nChw8c, as a network that keeps its activations in
//                oneDNN's formats between layers hands them over), outputs left in the
//                primitive's layout.
// conv/1x1_<in>to<out>_<S>x<S>/{plain,gemm}: torchvision ResNet-50's stride-1 1 x 1
// convolutions at 224 x 224 (56 x 56 to 7 x 7 planes) and some at 32 x 32 (8 x 8 to
// 1 x 1), the two layouts conv_layouts::measured chooses between.
// Times are wall-clock (oneDNN runs OpenMP threads), in milliseconds.
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>
#include <tessera/kernels/cpu/batch_norm.hpp>
#include <tessera/kernels/cpu/conv.hpp>
#include <tessera/train/memory.hpp>

namespace {

namespace cpu = tessera::kernels::cpu;
using tessera::index_t;
using tessera::kernels::conv2d_params;
using tessera::kernels::pad2d;
using farray = xt::xarray<float>;

constexpr std::size_t batch = 32;

struct conv_case {
  const char* name;
  std::size_t in, out, kernel, stride, size;
};
// ResNet-50 (CIFAR variant: 3x3 stem, no stem pooling): the stem, a stage-1 3x3, the
// bottleneck's 1x1 reduce and expand at 32 x 32, and stage 2's strided 3x3.
constexpr conv_case conv_cases[] = {
    {"3x3_3to64", 3, 64, 3, 1, 32},       {"3x3_64to64", 64, 64, 3, 1, 32},
    {"1x1_256to64", 256, 64, 1, 1, 32},   {"1x1_64to256", 64, 256, 1, 1, 32},
    {"3x3_128to128_s2", 128, 128, 3, 2, 32},
};
// Batch norms: two at 32 x 32, and the small planes of torchvision's ResNet-50 on 32 x 32
// images (stages 2 to 4 end at 4 x 4, 2 x 2 and 1 x 1), which the split form walks a
// batch row at a time.
struct bn_case {
  std::size_t channels, size;
};
// torchvision's ResNet-50: 1 x 1 stride-1 convolutions of each stage at 224 x 224, and
// of the first and last stages at 32 x 32.
constexpr conv_case layout_cases[] = {
    {"1x1_64to64_56x56", 64, 64, 1, 1, 56},      {"1x1_64to256_56x56", 64, 256, 1, 1, 56},
    {"1x1_256to64_56x56", 256, 64, 1, 1, 56},    {"1x1_128to512_28x28", 128, 512, 1, 1, 28},
    {"1x1_512to128_28x28", 512, 128, 1, 1, 28},  {"1x1_256to1024_14x14", 256, 1024, 1, 1, 14},
    {"1x1_1024to256_14x14", 1024, 256, 1, 1, 14}, {"1x1_512to2048_7x7", 512, 2048, 1, 1, 7},
    {"1x1_2048to512_7x7", 2048, 512, 1, 1, 7},   {"1x1_64to256_8x8", 64, 256, 1, 1, 8},
    {"1x1_256to64_8x8", 256, 64, 1, 1, 8},       {"1x1_2048to512_1x1", 2048, 512, 1, 1, 1},
};
constexpr bn_case bn_cases[] = {{64, 32}, {256, 32}, {512, 4}, {1024, 2}, {2048, 1}};

// "64" at 32 x 32 (the cases' first names), "512_4x4" at smaller sizes.
std::string bn_name(const bn_case& b) {
  const std::string c = std::to_string(b.channels), s = std::to_string(b.size);
  return b.size == 32 ? c : c + "_" + s + "x" + s;
}

farray values(const std::vector<std::size_t>& shape, unsigned seed) {
  farray x = farray::from_shape(shape);
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = float(int((i * 2654435761u + seed * 40503u) % 2001) - 1000) / 1000.f;
  return x;
}

// x in the channel-blocked layout oneDNN computes in on this CPU (cpu::channel_blocked_tag),
// or plain for fewer channels than a block.
cpu::dnnl_tensor blocked(const farray& x) {
  const auto block = cpu::channel_blocked_tag();
  const std::size_t width = block == dnnl::memory::format_tag::nChw16c ? 16 : 8;
  const auto tag = x.shape()[1] < width ? dnnl::memory::format_tag::nchw : block;
  return cpu::dnnl_tensor::from_xarray(x).in_format(tag);
}

enum class conv_form { plain, gemm, blocked };
const char* form_name(conv_form f) {
  return f == conv_form::plain ? "/plain" : f == conv_form::gemm ? "/gemm" : "/blocked";
}

void conv_step(benchmark::State& state, const conv_case& c, conv_form form) {
  const bool keep_blocked = form == conv_form::blocked;
  cpu::set_dnnl_conv_layouts(form == conv_form::gemm ? cpu::conv_layouts::plain : cpu::conv_layouts::blocked);
  const conv2d_params p{index_t(c.stride), index_t(c.stride), pad2d::uniform(index_t(c.kernel / 2))};
  const std::vector<std::size_t> xs{batch, c.in, c.size, c.size}, ws{c.out, c.in, c.kernel, c.kernel};
  const auto ys = tessera::kernels::conv2d_output_shape("bench", xs, ws, p);
  const farray x = values(xs, 1), w = values(ws, 2), dy = values({ys.begin(), ys.end()}, 3);
  if (keep_blocked) {
    const cpu::dnnl_tensor tx = blocked(x), tdy = blocked(dy);
    for (auto _ : state) {
      auto y = cpu::conv2d_forward(tx, w, nullptr, p);
      auto dx = cpu::conv2d_backward_data(tdy, w, xs, p);
      auto g = cpu::conv2d_backward_weights(tdy, tx, ws, false, p);
      benchmark::DoNotOptimize(y);
      benchmark::DoNotOptimize(dx);
      benchmark::DoNotOptimize(g);
    }
  } else {
    for (auto _ : state) {
      auto y = cpu::conv2d_forward(x, w, nullptr, p);
      auto dx = cpu::conv2d_backward_data(dy, w, xs, p);
      auto g = cpu::conv2d_backward_weights(dy, x, ws, false, p);
      benchmark::DoNotOptimize(y.data());
      benchmark::DoNotOptimize(dx.data());
      benchmark::DoNotOptimize(g.dw.data());
    }
  }
  cpu::set_dnnl_conv_layouts(cpu::conv_layouts::measured);
  const double flops = 2.0 * double(batch * c.out * ys[2] * ys[3]) * double(c.in * c.kernel * c.kernel) * 3;
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The peer: oneDNN called directly, as a program of its own would for one training
// step of the layer. Primitives made once with every layout left to oneDNN (`any`); the
// activations (x, dy) and every output in memory allocated once, in the layouts the
// primitives chose; the weights plain OIHW, as an optimizer updates them each step, so
// reordered to the primitives' layout in each iteration, and dW reordered back to OIHW.
void conv_step_onednn(benchmark::State& state, const conv_case& c) {
  using dnnl::memory;
  using tag = memory::format_tag;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::dim n = batch, k = memory::dim(c.kernel), st = memory::dim(c.stride), pad = k / 2;
  const memory::dim out_size = (memory::dim(c.size) + 2 * pad - k) / st + 1;
  const memory::dims xs{n, memory::dim(c.in), memory::dim(c.size), memory::dim(c.size)};
  const memory::dims ws{memory::dim(c.out), memory::dim(c.in), k, k};
  const memory::dims ys{n, memory::dim(c.out), out_size, out_size};
  const memory::dims strides{st, st}, dilates{0, 0}, padding{pad, pad};
  auto any = [](const memory::dims& d) { return memory::desc(d, memory::data_type::f32, tag::any); };
  const auto alg = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any(xs), any(ws), any(ys), strides,
                                      dilates, padding, padding),
      eng);
  const dnnl::convolution_backward_data::primitive_desc bwd_data(
      dnnl::convolution_backward_data::desc(alg, any(xs), any(ws), any(ys), strides, dilates, padding, padding), eng,
      fwd);
  const dnnl::convolution_backward_weights::primitive_desc bwd_weights(
      dnnl::convolution_backward_weights::desc(alg, any(xs), any(ws), any(ys), strides, dilates, padding, padding),
      eng, fwd);
  // The plain operands, filled once and reordered to each primitive's layout once.
  auto plain = [&](const memory::dims& d, const farray& v) {
    memory m({d, memory::data_type::f32, tag::nchw}, eng);
    std::copy(v.begin(), v.end(), static_cast<float*>(m.get_data_handle()));
    return m;
  };
  auto as = [&](const memory& m, const memory::desc& d) {
    memory out(d, eng);
    dnnl::reorder(m, out).execute(strm, const_cast<memory&>(m), out);
    return out;
  };
  const farray vx = values({xs.begin(), xs.end()}, 1), vw = values({ws.begin(), ws.end()}, 2),
               vdy = values({ys.begin(), ys.end()}, 3);
  memory x_plain = plain(xs, vx), w_plain = plain(ws, vw), dy_plain = plain(ys, vdy);
  memory x_fwd = as(x_plain, fwd.src_desc()), x_bwd = as(x_plain, bwd_weights.src_desc());
  memory dy_data = as(dy_plain, bwd_data.diff_dst_desc()), dy_weights = as(dy_plain, bwd_weights.diff_dst_desc());
  memory w_fwd(fwd.weights_desc(), eng), w_bwd(bwd_data.weights_desc(), eng), y(fwd.dst_desc(), eng);
  memory dx(bwd_data.diff_src_desc(), eng), dw(bwd_weights.diff_weights_desc(), eng);
  memory dw_plain({ws, memory::data_type::f32, tag::oihw}, eng);
  const dnnl::convolution_forward conv_fwd(fwd);
  const dnnl::convolution_backward_data conv_data(bwd_data);
  const dnnl::convolution_backward_weights conv_weights(bwd_weights);
  const dnnl::reorder w_to_fwd(w_plain, w_fwd), w_to_bwd(w_plain, w_bwd), dw_back(dw, dw_plain);
  const bool same_w = fwd.weights_desc() == bwd_data.weights_desc();
  strm.wait();
  for (auto _ : state) {
    w_to_fwd.execute(strm, w_plain, w_fwd);
    conv_fwd.execute(strm, {{DNNL_ARG_SRC, x_fwd}, {DNNL_ARG_WEIGHTS, w_fwd}, {DNNL_ARG_DST, y}});
    if (!same_w) w_to_bwd.execute(strm, w_plain, w_bwd);
    conv_data.execute(strm,
                      {{DNNL_ARG_DIFF_DST, dy_data}, {DNNL_ARG_WEIGHTS, same_w ? w_fwd : w_bwd}, {DNNL_ARG_DIFF_SRC, dx}});
    conv_weights.execute(strm, {{DNNL_ARG_SRC, x_bwd}, {DNNL_ARG_DIFF_DST, dy_weights}, {DNNL_ARG_DIFF_WEIGHTS, dw}});
    dw_back.execute(strm, dw, dw_plain);
    strm.wait();
  }
  const double flops = 2.0 * double(batch * c.out) * double(out_size * out_size) * double(c.in * c.kernel * c.kernel) * 3;
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ResNet-50's convolution weights (O, I, KH, KW) whose gradient comes back from oneDNN's
// blocked layout to plain every step: the bottlenecks' 1 x 1 reduce and expand, the
// downsample of stage 4, and its 3 x 3.
struct weights_case {
  const char* name;
  dnnl::memory::dims dims;
};
const weights_case weights_cases[] = {
    {"64x256x1x1", {64, 256, 1, 1}},     {"256x1024x1x1", {256, 1024, 1, 1}}, {"512x2048x1x1", {512, 2048, 1, 1}},
    {"2048x512x1x1", {2048, 512, 1, 1}}, {"2048x1024x1x1", {2048, 1024, 1, 1}}, {"512x512x3x3", {512, 512, 3, 3}},
};

// Weights in the layout oneDNN's backward-weights primitive writes them (OIhw16i16o on
// AVX-512) brought to plain OIHW: by the kernels' reorder_into (`tessera`: its own loop,
// kernels/cpu/dnnl.hpp) or by oneDNN's reorder primitive (`onednn`, the peer).
void weights_to_plain(benchmark::State& state, const weights_case& c, bool own) {
  using dnnl::memory;
  const memory::desc blocked_desc(c.dims, memory::data_type::f32, memory::format_tag::ABcd16b16a);
  memory plain(cpu::detail::plain_desc(c.dims), cpu::dnnl_engine()), blocked(blocked_desc, cpu::dnnl_engine());
  const farray v = values({std::size_t(blocked_desc.get_size() / sizeof(float))}, 8);
  std::copy(v.begin(), v.end(), static_cast<float*>(blocked.get_data_handle()));
  const dnnl::reorder peer(blocked, plain);
  for (auto _ : state) {
    if (own) cpu::detail::reorder_into(blocked, plain);
    else peer.execute(cpu::dnnl_stream(), blocked, plain);
    benchmark::DoNotOptimize(plain.get_data_handle());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(blocked_desc.get_size()) * 2);
}

void bn_step(benchmark::State& state, bn_case b, bool keep_blocked) {
  const std::size_t c = b.channels;
  const std::vector<std::size_t> xs{batch, c, b.size, b.size};
  const farray x = values(xs, 4), dy = values(xs, 5);
  const farray gamma = values({c}, 6) + 1.5f, beta = values({c}, 7);
  const float eps = 1e-5f;
  if (keep_blocked) {
    const cpu::dnnl_tensor tx = blocked(x), tdy = blocked(dy);
    for (auto _ : state) {
      auto f = cpu::batch_norm_forward_training(tx, gamma, beta, eps, true);
      auto g = cpu::batch_norm_backward(tdy, tx, gamma, f.mean, f.variance, f.workspace, eps, true);
      benchmark::DoNotOptimize(f);
      benchmark::DoNotOptimize(g);
    }
  } else {
    for (auto _ : state) {
      auto f = cpu::batch_norm_forward_training(x, gamma, beta, eps, true);
      auto g = cpu::batch_norm_backward(dy, x, gamma, f.mean, f.variance, f.workspace, eps, true);
      benchmark::DoNotOptimize(f.y.data());
      benchmark::DoNotOptimize(g.dx.data());
    }
  }
}

void bn_split_step(benchmark::State& state, bn_case b, bool keep_blocked) {
  const std::size_t c = b.channels;
  const std::vector<std::size_t> xs{batch, c, b.size, b.size};
  const farray x = values(xs, 4), dy = values(xs, 5);
  const farray gamma = values({c}, 6) + 1.5f, beta = values({c}, 7);
  const float eps = 1e-5f;
  const std::size_t count = batch * b.size * b.size;
  if (keep_blocked) {
    const cpu::dnnl_tensor tx = blocked(x), tdy = blocked(dy);
    for (auto _ : state) {
      const auto m = cpu::batch_norm_moments(cpu::batch_norm_sums(tx), count);
      const cpu::dnnl_tensor y = cpu::batch_norm_forward_inference(tx, gamma, beta, m.mean, m.variance, eps, true);
      const auto r = cpu::batch_norm_backward_sums(tdy, tx, m.mean, m.variance, eps, &y);
      const cpu::dnnl_tensor dx = cpu::batch_norm_backward_data(tdy, tx, gamma, m.mean, m.variance, r, count, eps, &y);
      benchmark::DoNotOptimize(dx.memory().get_data_handle());
    }
    return;
  }
  for (auto _ : state) {
    const auto m = cpu::batch_norm_moments(cpu::batch_norm_sums(x), count);
    const farray y = cpu::batch_norm_forward_inference(x, gamma, beta, m.mean, m.variance, eps, true);
    const auto r = cpu::batch_norm_backward_sums(dy, x, m.mean, m.variance, eps, &y);
    const farray dx = cpu::batch_norm_backward_data(dy, x, gamma, m.mean, m.variance, r, count, eps, &y);
    benchmark::DoNotOptimize(dx.data());
  }
}

const int registered = [] {
  const char* threads = std::getenv("OMP_NUM_THREADS");
  benchmark::AddCustomContext("omp_num_threads", threads ? threads : "(unset)");
  benchmark::AddCustomContext("batch", std::to_string(batch));
  auto register_conv = [](const conv_case& c, std::initializer_list<conv_form> forms) {
    for (conv_form f : forms)
      benchmark::RegisterBenchmark((std::string("conv/") + c.name + form_name(f)).c_str(),
                                   [c, f](benchmark::State& s) { conv_step(s, c, f); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
  };
  for (const conv_case& c : conv_cases) register_conv(c, {conv_form::plain, conv_form::gemm, conv_form::blocked});
  for (const conv_case& c : layout_cases) register_conv(c, {conv_form::plain, conv_form::gemm});
  for (const conv_case& c : conv_cases)
    benchmark::RegisterBenchmark((std::string("conv/") + c.name + "/onednn").c_str(),
                                 [c](benchmark::State& s) { conv_step_onednn(s, c); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  for (const bn_case& b : bn_cases) {
    for (bool keep : {false, true})
      benchmark::RegisterBenchmark(("bn_relu/" + bn_name(b) + (keep ? "/blocked" : "/plain")).c_str(),
                                   [b, keep](benchmark::State& s) { bn_step(s, b, keep); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
    for (bool keep : {false, true})
      benchmark::RegisterBenchmark(("bn_relu_split/" + bn_name(b) + (keep ? "/blocked" : "/plain")).c_str(),
                                   [b, keep](benchmark::State& s) { bn_split_step(s, b, keep); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
  }
  for (const weights_case& c : weights_cases)
    for (bool own : {true, false})
      benchmark::RegisterBenchmark((std::string("weights_to_plain/") + c.name + (own ? "/tessera" : "/onednn")).c_str(),
                                   [&c, own](benchmark::State& s) { weights_to_plain(s, c, own); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(0.5);
  return 0;
}();

}  // namespace

int main(int argc, char** argv) {
  // As a training process: blocks freed by one iteration serve the next (every form and
  // the peer alike), rather than fresh mappings for each output of 32 MiB and more.
  tessera::train::retain_freed_memory();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
