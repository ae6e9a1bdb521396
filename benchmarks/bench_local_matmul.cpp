// The cost of kernels::cpu::matmul over the BLAS call it wraps, single process:
//
//   OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=2 bench_local_matmul
//
// For each shape, on the same float operands:
//   cblas_sgemm   a direct cblas_sgemm call into a preallocated C;
//   matmul        kernels::cpu::matmul(a, b, trans_a, trans_b), which also allocates C;
//   matmul_into   kernels::cpu::matmul_into(c, a, b, trans_a, trans_b, 0), no allocation;
//   paired        the three calls alternating within each iteration (order rotated),
//                 reporting the median per-iteration time ratios matmul/sgemm and
//                 into/sgemm: both sides see the same machine load.
// Square n x n products for n = 1024, 2048, 4096 (no transposes), and all four
// transpose combinations at n = 2048. After the usual table a summary prints, per
// shape, the separate benchmarks' median times over cblas_sgemm's and the paired
// ratios (the machines are noisy: compare ratios from one run, not absolute times
// across runs). --benchmark_enable_random_interleaving=true spreads drift further.
// Then the pipelined matmuls' local products cut into their chunks or panels against one
// sgemm of the same product (bench_chunked below; run with OPENBLAS_NUM_THREADS=1 for one
// rank's core: --benchmark_filter=chunked).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>
#include <tessera/kernels/cpu/matmul.hpp>

namespace cpu = tessera::kernels::cpu;

namespace {

constexpr int repetitions = 5;

xt::xarray<float> random_matrix(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  xt::xarray<float> x = xt::xarray<float>::from_shape({n, n});
  for (float& v : x) v = dist(gen);
  return x;
}

struct operands {
  xt::xarray<float> a, b, c;
  explicit operands(std::size_t n)
      : a(random_matrix(n, 1)), b(random_matrix(n, 2)), c(random_matrix(n, 3)) {}
};

void set_counters(benchmark::State& state, int n) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * double(n) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void bench_cblas(benchmark::State& state, int n, bool ta, bool tb) {
  operands x{std::size_t(n)};
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, n, n,
                n, 1.f, x.a.data(), n, x.b.data(), n, 0.f, x.c.data(), n);
    benchmark::DoNotOptimize(x.c.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
}

void bench_matmul(benchmark::State& state, int n, bool ta, bool tb) {
  operands x{std::size_t(n)};
  for (auto _ : state) {
    xt::xarray<float> c = cpu::matmul(x.a, x.b, ta, tb);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
}

void bench_matmul_into(benchmark::State& state, int n, bool ta, bool tb) {
  operands x{std::size_t(n)};
  for (auto _ : state) {
    cpu::matmul_into(x.c, x.a, x.b, ta, tb, 0.f);
    benchmark::DoNotOptimize(x.c.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

void bench_paired(benchmark::State& state, int n, bool ta, bool tb) {
  using clock = std::chrono::steady_clock;
  operands x{std::size_t(n)};
  xt::xarray<float> fresh;
  std::vector<double> mm_ratio, into_ratio;
  double t[3] = {};
  std::size_t iter = 0;
  for (auto _ : state) {
    for (std::size_t k = 0; k < 3; ++k) {  // rotate the order: no call is always first
      const std::size_t which = (iter + k) % 3;
      const auto start = clock::now();
      if (which == 0)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    n, n, n, 1.f, x.a.data(), n, x.b.data(), n, 0.f, x.c.data(), n);
      else if (which == 1)
        fresh = cpu::matmul(x.a, x.b, ta, tb);
      else
        cpu::matmul_into(x.c, x.a, x.b, ta, tb, 0.f);
      benchmark::ClobberMemory();
      t[which] = std::chrono::duration<double>(clock::now() - start).count();
    }
    benchmark::DoNotOptimize(fresh.data());
    mm_ratio.push_back(t[1] / t[0]);
    into_ratio.push_back(t[2] / t[0]);
    ++iter;
  }
  state.counters["matmul/sgemm"] = median(mm_ratio);
  state.counters["into/sgemm"] = median(into_ratio);
}

// The pipelined matmuls' local product cut into pieces against one sgemm of the whole
// (m x k) x (k x n) product, paired as above: `cols` pieces of C's columns (each its own
// sgemm on the operands in place into a packed m x w block, as matmul_overlapped's
// chunks for scatter_rows), each of them summed over `panels` pieces of k (beta = 1
// after the first, as matmul_summa's panels).
// Counter chunked/sgemm: the median per-iteration time ratio.
void bench_chunked(benchmark::State& state, int m, int k, int n, int cols, int panels) {
  using clock = std::chrono::steady_clock;
  std::vector<float> av(std::size_t(m) * k), bv(std::size_t(k) * n), c(std::size_t(m) * n);
  std::mt19937 gen(4);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& v : av) v = dist(gen);
  for (float& v : bv) v = dist(gen);
  std::vector<double> ratio;
  double t[2] = {};
  std::size_t iter = 0;
  for (auto _ : state) {
    for (std::size_t q = 0; q < 2; ++q) {
      const std::size_t which = (iter + q) % 2;
      const auto start = clock::now();
      if (which == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, av.data(), k, bv.data(), n, 0.f,
                    c.data(), n);
      } else {
        for (int q = 0; q < cols; ++q) {
          const int c0 = int(std::int64_t(q) * n / cols), w = int(std::int64_t(q + 1) * n / cols) - c0;
          for (int pnl = 0; pnl < panels; ++pnl) {
            const int k0 = int(std::int64_t(pnl) * k / panels), ks = int(std::int64_t(pnl + 1) * k / panels) - k0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, w, ks, 1.f, av.data() + k0, k,
                        bv.data() + std::size_t(k0) * n + c0, n, pnl == 0 ? 0.f : 1.f,
                        c.data() + std::size_t(m) * c0, w);
          }
        }
      }
      benchmark::ClobberMemory();
      t[which] = std::chrono::duration<double>(clock::now() - start).count();
    }
    benchmark::DoNotOptimize(c.data());
    ratio.push_back(t[1] / t[0]);
    ++iter;
  }
  state.counters["chunked/sgemm"] = median(ratio);
}

std::string shape_name(int n, bool ta, bool tb) {
  return "n:" + std::to_string(n) + "/ta:" + (ta ? "1" : "0") + "/tb:" + (tb ? "1" : "0");
}

// The console table, plus what the summary needs: every repetition's real time (ms)
// per benchmark, and the paired benchmarks' ratio counters.
class collecting_reporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, std::vector<double>> times;
  std::map<std::string, std::pair<double, double>> paired;  // name -> (matmul, into) ratios
  std::map<std::string, double> chunked;                     // name -> chunked/sgemm

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      const std::string& name = r.run_name.function_name;
      times[name].push_back(r.GetAdjustedRealTime());
      if (auto mm = r.counters.find("matmul/sgemm"); mm != r.counters.end())
        paired[name] = {mm->second.value, r.counters.at("into/sgemm").value};
      if (auto ch = r.counters.find("chunked/sgemm"); ch != r.counters.end()) chunked[name] = ch->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  struct shape {
    int n;
    bool ta, tb;
  };
  std::vector<shape> shapes = {{1024, false, false}, {2048, false, false}, {4096, false, false},
                               {2048, false, true},  {2048, true, false},  {2048, true, true}};
  for (const shape& s : shapes) {
    const std::string tag = shape_name(s.n, s.ta, s.tb);
    for (auto [name, fn] :
         {std::pair{"cblas_sgemm/", &bench_cblas}, std::pair{"matmul/", &bench_matmul},
          std::pair{"matmul_into/", &bench_matmul_into}}) {
      benchmark::RegisterBenchmark((name + tag).c_str(), fn, s.n, s.ta, s.tb)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Repetitions(repetitions);
    }
    // About 4 s of alternating calls per shape (sgemm at ~300 GFLOP/s).
    const int pairs = s.n <= 1024 ? 150 : s.n <= 2048 ? 25 : 6;
    benchmark::RegisterBenchmark(("paired/" + tag).c_str(), &bench_paired, s.n, s.ta, s.tb)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(pairs);
  }
  // The local products of bench_matmul's pipelined runs at n = 4096 (one rank's share):
  // matmul_overlapped ((1, 2), (2, 1)) on 2 ranks, 4 chunks of columns; ((1, 8), (8, 1))
  // on 8 ranks, 4 chunks; matmul_summa ((1, 1), (1, 2)) on 2 ranks, 4 panels of k;
  // ((2, 1), (1, 4)) on 8 ranks, 4 panels.
  struct chunked_shape {
    int m, k, n, cols, panels;
  };
  const std::vector<chunked_shape> chunked = {
      {4096, 2048, 4096, 4, 1}, {4096, 512, 4096, 4, 1}, {4096, 4096, 2048, 1, 4}, {2048, 4096, 1024, 1, 4}};
  auto chunked_name = [](const chunked_shape& c) {
    return "chunked/m:" + std::to_string(c.m) + "/k:" + std::to_string(c.k) + "/n:" + std::to_string(c.n) +
           "/cols:" + std::to_string(c.cols) + "/panels:" + std::to_string(c.panels);
  };
  for (const chunked_shape& c : chunked)
    benchmark::RegisterBenchmark(chunked_name(c).c_str(), &bench_chunked, c.m, c.k, c.n, c.cols, c.panels)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(8);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
#ifdef OPENBLAS_VERSION
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
#endif
  collecting_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf(
      "\nTime over cblas_sgemm's, same run (1.000 = no overhead): medians of the\n"
      "separate benchmarks' repetitions, and the paired per-iteration medians.\n");
  std::printf("%-18s %10s %10s %12s %14s %12s\n", "shape", "sgemm ms", "matmul", "matmul_into",
              "paired matmul", "paired into");
  for (const shape& s : shapes) {
    const std::string tag = shape_name(s.n, s.ta, s.tb);
    const auto& t = reporter.times;
    auto base = t.find("cblas_sgemm/" + tag), mm = t.find("matmul/" + tag),
         into = t.find("matmul_into/" + tag);
    auto pair = reporter.paired.find("paired/" + tag);
    if (base == t.end() || mm == t.end() || into == t.end() || pair == reporter.paired.end())
      continue;  // filtered out
    const double b = median(base->second);
    std::printf("%-18s %10.2f %10.4f %12.4f %14.4f %12.4f\n", tag.c_str(), b,
                median(mm->second) / b, median(into->second) / b, pair->second.first,
                pair->second.second);
  }
  std::printf("\nPieces of one product (the pipelined matmuls' chunks and panels) over one sgemm of it,\n"
              "paired per-iteration medians:\n");
  for (const chunked_shape& c : chunked)
    if (auto it = reporter.chunked.find(chunked_name(c)); it != reporter.chunked.end())
      std::printf("%-48s %8.4f\n", it->first.c_str(), it->second);
  return 0;
}
