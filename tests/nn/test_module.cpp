// Tests of nn/module.hpp: parameters drawn as the global tensor whose shard each rank
// keeps (any layout, any rank count), dotted names and traversal of nested modules,
// trainable parameters, train and eval modes, layouts from strategies at build time,
// placed_as across device matrices, and the errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/nn/layers.hpp>

using namespace tessera;

namespace {

// The seed's network (002): Flatten, then Dense-ReLU-Dense-ReLU-Dense.
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

}  // namespace

TEST_CASE("parameter: every layout's shards piece together the one global tensor") {
  const extents shape{6, 4};
  nn::parameter<double> whole(shape, "normal");
  whole.set_name("fc.weight");
  whole.build(layout::replicated(mesh{1}, 2), 0, 7);
  const auto& g = whole.data().local();
  const std::vector<layout> layouts{layout(mesh{2}, {{0}, {}}), layout(mesh{2, 2}, {{1}, {0}}),
                                    layout(mesh{3}, {{0}, {}}), layout(mesh{4}, {{}, {0}}),
                                    layout::replicated(mesh{2}, 2)};
  for (const layout& l : layouts) {
    CAPTURE(to_string(l));
    for (int r = 0; r < l.dev.size(); ++r) {
      nn::parameter<double> p(shape, "normal");
      p.set_name("fc.weight");
      p.build(l, r, 7);
      const extents off = p.data().local_offset(), ls = p.data().local_shape();
      for (index_t i = 0; i < ls[0]; ++i)
        for (index_t j = 0; j < ls[1]; ++j)
          CHECK(p.data().local()(std::size_t(i), std::size_t(j)) ==
                g(std::size_t(off[0] + i), std::size_t(off[1] + j)));
    }
  }
  // Another seed or name draws other values.
  nn::parameter<double> other(shape, "normal");
  other.set_name("fc.weight");
  other.build(layout::replicated(mesh{1}, 2), 0, 8);
  CHECK(other.data().local()(0, 0) != g(0, 0));
}

TEST_CASE("module: dotted names, traversal and trainable parameters") {
  network net;
  const auto named = net.named_parameters();
  std::vector<std::string> names;
  for (const auto& [n, p] : named) names.push_back(n);
  CHECK(names == std::vector<std::string>{"dense_relu_sequential.0.weight", "dense_relu_sequential.0.bias",
                                          "dense_relu_sequential.2.weight", "dense_relu_sequential.2.bias",
                                          "dense_relu_sequential.4.weight", "dense_relu_sequential.4.bias"});
  CHECK(named[0].second->shape() == extents{512, 784});
  CHECK(named[5].second->shape() == extents{10});
  CHECK(net.parameters().size() == 6);
  net.dense_relu_sequential.get<0>().bias.set_requires_grad(false);
  CHECK(net.trainable_params().size() == 5);
  CHECK(net.trainable_params()[1] == &net.dense_relu_sequential.get<2>().weight);

  nn::dense<float> no_bias(3, 2, "ones", "zeros", false);
  CHECK(no_bias.parameters().size() == 1);
}

TEST_CASE("module: build names, lays out and draws every parameter; train and eval modes") {
  any_communicator one{local_communicator{}};
  context ctx(one);
  network net;
  CHECK_THROWS_WITH(net.dense_relu_sequential.get<0>().weight.data(),
                    "parameter '': not built yet: call build(ctx) on the network first");
  net.build(ctx, 1);
  CHECK(net.built());
  auto& w0 = net.dense_relu_sequential.get<0>().weight;
  CHECK(w0.name() == "dense_relu_sequential.0.weight");
  CHECK(w0.data().local_shape() == extents{512, 784});
  CHECK(w0.layout().dev.size() == 1);
  // "zeros" bias, "normal" weights (sigma 0.01).
  for (float b : net.dense_relu_sequential.get<0>().bias.data().data()) CHECK(b == 0.0f);
  double s2 = 0;
  for (float w : w0.data().data()) s2 += double(w) * w;
  CHECK(std::sqrt(s2 / (512.0 * 784)) == doctest::Approx(0.01).epsilon(0.02));

  // A second build keeps trained values.
  w0.data().data()[0] = 42.0f;
  net.build(ctx, 1);
  CHECK(w0.data().data()[0] == 42.0f);

  CHECK(net.training());
  net.set_train(false);
  CHECK(!net.training());
  CHECK(!net.dense_relu_sequential.get<1>().training());
  net.set_train();
  CHECK(net.dense_relu_sequential.get<3>().training());

  CHECK_THROWS_WITH(w0.set_data(dist_tensor<float>(layout::replicated(mesh{1}, 1), extents{3}, 0)),
                    "parameter 'dense_relu_sequential.0.weight': set_data: the value is (3,), the parameter (512, 784)");
}

TEST_CASE("module: strategies decide the parameters' layouts; set_data_parallel resets them") {
  // Layouts are computed for any device count; build on 4 devices is done by place().
  nn::dense<float> fc(8, 6);
  fc.place(4);
  CHECK(fc.weight.target_layout()->pieces(0) == 1);  // data parallel: replicated weight
  CHECK(fc.weight.target_layout()->pieces(1) == 1);
  fc.shard(strategy{{1, 1}, {2, 1}});  // rows of the weight (output features) split in 2
  fc.place(4);
  CHECK(fc.weight.target_layout()->pieces(0) == 2);
  CHECK(fc.bias.target_layout()->pieces(0) == 2);
  fc.shard(strategy{{2, 2}, {1, 2}});  // the contraction split: ops::matmul and ops::bias_add
  fc.place(4);
  CHECK(fc.weight.target_layout()->pieces(1) == 2);
  fc.set_data_parallel();
  CHECK(fc.matmul.st.n == 0);
  fc.shard(strategy{{3, 1}, {1, 1}});
  CHECK_THROWS_WITH(fc.place(4),
                    "dense: strategy: the product of an input's splits must divide the device count: input 0: "
                    "product of splits 3, device count 4; strategy ((3, 1), (1, 1))");
  CHECK_THROWS_WITH(nn::dense<float>(0, 3), "dense: in_channels and out_channels must be positive: got 0 and 3");
}

TEST_CASE("placed_as: a tensor placed alike on another device matrix is borrowed, not moved") {
  any_communicator one{local_communicator{}};
  context ctx(one);
  dist_tensor<float> x(layout(mesh{1, 1}, {{0}, {1}}), extents{2, 3}, 0);
  x.fill_global([](const auto& i) { return float(i[0] * 3 + i[1]); });
  // core/refine.hpp's same_placement: the one test of "already laid out so".
  const laid_out<float> same = nn::detail::placed_as(x, layout::replicated(mesh{1}, 2), ctx);
  CHECK(&*same == &x);
  // Partial over one rank: nothing to reduce, the same placement too.
  const laid_out<float> whole = nn::detail::placed_as(x, layout::replicated(mesh{1}, 2).with_partial(0), ctx);
  CHECK(&*whole == &x);
  CHECK(ctx.total_stats().bytes == 0);
}
