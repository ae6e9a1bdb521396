// Partial sums through linear operators (ops/linear_rule.hpp), under mpiexec: every
// linear operator given partial sums (constructed, or made by a contraction-split
// MatMul) keeps them partial where its rule holds replicas, and its output, once
// resolved, and its inputs' gradients equal those of the whole computation; operators
// that are not linear resolve them. The tensors are on the test device
// (tests/cuda/autodiff.cu: the GPU). The constexpr rule's own cases are in
// tests/static/static_linear_rule.cpp.
#include <doctest/doctest.h>

#include "device_under_test.hpp"
#include "ops/sharded_testing.hpp"

#include <functional>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape.hpp>

namespace ops_test_linear_rule {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;

namespace {

using tensor = test_tensor;
using ctx_t = device_context<test_comm>;

// Partial sums of the global tensor g under the non-partial placement of `l` (l's
// partial axes): each rank's shard of g, split into integer terms (rank 0 of each
// partial group holds the shard minus the others' terms), exact in float. Made on the
// host, then moved to the test device.
tensor partial_of(const xt::xarray<float>& g, const layout& l, int rank, int seed) {
  const dist_tensor<float> whole = host_shard_of(g, l.without_partial(), rank);
  const auto c = l.dev.coords(rank);
  int group = 1, first = 1;
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.is_partial(a)) {
      group *= l.dev.dims[a];
      if (c[a] != 0) first = 0;
    }
  const xt::xarray<float> term = integer_tensor(extents_of(std::vector<std::size_t>(
                                                    whole.local().shape().begin(), whole.local().shape().end())),
                                                seed + 17);
  xt::xarray<float> mine = first ? xt::xarray<float>(whole.local() - float(group - 1) * term) : term;
  return to_test_device(dist_tensor<float>(l, whole.global_shape(), rank, std::move(mine)));
}

tensor whole_of(const xt::xarray<float>& g, int p, int rank) {
  return shard_of(g, layout::replicated(mesh{p}, int(g.dimension())), rank);
}

// The partial layouts an input of rank `nd` is given: partial over every rank of (p,);
// on (2, p / 2), dim 0 split over axis 0 and partial over axis 1.
std::vector<layout> partial_forms(int p, int nd, index_t dim0) {
  std::vector<layout> f{layout::replicated(mesh{p}, nd).with_partial(0)};
  if (p >= 4 && dim0 % 2 == 0) f.push_back(layout::replicated(mesh{2, p / 2}, nd).with_split(0, axis_list{0}).with_partial(1));
  return f;
}

using fwd_fn = std::function<tensor(const std::vector<tensor>&, ctx_t&)>;
using bwd_fn = std::function<std::vector<tensor>(const tensor&, const std::vector<tensor>&, ctx_t&)>;

struct op_case {
  std::string name;
  std::vector<extents> shapes;
  unsigned partial_inputs;  // bit i: input i arrives partial
  bool linear;              // the output stays partial (on more than one rank)
  fwd_fn fwd;
  bwd_fn bwd;
};

// Runs `c` with its partial inputs in every partial form and the others whole, and
// compares with the same operator on whole inputs.
void check_case(const op_case& c, ctx_t& ctx) {
  CAPTURE(c.name);
  const int p = ctx.size(), me = ctx.rank();
  std::vector<xt::xarray<float>> g;
  std::vector<tensor> whole;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    g.push_back(integer_tensor(c.shapes[i], int(i) * 3 + 1));
    whole.push_back(whole_of(g.back(), p, me));
  }
  const tensor y0 = c.fwd(whole, ctx);
  const xt::xarray<float> want = gather(y0, ctx);
  const tensor dy = whole_of(integer_tensor(y0.global_shape(), 9), p, me);
  std::vector<xt::xarray<float>> want_grads;
  for (const tensor& d : c.bwd(dy, whole, ctx)) want_grads.push_back(gather(d, ctx));
  for (const layout& form : partial_forms(p, c.shapes[0].ndim, c.shapes[0][0])) {
    CAPTURE(to_string(form));
    std::vector<tensor> in;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
      layout l = form;
      if (l.ndim != c.shapes[i].ndim || c.shapes[i][0] % l.pieces(0) != 0)
        l = layout::replicated(mesh{p}, c.shapes[i].ndim).with_partial(0);
      in.push_back(c.partial_inputs >> i & 1u ? partial_of(g[i], l, me, int(i)) : whole[i]);
    }
    const tensor y = c.fwd(in, ctx);
    CHECK(y.layout().has_partial() == (c.linear && p > 1));
    CHECK(close(gather(y, ctx), want));
    const std::vector<tensor> grads = c.bwd(dy, in, ctx);
    REQUIRE(grads.size() == want_grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);
      // The gradient of a partial input is the gradient of the sum: not partial over
      // the axes it came partial over.
      if (c.partial_inputs >> i & 1u) CHECK((grads[i].layout().partial & refine(in[i].layout(), grads[i].layout().dev).partial) == 0u);
      CHECK(close(gather(grads[i], ctx), want_grads[i]));
    }
  }
}

std::vector<tensor> pair_grads(std::pair<tensor, tensor> g) {
  return {std::move(g.first), std::move(g.second)};
}

std::vector<op_case> cases() {
  const strategy one{{1, 1}}, two{{1, 1}, {1, 1}};
  std::vector<op_case> c;
  c.push_back({"neg", {{8, 8}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::neg(ops::neg_op{one}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::neg_backward(ops::neg_op{one}, dy, x[0], ctx)};
               }});
  for (unsigned which : {1u, 2u})
    c.push_back({which == 1 ? "mul, the first factor partial" : "mul, the second factor partial", {{8, 8}, {8}}, which, true,
                 [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::mul(ops::mul_op{strategy{{1, 1}, {1}}}, x[0], x[1], ctx); },
                 [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                   return pair_grads(ops::mul_backward(ops::mul_op{strategy{{1, 1}, {1}}}, dy, x[0], x[1], ctx));
                 }});
  c.push_back({"add, both partial", {{8, 8}, {8, 8}}, 3u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::add(ops::add_op{two}, x[0], x[1], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return pair_grads(ops::add_backward(ops::add_op{two}, dy, x[0], x[1], ctx));
               }});
  c.push_back({"sub, both partial", {{8, 8}, {8, 8}}, 3u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::sub(ops::sub_op{two}, x[0], x[1], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return pair_grads(ops::sub_backward(ops::sub_op{two}, dy, x[0], x[1], ctx));
               }});
  c.push_back({"add, one partial: resolved", {{8, 8}, {8, 8}}, 1u, false,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::add(ops::add_op{two}, x[0], x[1], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return pair_grads(ops::add_backward(ops::add_op{two}, dy, x[0], x[1], ctx));
               }});
  c.push_back({"div, the numerator partial", {{8, 8}, {8, 8}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::div(ops::div_op{two}, x[0], x[1], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return pair_grads(ops::div_backward(ops::div_op{two}, dy, x[0], x[1], ctx));
               }});
  c.push_back({"relu: resolved", {{8, 8}}, 1u, false,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::relu(ops::relu_op{one}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::relu_backward(ops::relu_op{one}, dy, x[0], ctx)};
               }});
  c.push_back({"exp: resolved", {{8, 8}}, 1u, false,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::exp(ops::exp_op{one}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::exp_backward(ops::exp_op{one}, dy, x[0], ctx)};
               }});
  for (unsigned which : {1u, 2u})
    c.push_back({which == 1 ? "matmul, A partial" : "matmul, B partial", {{8, 8}, {8, 4}}, which, true,
                 [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::matmul(ops::matmul_op{two}, x[0], x[1], ctx); },
                 [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                   return pair_grads(ops::matmul_backward(ops::matmul_op{two}, dy, x[0], x[1], ctx));
                 }});
  c.push_back({"batch_matmul, A partial", {{4, 4, 4}, {4, 4}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) {
                 return ops::batch_matmul(ops::batch_matmul_op{strategy{{1, 1, 1}, {1, 1}}}, x[0], x[1], ctx);
               },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return pair_grads(
                     ops::batch_matmul_backward(ops::batch_matmul_op{strategy{{1, 1, 1}, {1, 1}}}, dy, x[0], x[1], ctx));
               }});
  c.push_back({"reduce_sum", {{8, 8}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::reduce_sum(ops::reduce_sum_op{one, {1}}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::reduce_sum_backward(ops::reduce_sum_op{one, {1}}, dy, x[0], ctx)};
               }});
  c.push_back({"reduce_mean", {{8, 8}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::reduce_mean(ops::reduce_mean_op{one, {0}, true}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::reduce_mean_backward(ops::reduce_mean_op{one, {0}, true}, dy, x[0], ctx)};
               }});
  c.push_back({"reduce_max: resolved", {{8, 8}}, 1u, false,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::reduce_max(ops::reduce_max_op{one, {1}}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 const tensor y = ops::reduce_max(ops::reduce_max_op{one, {1}}, x[0], ctx);
                 return std::vector<tensor>{ops::reduce_max_backward(ops::reduce_max_op{one, {1}}, dy, x[0], y, ctx)};
               }});
  c.push_back({"transpose", {{8, 4}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::transpose(ops::transpose_op{one, {1, 0}}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::transpose_backward(ops::transpose_op{one, {1, 0}}, dy, x[0], ctx)};
               }});
  c.push_back({"reshape", {{8, 4}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::reshape(ops::reshape_op{one, {4, 8}}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::reshape_backward(ops::reshape_op{one, {4, 8}}, dy, x[0], ctx)};
               }});
  c.push_back({"flatten", {{4, 2, 4}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::flatten(ops::flatten_op{strategy{{1, 1, 1}}}, x[0], ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{ops::flatten_backward(ops::flatten_op{strategy{{1, 1, 1}}}, dy, x[0], ctx)};
               }});
  c.push_back({"strided_slice", {{8, 8}}, 1u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) {
                 return ops::strided_slice(ops::strided_slice_op{one, {0, 1}, {8, 8}, {1, 2}}, x[0], ctx);
               },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return std::vector<tensor>{
                     ops::strided_slice_backward(ops::strided_slice_op{one, {0, 1}, {8, 8}, {1, 2}}, dy, x[0], ctx)};
               }});
  c.push_back({"concat, both partial", {{8, 4}, {8, 2}}, 3u, true,
               [=](const std::vector<tensor>& x, ctx_t& ctx) { return ops::concat(ops::concat_op{two, 1}, x, ctx); },
               [=](const tensor& dy, const std::vector<tensor>& x, ctx_t& ctx) {
                 return ops::concat_backward(ops::concat_op{two, 1}, dy, x, ctx);
               }});
  return c;
}

}  // namespace

TEST_CASE("linear operators keep partial inputs partial; the resolved output and the gradients are the whole ones") {
  test_comm world = test_world();
  ctx_t ctx(world);
  for (const op_case& c : cases()) check_case(c, ctx);
}

TEST_CASE("partial sums of a contraction-split MatMul through Neg, Transpose and a MatMul, resolved at ReLU") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> ga = integer_tensor(extents{8, 16}, 1), gb = integer_tensor(extents{16, 8}, 2),
                          gw = integer_tensor(extents{8, 4}, 3);
  auto net = [&](const strategy& first, bool check_partial) {
    const tensor a = whole_of(ga, p, me), b = whole_of(gb, p, me), w = whole_of(gw, p, me);
    const tensor c = ops::matmul(ops::matmul_op{first}, a, b, ctx);
    const tensor n = ops::neg(ops::neg_op{strategy{{1, 1}}}, c, ctx);
    const tensor t = ops::transpose(ops::transpose_op{strategy{{1, 1}}, {1, 0}}, n, ctx);
    const tensor m = ops::matmul(ops::matmul_op{strategy{{1, 1}, {1, 1}}}, t, w, ctx);
    if (check_partial) {
      CHECK(c.layout().has_partial() == (p > 1));
      CHECK(n.layout().has_partial() == (p > 1));
      CHECK(t.layout().has_partial() == (p > 1));
      CHECK(m.layout().has_partial() == (p > 1));
    }
    const tensor r = ops::relu(ops::relu_op{strategy{{p, 1}}}, m, ctx);  // split rows: a ReduceScatter
    CHECK(!r.layout().has_partial());
    return gather(r, ctx);
  };
  const traffic before = ctx.total_stats();
  const xt::xarray<float> got = net(strategy{{1, p}, {p, 1}}, true);
  const traffic moved = ctx.total_stats() - before;
  // Nothing moves until ReLU: one ReduceScatter of the (8, 4) product, then the gather.
  const index_t rs = plan_redistribution(layout::replicated(mesh{p}, 2).with_partial(0),
                                         layout::replicated(mesh{p}, 2).with_split(0, axis_list{0}), extents{8, 4}, 4)
                         .bytes_per_rank();
  const index_t ag = plan_redistribution(layout::replicated(mesh{p}, 2).with_split(0, axis_list{0}),
                                         layout::replicated(mesh{p}, 2), extents{8, 4}, 4)
                         .bytes_per_rank();
  CHECK(moved.bytes == rs + ag);
  CHECK(close(got, net(strategy{{1, 1}, {1, 1}}, false)));
}
}  // namespace ops_test_linear_rule
