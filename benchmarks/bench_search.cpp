// The strategy searches at scale: auto_parallel's three searches planning graphs of 100
// to 10,000 operators for 8 to 1024 devices. Planning only (graph::parallelize: the
// search, then every redistribution of the step planned exactly), so any device count
// runs on one core of this machine:
//
//   bench_search --benchmark_out=results/bench_search.json --benchmark_out_format=json
//
// Graphs: a stack of transformer layers (attention from MatMul, Reshape, BatchMatMul and
// Softmax; a feed-forward MatMul, ReLU, MatMul; residual Adds; a LayerNorm-like
// normalisation from ReduceMean, Sub, Mul and RealDiv: 26 operators a layer) with 4,
// 38 and 385 layers, and ResNet-50 (nn::resnet50 traced with its loss, 224 x 224, batch
// 1024). Each benchmark is one (graph, device count, search): its time is parallelize's
// wall time, every run planning cold (the process's plan cache emptied before it); its
// counters the search's share of it (search_s: the strategy search
// alone, parallel_graph::search_seconds), the graph's operators, the cost model's step cost
// (parallel_graph::step_cost: bytes received plus work over flops_per_byte, 10), the
// priced bytes per rank and the bytes rank 0 receives. data_parallel runs too, as the
// baseline, where the batch divides. dynamic_programming prices every pair of
// candidates with the exact planner and runs only where it finishes in seconds (8
// devices, graphs of about 100 operators); so does sharding_propagation (its first
// MatMul configured), which beyond that (parallel_config::exact_pricing_limit)
// propagates under the symbolic price. The table printed at the end gives each
// search's time and recursive_programming's step cost over each other's.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include <tessera/graph/parallel.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/nn/trace.hpp>

namespace {

using namespace tessera;
using namespace tessera::graph;

// `layers` transformer layers on a (batch x seq, hidden) input; with `configure`, the
// first MatMul is given a strategy (sharding propagation's anchor): rows over every
// device.
traced_graph transformer(int layers, int devices, bool configure) {
  const index_t batch = 16, seq = 512, hidden = 1024;
  graph_builder b;
  value x = b.input("x", {batch * seq, hidden});
  auto norm = [&](value h) {
    const value mean = b.reduce_mean(h, {1}, true);
    const value d = b.sub(h, mean);
    return b.div(d, b.reduce_mean(b.mul(d, d), {1}, true));
  };
  for (int l = 0; l < layers; ++l) {
    auto param = [&](const char* name, const extents& e) { return b.parameter(name + std::to_string(l), e); };
    value q0 = b.matmul(x, param("wq", {hidden, hidden}));
    if (configure && l == 0) q0.shard(strategy{{devices, 1}, {1, 1}});
    const value q = b.reshape(q0, {batch, seq, hidden});
    const value k = b.reshape(b.matmul(x, param("wk", {hidden, hidden})), {batch, seq, hidden});
    const value v = b.reshape(b.matmul(x, param("wv", {hidden, hidden})), {batch, seq, hidden});
    const value scores = b.softmax(b.batch_matmul(q, k, false, true));
    const value ctx = b.reshape(b.batch_matmul(scores, v), {batch * seq, hidden});
    const value h = norm(b.add(x, b.matmul(ctx, param("wo", {hidden, hidden}))));
    const value f = b.matmul(b.relu(b.matmul(h, param("w1", {hidden, 4 * hidden}))), param("w2", {4 * hidden, hidden}));
    x = norm(b.add(h, f));
  }
  return b.build(b.reduce_mean(x));
}

traced_graph resnet50(int devices, bool configure) {
  auto net = nn::resnet50<float, cpu_device>(10);
  if (configure) net->end_point.shard(strategy{{devices, 1}, {1, 1}});
  nn::cross_entropy_loss<float, cpu_device> loss;
  return nn::trace(*net, loss, extents{1024, 3, 224, 224}, extents{1024}).graph;
}

int operators(const traced_graph& g) {
  int n = 0;
  for (const node& nd : g.nodes()) n += nd.kind == node_kind::op ? 1 : 0;
  return n;
}

struct outcome {
  double seconds = 0, search_seconds = 0, step_cost = 0;
};
std::map<std::string, outcome> results;  // by "graph/devices/search"

void bm_parallelize(benchmark::State& state, const std::string& graph_name,
                    const std::function<traced_graph(int, bool)>& make, int devices, const std::string& mode) {
  parallel_config cfg;
  cfg.device_num = devices;
  if (mode == "data_parallel") {
    cfg.mode = parallel_mode::data_parallel;
  } else {
    cfg.mode = parallel_mode::auto_parallel;
    cfg.search = parse_search_mode(mode);
  }
  const traced_graph g = make(devices, mode == "sharding_propagation");
  double cost = 0, seconds = 0, search = 0;
  try {
    for (auto _ : state) {
      process_plan_cache().clear();  // every run plans cold
      const auto t0 = std::chrono::steady_clock::now();
      const parallel_graph pg = parallelize(g, cfg);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      state.SetIterationTime(s);
      seconds += s;
      cost = pg.step_cost();
      search += pg.search_seconds();
      state.counters["step_cost"] = pg.step_cost();
      state.counters["priced_bytes"] = double(pg.priced_bytes());
      state.counters["rank0_bytes"] = double(pg.bytes_for_rank(0));
    }
  } catch (const error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const double n = double(state.iterations());
  state.counters["operators"] = operators(g);
  state.counters["devices"] = devices;
  state.counters["search_s"] = search / n;
  results[graph_name + "/" + std::to_string(devices) + "/" + mode] = {seconds / n, search / n, cost};
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  struct graph_case {
    std::string name;
    std::function<traced_graph(int, bool)> make;
    bool small;  // about 100 operators: every search runs on 8 devices
  };
  const std::vector<graph_case> graphs = {
      {"transformer_4_layers", [](int n, bool c) { return transformer(4, n, c); }, true},
      {"transformer_38_layers", [](int n, bool c) { return transformer(38, n, c); }, false},
      {"transformer_385_layers", [](int n, bool c) { return transformer(385, n, c); }, false},
      {"resnet50", resnet50, true},
  };
  for (const graph_case& gc : graphs)
    for (int devices : {8, 64, 1024}) {
      std::vector<std::string> searches = {"recursive_programming", "sharding_propagation", "data_parallel"};
      if (gc.small && devices == 8) searches.push_back("dynamic_programming");
      for (const std::string& search : searches) {
        const std::string name = "search/" + gc.name + "/devices=" + std::to_string(devices) + "/" + search;
        const bool slow = gc.small && devices == 8 && search != "recursive_programming" && search != "data_parallel";
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& s) { bm_parallelize(s, gc.name, gc.make, devices, search); })
            ->UseManualTime()
            ->Iterations(slow ? 1 : 3)
            ->Unit(benchmark::kMillisecond);
      }
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\nrecursive_programming's search time, parallelize's time, and its step cost over another's\n"
              "(below 1: cheaper; the other's search time in brackets):\n");
  for (const auto& [key, rec] : results) {
    const std::size_t cut = key.rfind('/');
    if (key.substr(cut + 1) != "recursive_programming") continue;
    const std::string where = key.substr(0, cut);
    std::printf("  %-30s search %6.3f s, parallelize %6.3f s", where.c_str(), rec.search_seconds, rec.seconds);
    for (const char* other : {"data_parallel", "dynamic_programming", "sharding_propagation"}) {
      const auto it = results.find(where + "/" + other);
      if (it != results.end())
        std::printf("  %s %.4f (%.3f s, parallelize %.3f s)", other, rec.step_cost / it->second.step_cost,
                    it->second.search_seconds, it->second.seconds);
    }
    std::printf("\n");
  }
}
