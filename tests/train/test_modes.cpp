// One network written once as modules (Flatten, Dense with ReLU, a user-defined module
// with a parameter and operators of its own, Dropout, Dense, and the cross entropy)
// trained by train::model in every parallel mode on 1, 2, 4 and 8 ranks: the losses and
// the parameters equal those of stand-alone training on one rank, every step moves the
// bytes the plan prices, data parallel reduces the gradients in the reducer's buckets
// during the backward pass; and on small meshes the searches' choices for a traced
// module network equal the least price over every assignment of candidates. The same
// network without dropout, its blocks on 1, 2 or 4 pipeline stages (module
// set_pipeline_stage), trained with 2 and 4 micro-batches in each schedule, equals the
// whole batch on one rank, its checkpoint (parameters and optimizer state) included,
// with optimizer parallel splitting each stage's state over its ranks too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/trace.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/io/checkpoint.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/model.hpp>

#include "error_text.hpp"
#include "graph/brute_force.hpp"
#include "train_test.hpp"

namespace train_test_modes {  // the file's own scope in its test group's translation unit

using namespace tessera;
using train_test::mode;

namespace {

constexpr index_t rows = 16, classes = 4;

// A module written by a user: h = x + relu(x w), with its own parameter and operators
// (a MatMul whose strategy may be set, an Add, a ReLU), eager and traced alike.
struct residual : nn::module<float> {
  nn::parameter<float> w{extents{16, 16}, nn::initializer::normal(0.1)};
  ops::matmul_op matmul;

  void visit(nn::visitor<float>& v) override { v.param("w", w); }
  template <class V>
  V operator()(V x) {
    const V h = nn::apply_named(this->op_name("matmul"), matmul, x, w.on(x));
    return nn::apply_named(this->op_name("add"), ops::add_op{}, x,
                           nn::apply_named(this->op_name("relu"), ops::relu_op{}, h));
  }
};

struct network : nn::module<float> {
  nn::flatten<float> flatten;
  nn::dense<float> fc{12, 16, {}, {}, true, nn::activation::relu};
  residual res;
  nn::dropout<float> drop{0.25};
  nn::dense<float> out{16, classes};

  void visit(nn::visitor<float>& v) override {
    v.child("flatten", flatten);
    v.child("fc", fc);
    v.child("res", res);
    v.child("drop", drop);
    v.child("out", out);
  }
  template <class V>
  V operator()(V x) {
    return out(drop(res(fc(flatten(x)))));
  }
};

using batch_t = std::pair<xt::xarray<float>, xt::xarray<std::int32_t>>;

// Step s's global batch: inputs (16, 3, 4), labels in [0, 4).
batch_t global_batch(int s) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t(rows), 3, 4});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(int((i * 7 + std::size_t(s) * 13) % 19) - 9) / 9.0f;
  xt::xarray<std::int32_t> y = xt::xarray<std::int32_t>::from_shape({std::size_t(rows)});
  for (std::size_t i = 0; i < y.size(); ++i) y(i) = std::int32_t((i * 3 + std::size_t(s)) % classes);
  return {x, y};
}

// Rows [r b, (r + 1) b) of a batch, b = rows / p.
batch_t slice(const batch_t& g, int r, int p) {
  const std::size_t b = std::size_t(rows / p);
  xt::xarray<float> x = xt::xarray<float>::from_shape({b, 3, 4});
  std::copy_n(g.first.data() + std::size_t(r) * b * 12, b * 12, x.data());
  xt::xarray<std::int32_t> y = xt::xarray<std::int32_t>::from_shape({b});
  std::copy_n(g.second.data() + std::size_t(r) * b, b, y.data());
  return {x, y};
}

struct recorder : train::callback<float> {
  std::vector<double> losses;
  std::vector<bool> priced;  // the step moved the bytes its plan prices
  train::model<network, nn::cross_entropy_loss<float>>* model = nullptr;
  context* ctx = nullptr;
  void on_step_end(train::run_context<float>& rc) override {
    losses.push_back(rc.loss);
    priced.push_back(model->last_step_traffic().bytes == model->plan().bytes_for_rank(ctx->rank()));
  }
};

struct outcome {
  std::vector<double> losses;
  std::vector<xt::xarray<float>> params;
  std::vector<bool> priced;
  bool overlapped = false;  // a bucket started before the backward pass ended
};

// The strategies a semi_auto_parallel run sets on the modules for p ranks.
void set_strategies(network& net, int p) {
  if (p == 1) return;
  const int a = p >= 4 ? 2 : 1, k = p / a;
  net.fc.shard(strategy{{a, 1}, {k, 1}});        // rows a ways, the output features k ways
  net.res.matmul.st = strategy{{1, p}, {p, 1}};  // the contraction split: partial sums
}

outcome train_in(const graph::parallel_config& cfg, context& ctx, bool whole_batch, bool configured) {
  const int p = ctx.size(), r = ctx.rank();
  network net;
  if (configured) set_strategies(net, p);
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model<network, nn::cross_entropy_loss<float>>::options o;
  o.parallel = cfg;
  o.seed = 7;
  train::model model(net, ce, opt, ctx, o);
  std::vector<batch_t> data;
  for (int s = 0; s < 4; ++s) data.push_back(whole_batch ? global_batch(s) : slice(global_batch(s), r, p));
  recorder rec;
  rec.model = &model;
  rec.ctx = &ctx;
  model.train(2, data, {&rec});
  outcome out;
  out.losses = rec.losses;
  out.priced = rec.priced;
  for (auto* q : net.parameters())
    out.params.push_back(redistribute(q->data(), layout::replicated(q->layout().dev, q->shape().ndim), ctx).local());
  if (auto* red = model.reducer())
    for (const auto& e : red->events())
      if (e.what == decltype(e.what)::bucket_started && e.nodes_left > 0) out.overlapped = true;
  return out;
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(std::abs(x.data()[i] - y.data()[i]) <= 2e-5f * (1.0f + std::abs(y.data()[i])))) return false;
  return true;
}

}  // namespace

TEST_CASE("one module network trains in every parallel mode to the stand-alone numbers") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size();
  any_communicator one{local_communicator{}};
  context solo(one);
  const outcome oracle = train_in(mode(graph::parallel_mode::stand_alone), solo, true, false);
  REQUIRE(oracle.losses.size() == 8);
  for (double l : oracle.losses) CHECK(std::isfinite(l));
  struct mode_case {
    const char* what;
    graph::parallel_config cfg;
    bool whole_batch, configured;
  };
  const std::vector<mode_case> cases = {
      {"stand_alone", mode(graph::parallel_mode::stand_alone), true, false},
      {"data_parallel", mode(graph::parallel_mode::data_parallel), false, false},
      {"semi_auto_parallel", mode(graph::parallel_mode::semi_auto_parallel), false, true},
      {"auto_parallel, sharding propagation", mode(graph::parallel_mode::auto_parallel), false, true},
      {"auto_parallel, dynamic programming",
       mode(graph::parallel_mode::auto_parallel, graph::search_mode::dynamic_programming), false, false},
      {"hybrid_parallel", mode(graph::parallel_mode::hybrid_parallel), true, false},
  };
  for (const mode_case& c : cases) {
    CAPTURE(c.what);
    const outcome got = train_in(c.cfg, ctx, c.whole_batch, c.configured);
    REQUIRE(got.losses.size() == oracle.losses.size());
    for (std::size_t i = 0; i < got.losses.size(); ++i) {
      CAPTURE(i);
      CHECK(got.losses[i] == doctest::Approx(oracle.losses[i]).epsilon(1e-5));
      CHECK(got.priced[i]);
    }
    REQUIRE(got.params.size() == oracle.params.size());
    for (std::size_t i = 0; i < got.params.size(); ++i) {
      CAPTURE(i);
      CHECK(close(got.params[i], oracle.params[i]));
    }
    if (c.cfg.mode == graph::parallel_mode::data_parallel && p > 1) CHECK(got.overlapped);
  }
}

TEST_CASE("the traced module network: names from the module tree, strategies from the modules") {
  network net;
  set_strategies(net, 8);
  nn::cross_entropy_loss<float> ce;
  const nn::traced_network t = nn::trace(net, ce, extents{rows, 3, 4}, extents{rows});
  const graph::traced_graph& g = t.graph;
  CHECK(g.at(g.find("fc.weight")).kind == graph::node_kind::parameter);
  CHECK(g.at(g.find("res.w")).shape == extents{16, 16});
  CHECK(g.at(g.find("fc.matmul")).op->type() == "MatMul");
  CHECK(g.at(g.find("fc.matmul")).user_strategy == strategy{{2, 1}, {4, 1}});
  CHECK(g.at(g.find("fc.bias_add")).user_strategy == strategy{{2, 4}, {4}});
  CHECK(g.at(g.find("fc.relu")).op->type() == "ReLU");
  CHECK(g.at(g.find("res.matmul")).user_strategy == strategy{{1, 8}, {8, 1}});
  CHECK(g.at(g.find("drop.dropout")).op->type() == "Dropout");
  CHECK(g.at(g.find("sparse_softmax_cross_entropy")).op->type() == "SparseSoftmaxCrossEntropyWithLogits");
  CHECK(g.at(t.output).name == "out.bias_add");
  CHECK(g.inputs().size() == 2);
}

namespace {
// A small module network for the searches' check: Dense with ReLU, then Dense, and the
// mean squared error.
struct small_net : nn::module<float> {
  nn::dense<float> a{8, 8, {}, {}, true, nn::activation::relu};
  nn::dense<float> b{8, 4, {}, {}, false};
  void visit(nn::visitor<float>& v) override {
    v.child("a", a);
    v.child("b", b);
  }
  template <class V>
  V operator()(V x) {
    return b(a(x));
  }
};
}  // namespace

TEST_CASE("the searches' choices for a traced module network: the least price over every assignment") {
  for (int n : {2, 4}) {
    for (bool dp : {false, true}) {
      CAPTURE(n);
      CAPTURE(dp);
      small_net net;
      if (!dp) net.a.shard(strategy{{n, 1}, {1, 1}});  // sharding propagation starts from a configured operator
      nn::mse_loss<float> mse;
      const graph::traced_graph g = nn::trace(net, mse, extents{16, 8}, extents{16, 4}).graph;
      graph::parallel_config cfg;
      cfg.mode = graph::parallel_mode::auto_parallel;
      cfg.search = dp ? graph::search_mode::dynamic_programming : graph::search_mode::sharding_propagation;
      cfg.device_num = n;
      const graph::parallel_graph pg = graph::parallelize(g, cfg);
      std::vector<graph::op_plan> chosen(std::size_t(g.size()));
      for (int id = 0; id < g.size(); ++id)
        if (g.at(id).kind == graph::node_kind::op) chosen[std::size_t(id)] = pg.op(id);
      const graph::testing::brute_result r = graph::testing::brute_force_price(g, n, chosen, dp ? cfg.flops_per_byte : 0);
      CHECK(r.best < graph::infinite_bytes);
      CHECK(r.of_choice == r.best);
    }
  }
}

namespace {
// The network above without dropout (a micro-batch draws its own mask), four blocks
// to put on pipeline stages: Dense with ReLU, two residual blocks, Dense.
struct staged_network : nn::module<float> {
  nn::flatten<float> flatten;
  nn::dense<float> fc{12, 16, {}, {}, true, nn::activation::relu};
  residual res, res2;
  nn::dense<float> out{16, classes};

  void visit(nn::visitor<float>& v) override {
    v.child("flatten", flatten);
    v.child("fc", fc);
    v.child("res", res);
    v.child("res2", res2);
    v.child("out", out);
  }
  template <class V>
  V operator()(V x) {
    return out(res2(res(fc(flatten(x)))));
  }
  // Block b on stage b K / 4 (K = 0: none).
  void stage(int K) {
    if (K == 0) return;
    nn::module<float>* blocks[4] = {&fc, &res, &res2, &out};
    for (int b = 0; b < 4; ++b) blocks[b]->set_pipeline_stage(b * K / 4);
  }
};

struct staged_outcome {
  std::vector<double> losses;
  std::vector<bool> priced;
  std::vector<xt::xarray<float>> params;  // from the checkpoint written at the end, whole
  std::vector<xt::xarray<float>> moments;  // the optimizer's state, from the same checkpoint
  int split_states = 0;  // with optimizer parallel: this rank's parameters whose state is split further
  train::eval_result evaluated;  // model.eval over the training batches, after training
};

// 4 steps of Momentum on `ctx` under `cfg` (the operators on K stages), each rank
// reading rows `r mod n` of n = ranks / pipeline_stages, with optimizer parallel or
// not; the parameters and the optimizer's state as the checkpoint written at the end
// holds them.
staged_outcome train_staged(const graph::parallel_config& cfg, context& ctx, int K, bool parallel_optimizer = false) {
  const int n = ctx.size() / std::max(1, cfg.pipeline_stages), r = ctx.rank() % n;
  staged_network net;
  net.stage(K);
  if (cfg.mode == graph::parallel_mode::auto_parallel && n > 1) net.res.matmul.st = strategy{{1, n}, {n, 1}};
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  if (parallel_optimizer) opt.enable_parallel_optimizer(ctx, {.threshold_bytes = 0});
  train::model<staged_network, nn::cross_entropy_loss<float>>::options o;
  o.parallel = cfg;
  o.seed = 7;
  train::model model(net, ce, opt, ctx, o);
  std::vector<batch_t> data;
  for (int s = 0; s < 4; ++s) data.push_back(slice(global_batch(s), r, n));
  struct staged_recorder : train::callback<float> {
    staged_outcome* out;
    train::model<staged_network, nn::cross_entropy_loss<float>>* model;
    context* ctx;
    void on_step_end(train::run_context<float>& rc) override {
      out->losses.push_back(rc.loss);
      // Optimizer parallel makes the once-a-step gradient reductions in its step.
      const graph::parallel_graph& pg = model->plan();
      const index_t once = parallel_optimizer ? pg.bytes_reduced_once(ctx->rank()) : 0;
      out->priced.push_back(model->last_step_traffic().bytes == pg.bytes_for_rank(ctx->rank()) - once);
    }
    bool parallel_optimizer = false;
  };
  staged_outcome out;
  staged_recorder rec;
  rec.out = &out;
  rec.model = &model;
  rec.ctx = &ctx;
  rec.parallel_optimizer = parallel_optimizer;
  train_test::temp_folder tmp(ctx.world());
  train::model_checkpoint<float> ckpt("net", tmp.path, ctx,
                                      {.save_checkpoint_steps = 100, .keep_checkpoint_max = 1, .integrated_save = true});
  model.train(1, data, {&rec, &ckpt});
  out.evaluated = model.eval(data);
  ctx.world().barrier();
  staged_network fresh;  // read back on one rank
  any_communicator one{local_communicator{}};
  context solo(one);
  fresh.build(solo, 3);
  std::vector<io::param_ref> refs;
  for (auto& [name, q] : fresh.named_parameters()) refs.emplace_back(name, q->data());
  std::vector<dist_tensor<float>> moments;
  for (auto& [name, q] : fresh.named_parameters()) moments.emplace_back(q->data().layout(), q->shape(), 0);
  std::size_t k = 0;
  for (auto& [name, q] : fresh.named_parameters()) refs.emplace_back("moments." + name, moments[k++]);
  io::load_distributed_checkpoint(tmp.path / "net-1_4.safetensors", refs);
  for (auto* q : fresh.parameters()) out.params.push_back(q->data().local());
  for (const dist_tensor<float>& m : moments) out.moments.push_back(m.local());
  for (std::size_t i = 0; i < opt.parameters().size(); ++i)
    if (opt.updates_here(i) && !(opt.state_layout(i) == opt.parameters()[i]->layout())) ++out.split_states;
  return out;
}
// A pipelined training against the one-rank one: the losses, each step's bytes as
// priced, the eval, and the parameters and Momentum's state from the checkpoint.
void check_same_training(const staged_outcome& got, const staged_outcome& oracle) {
  REQUIRE(got.losses.size() == oracle.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(got.losses[i] == doctest::Approx(oracle.losses[i]).epsilon(1e-5));
    CHECK(got.priced[i]);
  }
  CHECK(got.evaluated.accuracy == oracle.evaluated.accuracy);
  CHECK(got.evaluated.loss == doctest::Approx(oracle.evaluated.loss).epsilon(1e-5));
  CHECK(got.evaluated.samples == oracle.evaluated.samples);
  REQUIRE(got.params.size() == oracle.params.size());
  for (std::size_t i = 0; i < got.params.size(); ++i) {
    CAPTURE(i);
    CHECK(close(got.params[i], oracle.params[i]));
    CHECK(close(got.moments[i], oracle.moments[i]));
  }
}
}  // namespace

TEST_CASE("pipeline stages set on the modules: train::model on every rank count equals the whole batch on one rank") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size();
  any_communicator one{local_communicator{}};
  context solo(one);
  const staged_outcome oracle = train_staged(mode(graph::parallel_mode::stand_alone), solo, 0);
  REQUIRE(oracle.losses.size() == 4);
  using enum graph::pipeline_schedule;
  for (int S : {1, 2, 4})
    for (graph::pipeline_schedule k : {gpipe, one_f_one_b, interleaved_one_f_one_b})
      for (int M : {2, 4})
        for (graph::parallel_mode m : {graph::parallel_mode::data_parallel, graph::parallel_mode::auto_parallel}) {
          const int V = k == interleaved_one_f_one_b && S == 2 ? 2 : 1;  // interleaved: two chunks a stage
          if (p % S != 0 || (V > 1 && M % S != 0)) continue;
          CAPTURE(S);
          CAPTURE(k);
          CAPTURE(M);
          CAPTURE(m);
          graph::parallel_config cfg = mode(m);
          cfg.pipeline_stages = S;
          cfg.micro_size = M;
          cfg.schedule = k;
          if (rows / M % (p / S) != 0) continue;  // a micro-batch's rows split over a stage's ranks
          const staged_outcome got = train_staged(cfg, ctx, S * V);
          check_same_training(got, oracle);
        }
}

TEST_CASE("pipeline stages with optimizer parallel: each stage's state split over its ranks, the same training") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size();
  any_communicator one{local_communicator{}};
  context solo(one);
  const staged_outcome oracle = train_staged(mode(graph::parallel_mode::stand_alone), solo, 0);
  using enum graph::pipeline_schedule;
  for (int S : {1, 2, 4})
    for (graph::pipeline_schedule k : {one_f_one_b, interleaved_one_f_one_b})
      for (graph::parallel_mode m : {graph::parallel_mode::data_parallel, graph::parallel_mode::auto_parallel}) {
        const int V = k == interleaved_one_f_one_b && S == 2 ? 2 : 1, M = 4;
        if (p % S != 0 || rows / M % (p / S) != 0) continue;
        CAPTURE(S);
        CAPTURE(k);
        CAPTURE(m);
        graph::parallel_config cfg = mode(m);
        cfg.pipeline_stages = S;
        cfg.micro_size = M;
        cfg.schedule = k;
        const staged_outcome got = train_staged(cfg, ctx, S * V, true);
        // Data parallel replicates every parameter over its stage's ranks (one rank: none
        // to split over); the search may leave none replicated.
        if (m == graph::parallel_mode::data_parallel) CHECK((got.split_states > 0) == (p / S > 1));
        check_same_training(got, oracle);
      }
}

TEST_CASE("pipeline stages in train::model: batches of another shape and a micro_size that does not divide are errors") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  staged_network net;
  net.stage(1);
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model<staged_network, nn::cross_entropy_loss<float>>::options o;
  o.parallel = mode(graph::parallel_mode::data_parallel);
  o.parallel.micro_size = 2;
  train::model model(net, ce, opt, ctx, o);
  std::vector<batch_t> data{slice(global_batch(0), world.rank(), world.size())};
  model.train(1, data);
  std::vector<batch_t> fewer{slice(global_batch(0), 0, 2 * world.size())};  // half the rows
  CHECK(tessera::testing::error_of([&] { model.eval(fewer); }).find("every batch has the first one's shape") !=
        std::string::npos);
  o.parallel.micro_size = 3;
  train::model odd(net, ce, opt, ctx, o);
  CHECK(tessera::testing::error_of([&] { odd.train(1, data); }).find("micro_size 3 does not divide the global batch") !=
        std::string::npos);
}
}  // namespace train_test_modes
