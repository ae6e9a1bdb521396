// The traced graph (docs/parallel.md): the seed's MLP traced once with one configured
// MatMul, parallelized in auto_parallel mode and trained on 8 ranks; every parallel mode
// and search against the stand-alone run; the dump of rank 0; the errors the page
// quotes; pipeline stages with 1F1B over 2 stages of 4 ranks. mpiexec -n 8 parallel
// ranks: 8
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <xtensor/xrandom.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/optim/momentum.hpp>

#include "error_text.hpp"
using namespace tessera;

namespace {

using values = std::vector<xt::xarray<float>>;

void expect(bool ok, const std::string& what) {
  if (!ok) throw error("parallel: " + what);
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(x.data()[i] - y.data()[i]) > 1e-5f * (1.0f + std::abs(y.data()[i]))) return false;
  return true;
}

// One forward and backward of `g` under `cfg` on the ranks of `comm` from whole values
// (parameters, then the whole batch): the loss and every parameter's whole gradient.
std::pair<float, values> step(const graph::traced_graph& g, const graph::parallel_config& cfg, any_communicator& comm,
                              const values& params, const values& batch) {
  graph::executor<float> ex(graph::parallelize(g, cfg), comm);
  const std::vector<int> ps = g.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) ex.set_parameter(g.at(ps[i]).name, params[i]);
  auto r = ex.value_and_grad(ex.slice_batch(batch));
  expect(ex.last_step_traffic().bytes == ex.plan().bytes_for_rank(ex.rank()),
         "the communicators did not move the bytes the plan prices");
  values grads;
  for (std::size_t i = 0, k = 0; i < ps.size(); ++i)
    if (ex.holds_parameter(g.at(ps[i]).name)) grads.push_back(ex.gather(r.grads[k++]));
  return {r.loss, grads};
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The seed's network, traced with the seed's strategy on its first MatMul or none.
graph::traced_graph quickstart(bool configured) {
  graph::graph_builder b;
  auto x = b.input("x", {16, 32}), label = b.input("label", {16, 16});
  auto w = b.parameter("w", {32, 16}), w2 = b.parameter("w2", {16, 16});
  auto mm = b.matmul(x, w);
  if (configured) mm.shard({{2, 4}, {4, 1}});
  return b.build(b.mse_loss(b.matmul(b.relu(mm), w2), label));
}

void traced_graph_example(any_communicator& world) {
  xt::random::seed(1);  // the same whole values on every rank
  const xt::xarray<float> w0 = 0.1f * xt::random::randn<float>({32, 16}), w20 = 0.1f * xt::random::randn<float>({16, 16});
  const xt::xarray<float> inputs = xt::random::rand<float>({16, 32}), labels = xt::random::rand<float>({16, 16});
  const std::filesystem::path saved = std::filesystem::temp_directory_path() / "tessera_docs_parallel";

  // [traced]
  graph::graph_builder b;                                     // tracing: global shapes
  auto x = b.input("x", {16, 32}), label = b.input("label", {16, 16});
  auto w = b.parameter("w", {32, 16}), w2 = b.parameter("w2", {16, 16});
  auto h = b.relu(b.matmul(x, w).shard({{2, 4}, {4, 1}}));     // MatMul().shard(((2, 4), (4, 1)))
  graph::traced_graph g = b.build(b.mse_loss(b.matmul(h, w2), label));

  graph::parallel_config cfg;                                 // set_auto_parallel_context
  cfg.mode = graph::parallel_mode::auto_parallel;             // + search_mode sharding_propagation
  cfg.dataset = graph::dataset_strategy::data_parallel();
  cfg.device_num = world.size();                              // 8
  graph::executor<float> ex(graph::parallelize(g, cfg), world);  // world: any_communicator
  ex.set_parameter("w", w0);                                  // whole values: each rank keeps its shard
  ex.set_parameter("w2", w20);
  optim::momentum<float> opt(0.2f, 0.1f);
  float loss = ex.train_step(ex.slice_batch({inputs, labels}), opt);  // this rank's 2 samples
  ex.save_graphs(saved);                                      // saved/rank_R/*.ir, *.dot
  // [/traced]

  expect(world.size() == 8, "the example runs on 8 ranks");
  expect(ex.input_local_shape("x") == extents{2, 32}, "each rank does not read 2 samples");
  const graph::parallel_graph& pg = ex.plan();
  expect(pg.op(h.id()).source == graph::strategy_source::sharding_propagation &&
             pg.op(h.id()).st == strategy{{2, 4}},
         "sharding propagation did not give ReLU the seed's ((2, 4),)");

  // Every mode, and every search of auto_parallel, gives the stand-alone loss and
  // gradients (one rank with the whole batch) to float rounding.
  any_communicator one{local_communicator{}};
  const auto [alone_loss, alone_grads] = step(g, graph::parallel_config{}, one, {w0, w20}, {inputs, labels});
  if (std::abs(loss - alone_loss) > 1e-5f * (1 + alone_loss))
    throw error("parallel: auto_parallel's loss " + std::to_string(loss) + " is not the stand-alone " +
                std::to_string(alone_loss));
  using graph::parallel_mode, graph::search_mode;
  for (const auto& [mode, search] : {std::pair{parallel_mode::stand_alone, search_mode::sharding_propagation},
                                     std::pair{parallel_mode::data_parallel, search_mode::sharding_propagation},
                                     std::pair{parallel_mode::semi_auto_parallel, search_mode::sharding_propagation},
                                     std::pair{parallel_mode::auto_parallel, search_mode::sharding_propagation},
                                     std::pair{parallel_mode::auto_parallel, search_mode::dynamic_programming},
                                     std::pair{parallel_mode::auto_parallel, search_mode::recursive_programming}}) {
    graph::parallel_config c;
    c.mode = mode;
    c.search = search;
    c.device_num = world.size();
    const auto [l, grads] = step(g, c, world, {w0, w20}, {inputs, labels});
    const std::string which = std::string(to_string(mode)) + " (" + std::string(to_string(search)) + ")";
    expect(std::abs(l - alone_loss) <= 1e-5f * (1 + alone_loss), which + ": not the stand-alone loss");
    for (std::size_t i = 0; i < grads.size(); ++i)
      expect(close(grads[i], alone_grads[i]), which + ": not the stand-alone gradients");
  }

  // A rank that feeds the whole batch.
  const std::string wrong = tessera::testing::error_of([&] { ex.value_and_grad({inputs, labels}); });
  expect(wrong == "graph executor: input 'x': this rank's data is (16, 32), dataset_strategy data_parallel gives each "
                  "rank (2, 32) of (16, 32)",
         "the error for data of another shape is: " + wrong);

  // Rank 0's dump: the first MatMul and its partial sums' ReduceScatter.
  if (world.rank() == 0) {
    const std::string ir = read(saved / "rank_0" / "execute.ir");
    const std::string shown =
        "%5(matmul) = MatMul(%4, %2) {transpose_a: false, transpose_b: false} {in_strategy: ((2, 4), (4, 1)), "
        "device_matrix: (2, 4, 1), output: [0, -] partial sum {1}}\n"
        "    : (<Tensor[Float32], (8, 8)>, <Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 16)>)\n"
        "%6 = ReduceScatter(%5) {op: sum, mesh: (2, 4), axis: 1, dim: 1, rank_list: (0, 1, 2, 3), bytes: 384}\n"
        "    : (<Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 4)>)\n"
        "    # redistribution: matmul -> relu (input 0)\n";
    expect(ir.find(shown) != std::string::npos, "rank 0's execute.ir is:\n" + ir);
    for (const char* f : {"step_parallel_begin.ir", "execute.dot"})
      expect(std::filesystem::exists(saved / "rank_0" / f), std::string("no ") + f);
  }
  std::filesystem::remove_all(saved / ("rank_" + std::to_string(world.rank())));

  // dynamic_programming with no configured operator, against sharding propagation from
  // the seed's MatMul and data parallelism: the bytes rank 0 receives in a step.
  graph::parallel_config dp;
  dp.mode = parallel_mode::auto_parallel;
  dp.search = search_mode::dynamic_programming;
  dp.device_num = 8;
  graph::parallel_config sp = dp, data = dp;
  sp.search = search_mode::sharding_propagation;
  data.mode = parallel_mode::data_parallel;
  const index_t by_dp = graph::parallelize(quickstart(false), dp).bytes_for_rank(0),
                by_sp = graph::parallelize(quickstart(true), sp).bytes_for_rank(0),
                by_data = graph::parallelize(quickstart(false), data).bytes_for_rank(0);
  if (by_dp != 1994 || by_sp != 2314 || by_data != 5383)
    throw error("parallel: bytes a step: dynamic_programming " + std::to_string(by_dp) + ", sharding_propagation " +
                std::to_string(by_sp) + ", data_parallel " + std::to_string(by_data));

  // A parameter read by two operators laid out differently.
  graph::graph_builder s;
  auto sx = s.input("x", {16, 16});
  auto sw = s.parameter("w", {16, 16});
  auto first = s.matmul(sx, sw).shard({{2, 4}, {4, 1}});
  auto second = s.matmul(first, sw).shard({{8, 1}, {1, 1}});
  graph::parallel_config semi;
  semi.mode = parallel_mode::semi_auto_parallel;
  semi.device_num = 8;
  const std::string shared = tessera::testing::error_of([&] { graph::parallelize(s.build(s.reduce_mean(second)), semi); });
  expect(shared == "parallelize: parameter 'w' (16, 16) is read by MatMul 'matmul' with strategy ((2, 4), (4, 1)) "
                   "(user) as [1, -] on device matrix (2, 4, 1) and by MatMul 'matmul2' with strategy ((8, 1), (1, "
                   "1)) (user) as [-, -] on device matrix (8, 1, 1); the operators sharing a parameter must lay it "
                   "out alike",
         "the error for a shared parameter is: " + shared);
}

void pipeline_example(any_communicator& world) {
  xt::random::seed(2);
  const xt::xarray<float> w10 = 0.1f * xt::random::randn<float>({32, 16}), w20 = 0.1f * xt::random::randn<float>({16, 16});
  const xt::xarray<float> inputs = xt::random::rand<float>({16, 32}), labels = xt::random::rand<float>({16, 16});

  // [pipeline]
  graph::graph_builder b;
  auto x = b.input("x", {4, 32}), label = b.input("label", {4, 16});  // one micro-batch
  auto w1 = b.parameter("w1", {32, 16}), w2 = b.parameter("w2", {16, 16});
  b.set_pipeline_stage(0);
  auto h = b.relu(b.matmul(x, w1));                            // stage 0: ranks 0-3 of 8
  b.set_pipeline_stage(1);
  auto y = b.matmul(h, w2);                                    // stage 1: ranks 4-7
  b.set_pipeline_stage(-1);
  auto loss = b.mse_loss(y, label);                            // the loss follows: stage 1
  graph::traced_graph g = b.build(loss);

  graph::parallel_config cfg;
  cfg.mode = graph::parallel_mode::data_parallel;              // inside each stage: 4 ranks
  cfg.device_num = world.size();
  cfg.pipeline_stages = 2;
  cfg.micro_size = 4;                                          // a step feeds 4 micro-batches
  cfg.schedule = graph::pipeline_schedule::one_f_one_b;
  graph::executor<float> ex(graph::parallelize(g, cfg), world);
  ex.set_parameter("w1", w10);                                 // only stage 0's ranks keep it
  ex.set_parameter("w2", w20);
  auto r = ex.value_and_grad(ex.slice_batch({inputs, labels}));  // 16 rows: 4 micro-batches
  // [/pipeline]

  const graph::parallel_graph& pg = ex.plan();
  expect(pg.stage(h.id()) == 0 && pg.stage(y.id()) == 1 && pg.stage(loss.id()) == 1,
         "the operators are not on the stages shown");
  expect(pg.stage_of_rank(3) == 0 && pg.stage_of_rank(4) == 1, "the stages are not ranks 0-3 and 4-7");
  expect(pg.boundaries().size() == 1 && pg.boundaries()[0].producer == h.id(), "ReLU's output is not the crossing");
  expect(ex.holds_parameter("w1") == (world.rank() < 4), "w1 is not on stage 0's ranks only");
  expect(ex.last_step_traffic().bytes == pg.bytes_for_rank(ex.rank()), "the stages did not move the bytes planned");
  // The loss and gradients of the whole batch on one rank: the mean of the micro-batches'.
  graph::graph_builder a;
  auto ax = a.input("x", {16, 32}), alabel = a.input("label", {16, 16});
  auto aw1 = a.parameter("w1", {32, 16}), aw2 = a.parameter("w2", {16, 16});
  const graph::traced_graph whole = a.build(a.mse_loss(a.matmul(a.relu(a.matmul(ax, aw1)), aw2), alabel));
  any_communicator one{local_communicator{}};
  const auto [alone_loss, alone_grads] = step(whole, graph::parallel_config{}, one, {w10, w20}, {inputs, labels});
  expect(std::abs(r.loss - alone_loss) <= 1e-5f * (1 + alone_loss), "the pipeline's loss is not the stand-alone one");
  const std::size_t mine = world.rank() < 4 ? 0 : 1;  // this stage's parameter
  expect(r.grads.size() == 1 && close(ex.gather(r.grads[0]), alone_grads[mine]),
         "the pipeline's gradients are not the stand-alone ones");

  // The bubbles of 4 stages of 8 micro-batches.
  const double one_f = graph::simulate_schedule(graph::pipeline_schedule::one_f_one_b, 4, 1, 8).bubble_fraction;
  const double inter = graph::simulate_schedule(graph::pipeline_schedule::interleaved_one_f_one_b, 4, 2, 8).bubble_fraction;
  if (std::abs(one_f - 0.273) > 5e-4 || std::abs(inter - 0.158) > 5e-4)
    throw error("parallel: bubbles " + std::to_string(one_f) + " (1F1B), " + std::to_string(inter) + " (interleaved)");

  // A value flowing to an earlier stage.
  graph::graph_builder e;
  auto ex_x = e.input("x", {4, 4});
  auto ex_w = e.parameter("w", {4, 4});
  e.set_pipeline_stage(1);
  auto late = e.matmul(ex_x, ex_w);
  e.set_pipeline_stage(0);
  graph::parallel_config two = cfg;
  two.micro_size = 1;
  const std::string back = tessera::testing::error_of([&] { graph::parallelize(e.build(e.reduce_mean(e.relu(late))), two); });
  expect(back == "parallelize: ReLU 'relu' on pipeline stage 0 reads MatMul 'matmul' of the later stage 1; values "
                 "flow to later stages only",
         "the error for a value flowing back is: " + back);
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    traced_graph_example(world);
    pipeline_example(world);
  });
}
