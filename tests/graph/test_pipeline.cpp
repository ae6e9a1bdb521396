// Pipeline stages in the traced graph, under mpiexec (1, 2 and 4 ranks): an 8-layer
// network whose layers are put on 1, 2, 4 or 8 pipeline stages (chunks of the
// interleaved schedule included), trained with 4 and 8 micro-batches in the GPipe, 1F1B
// and interleaved 1F1B orders, each stage sharded over its ranks (data parallel, or
// auto_parallel with a contraction split whose partial sums cross a stage), gives the
// losses, gradients and parameters of the same network trained on one rank with the
// whole batch; each rank's communicators move the bytes the plan counts; a micro-batch's
// values are released after its backward; the schedules' bubbles are those of the
// formulas; and the errors. Built a second time with TESSERA_TEST_GLOO=1: the same
// over a Gloo job (the stages' sends are the Gloo communicator's isend).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#if TESSERA_TEST_GLOO
#include <tessera/comm/gloo.hpp>
#endif
#include <tessera/graph/dump.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/graph/pipeline.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/trace.hpp>
#include <tessera/optim/momentum.hpp>

#include "../error_text.hpp"

using namespace tessera;
using namespace tessera::graph;

namespace {

constexpr int layers = 8;
constexpr index_t width = 8, micro_rows = 4;
constexpr int steps = 3;

// The network on a batch of `rows`: 8 x (MatMul, BiasAdd, ReLU but the last), MSE
// loss. Layer l is on stage l K / 8 (K = 1: no stages set). With `split`, the last
// MatMul of the first stage (the second without stages) splits its contraction over
// `n` ranks, and its BiasAdd is on the next stage: the partial sums cross.
traced_graph network(index_t rows, int K, int n = 1, bool split = false) {
  graph_builder b;
  const value x = b.input("x", {rows, width}), label = b.input("label", {rows, width});
  std::vector<value> w, bias;
  for (int l = 0; l < layers; ++l) {
    w.push_back(b.parameter("w" + std::to_string(l), {width, width}));
    bias.push_back(b.parameter("b" + std::to_string(l), {width}));
  }
  value h = x;
  for (int l = 0; l < layers; ++l) {
    if (K > 1) b.set_pipeline_stage(l * K / layers);
    h = b.matmul(h, w[std::size_t(l)]);
    const bool cut = split && l == (K > 1 ? layers / K - 1 : 1);
    if (cut) h.shard({{1, n}, {n, 1}});
    h = b.bias_add(h, bias[std::size_t(l)]);
    if (cut && K > 1) h.pipeline_stage(1);
    if (l + 1 < layers) h = b.relu(h);
    if (cut && K > 1) h.pipeline_stage(1);
  }
  b.set_pipeline_stage(-1);  // the loss follows the last layer
  return b.build(b.mse_loss(h, label));
}

xt::xarray<float> values_of(const extents& s, int seed) {
  xt::xarray<float> x = storage<float, cpu_device>::empty(s);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float((int(i) * 7 + seed * 5) % 17 - 8) / 16.0f;
  return x;
}

struct trained {
  std::vector<float> losses;
  std::map<std::string, xt::xarray<float>> first_grads, params;  // whole values
};

// `steps` Momentum steps of the network traced as `g`, on batches of `rows` rows (the
// same data and initial values whatever the batch is cut into).
template <class C>
trained train(const traced_graph& g, const parallel_config& cfg, C& comm, index_t rows, int* peak_values = nullptr) {
  executor<float> ex(parallelize(g, cfg), comm);
  int seed = 1;
  for (int p : g.parameters()) ex.set_parameter(g.at(p).name, values_of(g.at(p).shape, seed++));
  optim::momentum<float> opt(0.1f, 0.9f);
  trained t;
  for (int s = 0; s < steps; ++s) {
    const std::vector<xt::xarray<float>> whole{values_of({rows, width}, 40 + s), values_of({rows, width}, 50 + s)};
    auto r = ex.value_and_grad(ex.slice_batch(whole));
    CHECK(ex.last_step_traffic().bytes == ex.plan().bytes_for_rank(ex.rank()));
    if (peak_values) *peak_values = ex.last_step_peak_values();
    std::size_t k = 0;
    for (int p : g.parameters()) {
      const std::string& name = g.at(p).name;
      if (!ex.holds_parameter(name)) continue;
      CHECK(r.grads[k].layout() == ex.plan().value_layout(p));
      if (s == 0) t.first_grads[name] = ex.gather(r.grads[k]);
      ++k;
    }
    CHECK(k == r.grads.size());
    CHECK(k == ex.parameters().size());
    opt.step(ex.parameters(), r.grads);
    t.losses.push_back(r.loss);
  }
  for (int p : g.parameters())
    if (ex.holds_parameter(g.at(p).name)) t.params[g.at(p).name] = ex.gather(ex.parameter(g.at(p).name));
  return t;
}

trained alone(int M) {
  any_communicator one{local_communicator{}};
  return train(network(M * micro_rows, 1), parallel_config{}, one, M * micro_rows);
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(x.data()[i] - y.data()[i]) > 2e-5f * (1.0f + std::abs(y.data()[i]))) return false;
  return true;
}

void check_same(const trained& got, const trained& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 2e-5f * (1.0f + std::abs(want.losses[s])));
  }
  CHECK(!got.params.empty());
  for (const auto& [name, p] : got.params) {
    CAPTURE(name);
    CHECK(close(got.first_grads.at(name), want.first_grads.at(name)));
    CHECK(close(p, want.params.at(name)));
  }
}

parallel_config pipeline(int P, int S, int M, pipeline_schedule k, parallel_mode mode = parallel_mode::data_parallel) {
  parallel_config c;
  c.mode = mode;
  c.device_num = P;
  c.pipeline_stages = S;
  c.micro_size = M;
  c.schedule = k;
  return c;
}

// f() throws a tessera::error whose text holds `text`.
template <class F>
void check_error(F&& f, const std::string& text) {
  const std::string e = tessera::testing::error_of(f);
  CAPTURE(e);
  CHECK(e.find(text) != std::string::npos);
}

// Dense, ReLU, Dense as modules.
struct two_layers : nn::module<float> {
  nn::dense<float> fc1{8, 8}, fc2{8, 4};
  nn::relu<float> act;
  void visit(nn::visitor<float>& v) override {
    v.child("fc1", fc1);
    v.child("act", act);
    v.child("fc2", fc2);
  }
  template <class V>
  V operator()(V x) {
    return fc2(act(fc1(x)));
  }
};

#if TESSERA_TEST_GLOO
}  // namespace
namespace tessera::testing {
any_communicator*& gloo_world_slot();  // tests/gloo_main.cpp
}  // namespace tessera::testing
namespace {
// The job's ranks: a Gloo job's.
any_communicator& job() { return *testing::gloo_world_slot(); }
#else
// The job's ranks: MPI's world.
any_communicator& job() {
  static any_communicator world(mpi_communicator::world());
  return world;
}
#endif

int world_size() { return job().size(); }

}  // namespace

TEST_CASE("schedules: the orders of the worked example, no deadlock, and the bubble formulas") {
  using enum pipeline_schedule;
  auto F = [](int m, int c = 0) { return pipeline_unit{true, c, m}; };
  auto B = [](int m, int c = 0) { return pipeline_unit{false, c, m}; };
  CHECK(schedule_order(one_f_one_b, 2, 1, 4, 0) ==
        std::vector<pipeline_unit>{F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)});
  CHECK(schedule_order(one_f_one_b, 2, 1, 4, 1) ==
        std::vector<pipeline_unit>{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)});
  CHECK(schedule_order(gpipe, 2, 1, 2, 0) == std::vector<pipeline_unit>{F(0), F(1), B(0), B(1)});
  // Interleaved, 2 stages of 2 chunks, 2 micro-batches: stage 0 warms up with
  // 2 (S - s - 1) + (V - 1) S = 4 forwards, chunk 0 then chunk 1.
  CHECK(schedule_order(interleaved_one_f_one_b, 2, 2, 2, 0) ==
        std::vector<pipeline_unit>{F(0), F(1), F(0, 1), F(1, 1), B(0, 1), B(1, 1), B(0), B(1)});
  const pipeline_timing ex = simulate_schedule(one_f_one_b, 2, 1, 4);
  CHECK(ex.makespan == doctest::Approx(15));
  CHECK(ex.bubble_fraction == doctest::Approx(0.2));
  CHECK(ex.peak_units == std::vector<int>{2, 1});

  const bool print = job().rank() == 0;
  if (print) std::printf("pipeline bubbles (forward 1, backward 2 per micro-batch and stage):\n");
  for (int S : {1, 2, 4, 8})
    for (int M : {1, 2, 4, 8, 16}) {
      CAPTURE(S);
      CAPTURE(M);
      const double one = double(S - 1) / double(M + S - 1);
      const pipeline_timing a = simulate_schedule(one_f_one_b, S, 1, M), g = simulate_schedule(gpipe, S, 1, M);
      CHECK(a.bubble_fraction == doctest::Approx(one));
      CHECK(g.bubble_fraction == doctest::Approx(one));
      for (int s = 0; s < S; ++s) {
        CHECK(a.peak_units[std::size_t(s)] == std::min(S - s, M));  // level as micro-batches are added
        CHECK(g.peak_units[std::size_t(s)] == M);
      }
      for (int V : {2, 3, 4}) {
        if (M % S != 0) continue;
        CAPTURE(V);
        const pipeline_timing i = simulate_schedule(interleaved_one_f_one_b, S, V, M);
        const double formula = double(S - 1) / double(V * M + S - 1);
        CHECK(i.bubble_fraction == doctest::Approx(formula));
        if (print && M >= S && S > 1)
          std::printf("  S=%d M=%2d V=%d: 1F1B %.4f, interleaved %.4f (formula (S-1)/(VM+S-1) %.4f), %d units held\n",
                      S, M, V, a.bubble_fraction, i.bubble_fraction, formula, i.peak_units[0]);
      }
    }
}

TEST_CASE("schedules: errors") {
  using enum pipeline_schedule;
  check_error([&] { (void)schedule_order(one_f_one_b, 2, 2, 4, 0); }, "use interleaved_one_f_one_b or gpipe");
  check_error([&] { (void)schedule_order(interleaved_one_f_one_b, 4, 2, 6, 0); }, "micro_size 6 is not a multiple of 4");
  check_error([&] { (void)schedule_order(gpipe, 2, 1, 0, 0); }, "micro_size must be at least 1, got 0");
  check_error([&] { (void)parse_pipeline_schedule("zero_bubble"); }, "not gpipe, one_f_one_b");
  CHECK(parse_pipeline_schedule("interleaved_one_f_one_b") == interleaved_one_f_one_b);
}

TEST_CASE("the parallel pass: stages on rank groups, their memory, and its errors") {
  const traced_graph g = network(micro_rows, 2);
  const parallel_graph pg = parallelize(g, pipeline(4, 2, 4, pipeline_schedule::one_f_one_b));
  CHECK(pg.stage_device_num() == 2);
  CHECK(pg.stage_of_rank(3) == 1);
  CHECK(pg.stage(g.find("matmul")) == 0);
  CHECK(pg.stage(g.find("mse_loss.reduce_mean")) == 1);  // follows the last layer
  REQUIRE(pg.boundaries().size() == 1);                   // layer 3's ReLU to layer 4's MatMul
  CHECK(pg.boundaries()[0].producer == g.find("relu4"));
  CHECK(pg.boundaries()[0].has_backward);
  CHECK(pg.boundaries()[0].bytes == micro_rows / 2 * width * 4);  // a rank's half of the batch
  // Each stage holds half the parameters and 2 (stage 0) or 1 micro-batches' activations.
  const parallel_graph whole = parallelize(network(micro_rows, 1), pipeline(2, 1, 1, pipeline_schedule::one_f_one_b));
  CHECK(pg.stage_memory().size() == 2);
  CHECK(pg.memory_per_device() < whole.memory_per_device() * 3 / 4);
  // A contraction split ending stage 0: its partial sums cross as they are.
  const traced_graph cut = network(micro_rows, 2, 2, true);
  const parallel_graph pc = parallelize(cut, pipeline(4, 2, 4, pipeline_schedule::one_f_one_b, parallel_mode::auto_parallel));
  REQUIRE(pc.boundaries().size() == 1);
  CHECK(pc.boundaries()[0].producer == cut.find("matmul4"));
  CHECK(pc.value_layout(cut.find("matmul4")).has_partial());
  const parallel_graph gp = parallelize(g, pipeline(4, 2, 8, pipeline_schedule::gpipe));
  CHECK(gp.memory_per_device() > pg.memory_per_device());  // GPipe holds all 8 micro-batches

  check_error([&] { (void)parallelize(g, pipeline(4, 3, 4, pipeline_schedule::one_f_one_b)); }, "pipeline_stages 3 does not divide device_num 4");
  check_error([&] { (void)parallelize(g, pipeline(4, 4, 4, pipeline_schedule::one_f_one_b)); }, "the operators are on 2 pipeline stages (node pipeline_stage 0 .. 1); pipeline_stages 4 needs 4");
  check_error([&] { (void)parallelize(network(micro_rows, 4), pipeline(4, 2, 4, pipeline_schedule::one_f_one_b)); }, "use interleaved_one_f_one_b or gpipe");
  parallel_config hybrid = pipeline(4, 2, 4, pipeline_schedule::one_f_one_b, parallel_mode::hybrid_parallel);
  check_error([&] { (void)parallelize(g, hybrid); }, "hybrid_parallel runs each rank's own graph");
  {
    graph_builder b;
    const value x = b.input("x", {4, 4});
    const value w = b.parameter("w", {4, 4});
    b.set_pipeline_stage(1);
    const value h = b.matmul(x, w);
    b.set_pipeline_stage(0);
    check_error([&] { (void)parallelize(b.build(b.reduce_mean(b.relu(h))), pipeline(2, 2, 1, pipeline_schedule::gpipe)); }, "ReLU 'relu' on pipeline stage 0 reads MatMul 'matmul' of the later stage 1");
  }
  {
    graph_builder b;
    const value x = b.input("x", {4, 4});
    const value w = b.parameter("w", {4, 4});
    b.set_pipeline_stage(0);
    const value h = b.matmul(x, w);
    b.set_pipeline_stage(1);
    check_error([&] { (void)parallelize(b.build(b.reduce_mean(b.matmul(h, w))), pipeline(2, 2, 1, pipeline_schedule::gpipe)); }, "parameter 'w' is read by MatMul 'matmul' on pipeline stage 0 and by MatMul 'matmul2' on stage 1");
  }
  {
    graph_builder b;
    const value x = b.input("x", {4, 4});
    b.set_pipeline_stage(2);
    check_error([&] { (void)parallelize(b.build(b.reduce_mean(b.relu(x))), pipeline(3, 3, 1, pipeline_schedule::gpipe)); }, "pipeline stage 0 of 3 has no operator");
  }
  check_error([&] { (void)graph_builder().set_pipeline_stage(-2); }, "a stage is 0 or more");
}

TEST_CASE("save_graphs: each rank's execute graph is its stage's part of a micro-batch, its bytes the plan's") {
  using enum pipeline_schedule;
  for (const auto& [S, V, k] : {std::tuple{2, 1, one_f_one_b}, std::tuple{4, 1, gpipe}, std::tuple{2, 2, interleaved_one_f_one_b}}) {
    CAPTURE(S);
    CAPTURE(V);
    for (bool split : {false, true}) {
      const int P = 8, n = P / S;
      const parallel_graph pg = parallelize(network(micro_rows, S * V, n, split),
                                            pipeline(P, S, 4, k, split ? parallel_mode::auto_parallel : parallel_mode::data_parallel));
      for (int rank = 0; rank < P; ++rank) {
        CAPTURE(rank);
        const graph::detail::exec_graph eg = graph::detail::build_exec_graph(pg, rank);
        const index_t per_micro = eg.bytes[0] + eg.bytes[1] + eg.bytes[2] - eg.once_bytes;
        CHECK(per_micro * 4 + eg.once_bytes + cost::all_reduce(8, P) == pg.bytes_for_rank(rank));
        if (!split && n > 1) CHECK(eg.once_bytes > 0);  // data parallel: the weights' gradients
        const std::string ir = execute_ir(pg, rank);
        const int stage = pg.stage_of_rank(rank);
        CHECK(ir.find("Send(") != std::string::npos);
        CHECK(ir.find("Receive") != std::string::npos);  // values from earlier stages, gradients from later
        CHECK((ir.find("(mse_loss.reduce_mean) = ReduceMean(") != std::string::npos) == (stage == S - 1));
        CHECK((ir.find("(matmul) = MatMul(") != std::string::npos) == (stage == 0));
        CHECK(ir.find("on stage " + std::to_string(stage)) != std::string::npos);
      }
    }
  }
}

TEST_CASE("modules: set_pipeline_stage puts a module's operators on its stage when traced") {
  two_layers net;
  nn::mse_loss<float> loss;
  net.set_pipeline_stage(0);
  net.fc2.set_pipeline_stage(1);  // the innermost module's stage wins
  const nn::traced_network t = nn::trace(net, loss, extents{4, 8}, extents{4, 4});
  const traced_graph& g = t.graph;
  for (int id : g.ids(node_kind::op)) {
    CAPTURE(g.describe(id));
    const std::string& name = g.at(id).name;
    const bool second = !name.starts_with("fc1.") && !name.starts_with("act.");
    CHECK(g.at(id).pipeline_stage == (second ? 1 : 0));  // the loss follows fc2
  }
  const parallel_graph pg = parallelize(g, pipeline(2, 2, 2, pipeline_schedule::one_f_one_b));
  CHECK(pg.boundaries().size() == 1);
  check_error([&] { net.set_pipeline_stage(-3); }, "set_pipeline_stage: a stage is 0 or more");
}

TEST_CASE("pipelined training on every rank count equals the whole batch on one rank") {
  const int P = world_size();
  any_communicator& world = job();
  using enum pipeline_schedule;
  for (int M : {4, 8}) {
    CAPTURE(M);
    const trained want = alone(M);
    for (int S : {1, 2, 4}) {
      if (P % S != 0) continue;
      const int n = P / S;
      CAPTURE(S);
      for (pipeline_schedule k : {gpipe, one_f_one_b, interleaved_one_f_one_b})
        for (int V : {1, 2}) {
          if (S * V > layers || (V > 1 && k == one_f_one_b) || (V > 1 && M % S != 0)) continue;
          CAPTURE(k);
          CAPTURE(V);
          check_same(train(network(micro_rows, S * V), pipeline(P, S, M, k), world, M * micro_rows), want);
          if (n > 1)  // a split contraction inside each stage, partial sums crossing to the next
            check_same(train(network(micro_rows, S * V, n, true), pipeline(P, S, M, k, parallel_mode::auto_parallel),
                             world, M * micro_rows),
                       want);
        }
    }
  }
}

TEST_CASE("a micro-batch's values are released by its backward: 1F1B's memory stays level") {
  const int P = world_size();
  any_communicator& world = job();
  const int S = P >= 4 ? 4 : P >= 2 ? 2 : 1;  // on one rank: micro-batches on one stage
  int one4 = 0, one8 = 0, g4 = 0, g8 = 0;
  train(network(micro_rows, S), pipeline(P, S, 4, pipeline_schedule::one_f_one_b), world, 4 * micro_rows, &one4);
  train(network(micro_rows, S), pipeline(P, S, 8, pipeline_schedule::one_f_one_b), world, 8 * micro_rows, &one8);
  train(network(micro_rows, S), pipeline(P, S, 4, pipeline_schedule::gpipe), world, 4 * micro_rows, &g4);
  train(network(micro_rows, S), pipeline(P, S, 8, pipeline_schedule::gpipe), world, 8 * micro_rows, &g8);
  CHECK(one8 == one4);
  CHECK(g8 > g4);
  CHECK(one8 < g8);
}
