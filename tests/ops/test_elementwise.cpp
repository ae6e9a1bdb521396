// Sharded element-wise operators under mpiexec: for every strategy that fits the ranks,
// on 2-D and 3-D inputs with and without broadcasting ((M, N) + (1, N), (M, N) + (N,),
// (M, 1) + (1, N), (B, M, N) + (M, N), ...), the output and every input gradient equal
// the single-process kernels. Values are small integers (divisors are powers of two),
// so every result is exact and compared for equality; exp and log are compared with a
// relative tolerance of 1e-6.
#include <doctest/doctest.h>

#include "device_under_test.hpp"

#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/run.hpp>

namespace ops_test_elementwise {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<testing::test_comm>;

std::vector<std::size_t> dims_of(const extents& e) {
  return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
}

// A global tensor of small integers; `divisor` gives powers of two (+-1, 2, 4) instead.
xt::xarray<float> global_tensor(const extents& shape, int seed, bool divisor = false) {
  xt::xarray<float> x = xt::xarray<float>::from_shape(dims_of(shape));
  const std::vector<std::size_t> dims = dims_of(shape);
  for (std::size_t lin = 0; lin < x.size(); ++lin) {
    std::size_t rest = lin;
    long h = seed;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      h += long(rest % dims[d]) * (3 + 4 * d);
      rest /= dims[d];
    }
    if (divisor) {
      static const float table[6] = {1, -2, 4, -1, 2, -4};
      x.data()[lin] = table[h % 6];
    } else {
      x.data()[lin] = float(h % 11 - 5);
    }
  }
  return x;
}

// |x| + 1, element by element: inputs that log takes.
xt::xarray<float> positive(xt::xarray<float> x) {
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = std::fabs(x.data()[i]) + 1;
  return x;
}

testing::test_tensor shard_of(const xt::xarray<float>& g, const layout& l, int rank) {
  extents shape;
  shape.ndim = int(g.dimension());
  for (int d = 0; d < shape.ndim; ++d) shape.v[d] = index_t(g.shape()[d]);
  dist_tensor<float> t(l, shape, rank);
  const xt::xarray<float>* src = &g;
  t.fill_global([&](const auto& i) {
    std::size_t lin = 0;
    for (int d = 0; d < shape.ndim; ++d) lin = lin * g.shape()[d] + std::size_t(i[d]);
    return src->data()[lin];
  });
  return testing::to_test_device(t);
}

xt::xarray<float> gather(const testing::test_tensor& x, ctx_t& ctx) {
  return testing::host_shard(redistribute(x, layout::replicated(mesh{ctx.size()}, x.ndim()), ctx));
}

bool close(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  if (a.shape() != b.shape()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::fabs(x - y) > 1e-6f * std::max(1.0f, std::max(std::fabs(x), std::fabs(y)))) return false;
  }
  return true;
}

// Every split tuple for `shape` whose product divides p, each split dividing its extent.
std::vector<split_tuple> split_tuples(const extents& shape, int p) {
  std::vector<split_tuple> out;
  split_tuple cur;
  cur.n = shape.ndim;
  std::function<void(int, int)> rec = [&](int d, int prod) {
    if (d == shape.ndim) {
      out.push_back(cur);
      return;
    }
    for (int s = 1; s <= p; ++s)
      if (p % (prod * s) == 0 && shape.v[d] % s == 0) {
        cur.v[d] = s;
        rec(d + 1, prod * s);
      }
  };
  rec(0, 1);
  return out;
}

// Input `in`'s split tuple for an output split `s` of shape `out`: the output's split
// where the input has the dim unbroadcast, 1 where it broadcasts.
split_tuple input_split(const split_tuple& s, const extents& out, const extents& in) {
  split_tuple t;
  t.n = in.ndim;
  for (int d = 0; d < in.ndim; ++d) {
    const int j = d + out.ndim - in.ndim;
    t.v[d] = in.v[d] == 1 && out.v[j] != 1 ? 1 : s.v[j];
  }
  return t;
}

struct shape_case {
  extents a, b, out;
};

const std::vector<shape_case>& binary_shapes() {
  static const std::vector<shape_case> cases = {
      {extents{8, 16}, extents{8, 16}, extents{8, 16}},
      {extents{8, 16}, extents{1, 16}, extents{8, 16}},
      {extents{8, 16}, extents{16}, extents{8, 16}},
      {extents{16}, extents{8, 16}, extents{8, 16}},
      {extents{8, 1}, extents{1, 16}, extents{8, 16}},
      {extents{4, 8, 16}, extents{4, 8, 16}, extents{4, 8, 16}},
      {extents{4, 8, 16}, extents{8, 16}, extents{4, 8, 16}},
      {extents{4, 8, 16}, extents{4, 1, 16}, extents{4, 8, 16}},
      {extents{4, 1, 16}, extents{1, 8, 1}, extents{4, 8, 16}},
  };
  return cases;
}

enum class bin { add, sub, mul, div };

// The single-process forward and input gradients.
xt::xarray<float> ref_forward(bin op, const xt::xarray<float>& a, const xt::xarray<float>& b) {
  switch (op) {
    case bin::add: return k::add(a, b);
    case bin::sub: return k::sub(a, b);
    case bin::mul: return k::mul(a, b);
    default: return k::div(a, b);
  }
}
std::pair<xt::xarray<float>, xt::xarray<float>> ref_backward(bin op, const xt::xarray<float>& dy,
                                                             const xt::xarray<float>& a,
                                                             const xt::xarray<float>& b) {
  xt::xarray<float> ga, gb;
  switch (op) {
    case bin::add: ga = dy; gb = dy; break;
    case bin::sub: ga = dy; gb = k::neg(dy); break;
    case bin::mul: ga = k::mul(dy, b); gb = k::mul(dy, a); break;
    case bin::div: ga = k::div(dy, b); gb = k::neg(k::div(k::mul(dy, a), k::mul(b, b))); break;
  }
  return {k::reduce_to_shape(ga, a.shape()), k::reduce_to_shape(gb, b.shape())};
}

std::pair<testing::test_tensor, std::pair<testing::test_tensor, testing::test_tensor>> run_binary(
    bin which, const strategy& st, const testing::test_tensor& a, const testing::test_tensor& b,
    const testing::test_tensor& dy, ctx_t& ctx) {
  switch (which) {
    case bin::add: {
      const ops::add_op o{st};
      return {ops::add(o, a, b, ctx), ops::add_backward(o, dy, a, b, ctx)};
    }
    case bin::sub: {
      const ops::sub_op o{st};
      return {ops::sub(o, a, b, ctx), ops::sub_backward(o, dy, a, b, ctx)};
    }
    case bin::mul: {
      const ops::mul_op o{st};
      return {ops::mul(o, a, b, ctx), ops::mul_backward(o, dy, a, b, ctx)};
    }
    default: {
      const ops::div_op o{st};
      return {ops::div(o, a, b, ctx), ops::div_backward(o, dy, a, b, ctx)};
    }
  }
}

}  // namespace

TEST_CASE("elementwise rule: layouts of broadcasting strategies") {
  // (16, 32) + (32,) with ((2, 4), (4,)) on 16 devices: device matrix (2, 2, 4).
  constexpr elementwise_layouts r = static_elementwise_rule<strategy{{2, 4}, {4}}, 16,
                                                            shape_list{extents{16, 32}, extents{32}}>;
  static_assert(r.dev == mesh{2, 2, 4});
  static_assert(r.out == layout(mesh{2, 2, 4}, {{1}, {2}}));
  static_assert(r.in[0] == r.out);
  static_assert(r.in[1] == layout(mesh{2, 2, 4}, {{2}}));
  static_assert(r.grad[0] == r.out);
  static_assert(r.grad[1] == layout(mesh{2, 2, 4}, {{2}}).with_partial(1));
  static_assert(r.shape == extents{16, 32});
  // (8, 1) + (1, 16) with ((2, 1), (1, 4)) on 8 devices: the output splits come from
  // different inputs; each gradient is partial over the other input's axis.
  constexpr elementwise_layouts q = static_elementwise_rule<strategy{{2, 1}, {1, 4}}, 8,
                                                            shape_list{extents{8, 1}, extents{1, 16}}>;
  static_assert(q.dev == mesh{2, 4});
  static_assert(q.in[0] == layout(mesh{2, 4}, {{0}, {}}));
  static_assert(q.in[1] == layout(mesh{2, 4}, {{}, {1}}));
  static_assert(q.grad[0] == q.in[0].with_partial(1));
  static_assert(q.grad[1] == q.in[1].with_partial(0));
  CHECK(q.shape == extents{8, 16});
}

TEST_CASE("elementwise: every strategy of add, sub, mul, div with broadcasting") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (const shape_case& sc : binary_shapes()) {
    const xt::xarray<float> ga = global_tensor(sc.a, 1), gb = global_tensor(sc.b, 2, true);
    const xt::xarray<float> gdy = global_tensor(sc.out, 3);
    for (bin which : {bin::add, bin::sub, bin::mul, bin::div}) {
      const xt::xarray<float> y_ref = ref_forward(which, ga, gb);
      const auto [da_ref, db_ref] = ref_backward(which, gdy, ga, gb);
      for (const split_tuple& s : split_tuples(sc.out, p)) {
        const strategy st{input_split(s, sc.out, sc.a), input_split(s, sc.out, sc.b)};
        CAPTURE(to_string(st));
        CAPTURE(to_string(sc.a));
        CAPTURE(to_string(sc.b));
        CAPTURE(int(which));
        for (bool in_rule_layout : {true, false}) {
          const elementwise_layouts r =
              ops::add_op{st}.rule(p, shape_list{sc.a, sc.b});
          const layout la = in_rule_layout ? r.in[0] : layout::replicated(mesh{p}, sc.a.ndim);
          const layout lb = in_rule_layout ? r.in[1] : layout::replicated(mesh{p}, sc.b.ndim);
          const testing::test_tensor a = shard_of(ga, la, me), b = shard_of(gb, lb, me);
          const testing::test_tensor dy = shard_of(gdy, layout::replicated(mesh{p}, sc.out.ndim), me);
          const auto [y, grads] = run_binary(which, st, a, b, dy, ctx);
          CHECK(y.layout() == r.out);
          CHECK(gather(y, ctx) == y_ref);
          CHECK(grads.first.layout() == r.grad[0]);
          CHECK(grads.second.layout() == r.grad[1]);
          CHECK(gather(grads.first, ctx) == da_ref);
          CHECK(gather(grads.second, ctx) == db_ref);
          ++cases;
        }
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " binary strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("elementwise: Add's backward given dy hands b dy's own elements where it can, a copy to a") {
  // As the tape runs it (ops::run_backward with dy as an rvalue): where dy is laid out as
  // the output and b's shard does not broadcast, b's gradient is dy's buffer; the
  // gradients equal those of the form that copies, whatever the strategy.
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0, handed = 0;
  for (const shape_case& sc : binary_shapes()) {
    const xt::xarray<float> ga = global_tensor(sc.a, 1), gb = global_tensor(sc.b, 2);
    const xt::xarray<float> gdy = global_tensor(sc.out, 3);
    const auto [da_ref, db_ref] = ref_backward(bin::add, gdy, ga, gb);
    for (const split_tuple& s : split_tuples(sc.out, p)) {
      const strategy st{input_split(s, sc.out, sc.a), input_split(s, sc.out, sc.b)};
      const ops::add_op o{st};
      const elementwise_layouts r = o.rule(p, shape_list{sc.a, sc.b});
      CAPTURE(to_string(st));
      CAPTURE(to_string(sc.a));
      CAPTURE(to_string(sc.b));
      for (bool dy_in_output_layout : {true, false}) {
        CAPTURE(dy_in_output_layout);
        const testing::test_tensor a = shard_of(ga, r.in[0], me), b = shard_of(gb, r.in[1], me);
        const layout ldy = dy_in_output_layout ? r.out : layout::replicated(mesh{p}, sc.out.ndim);
        testing::test_tensor dy = shard_of(gdy, ldy, me);
        const testing::test_tensor y = ops::add(o, a, b, ctx);
        // b's local gradient needs no sum where b's shard has dy's shape (b the shape of the
        // output, or broadcast only along dims split so finely that each shard is 1 wide).
        const bool hands_on = same_placement(ldy, r.out) && b.local_shape() == y.local_shape();
        const float* dy_elements = dy.local().data();
        const testing::test_tensor* in[] = {&a, &b};
        ops::op_grads<float, testing::test_device> g =
            ops::run_backward(o, std::move(dy), ops::op_inputs<float, testing::test_device>(in, 2), y, ctx);
        REQUIRE(g.size() == 2);
        REQUIRE(g[0].has_value());
        REQUIRE(g[1].has_value());
        CHECK(g[0]->layout() == r.grad[0]);
        CHECK(g[1]->layout() == r.grad[1]);
        if (g[1]->local().size() > 0) {  // an empty shard has no elements to tell apart
          CAPTURE(hands_on);
          CHECK(g[0]->local().data() != dy_elements);
          CHECK((g[1]->local().data() == dy_elements) == hands_on);
        }
        CHECK(gather(*g[0], ctx) == da_ref);
        CHECK(gather(*g[1], ctx) == db_ref);
        ++cases;
        handed += hands_on && g[1]->local().size() > 0 ? 1 : 0;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " cases, " << handed << " with dy's elements handed on");
  CHECK(handed > 0);
  CHECK(handed < cases);
}

TEST_CASE("elementwise: every strategy of relu, neg, exp, log") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (const extents& shape : {extents{8, 16}, extents{4, 8, 16}}) {
    const xt::xarray<float> gx = global_tensor(shape, 5), gdy = global_tensor(shape, 6);
    const xt::xarray<float> gpos = positive(gx);  // inputs for log
    const layout flat = layout::replicated(mesh{p}, shape.ndim);
    for (const split_tuple& s : split_tuples(shape, p)) {
      const strategy st{s};
      CAPTURE(to_string(st));
      const elementwise_layouts r = ops::relu_op{st}.rule(p, shape_list{shape});
      for (bool in_rule_layout : {true, false}) {
        const layout l = in_rule_layout ? r.in[0] : flat;
        const testing::test_tensor x = shard_of(gx, l, me), pos = shard_of(gpos, l, me);
        const testing::test_tensor dy = shard_of(gdy, flat, me);
        // [relu]
        {
          const ops::relu_op op{st};
          const testing::test_tensor y = ops::relu(op, x, ctx);
          CHECK(y.layout() == r.out);
          CHECK(gather(y, ctx) == k::relu(gx));
          const testing::test_tensor dx = ops::relu_backward(op, dy, x, ctx);
          CHECK(dx.layout() == r.grad[0]);
          CHECK(gather(dx, ctx) == k::relu_grad(gdy, gx));
        }
        // [/relu]
        {
          const ops::neg_op op{st};
          CHECK(gather(ops::neg(op, x, ctx), ctx) == k::neg(gx));
          CHECK(gather(ops::neg_backward(op, dy, x, ctx), ctx) == k::neg(gdy));
        }
        {
          const ops::exp_op op{st};
          CHECK(close(gather(ops::exp(op, x, ctx), ctx), k::exp(gx)));
          CHECK(close(gather(ops::exp_backward(op, dy, x, ctx), ctx), k::mul(gdy, k::exp(gx))));
        }
        {
          const ops::log_op op{st};
          CHECK(close(gather(ops::log(op, pos, ctx), ctx), k::log(gpos)));
          CHECK(close(gather(ops::log_backward(op, dy, pos, ctx), ctx), k::div(gdy, gpos)));
        }
        ++cases;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " unary strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("elementwise: a unary operator's backward given dy writes the gradient over dy's elements") {
  // As the tape runs it (ops::run_backward with dy as an rvalue): the gradient equals the
  // copying form's, in the same layout, whatever the strategy; its buffer is dy's own
  // where dy is laid out as the output, and dy's redistributed copy's elsewhere.
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0, in_place = 0;
  for (const extents& shape : {extents{8, 16}, extents{4, 8, 16}}) {
    const xt::xarray<float> gx = global_tensor(shape, 5), gdy = global_tensor(shape, 6);
    const xt::xarray<float> gpos = positive(gx);  // inputs for log
    const layout flat = layout::replicated(mesh{p}, shape.ndim);
    for (const split_tuple& s : split_tuples(shape, p)) {
      const strategy st{s};
      CAPTURE(to_string(st));
      auto check = [&](const auto& op, const xt::xarray<float>& ginput) {
        CAPTURE(std::string(op.name()));
        const elementwise_layouts r = op.rule(p, shape_list{shape});
        const testing::test_tensor x = shard_of(ginput, r.in[0], me);
        const testing::test_tensor* in[] = {&x};
        const ops::op_inputs<float, testing::test_device> xs(in, 1);
        const testing::test_tensor y = ops::run_forward(op, xs, ctx);
        for (bool dy_in_output_layout : {true, false}) {
          CAPTURE(dy_in_output_layout);
          const layout ldy = dy_in_output_layout ? r.out : flat;
          const testing::test_tensor kept = shard_of(gdy, ldy, me);
          testing::test_tensor dy = shard_of(gdy, ldy, me);
          const float* dy_elements = dy.local().data();
          const ops::op_grads<float, testing::test_device> copied = ops::run_backward(op, kept, xs, y, ctx);
          const ops::op_grads<float, testing::test_device> given = ops::run_backward(op, std::move(dy), xs, y, ctx);
          REQUIRE(copied.size() == 1);
          REQUIRE(given.size() == 1);
          REQUIRE(copied[0].has_value());
          REQUIRE(given[0].has_value());
          CHECK(given[0]->layout() == copied[0]->layout());
          CHECK(gather(*given[0], ctx) == gather(*copied[0], ctx));
          const bool expected = same_placement(ldy, r.out);
          if (given[0]->local().size() > 0) {  // an empty shard has no elements to tell apart
            CAPTURE(expected);
            CHECK((given[0]->local().data() == dy_elements) == expected);
            CHECK(copied[0]->local().data() != kept.local().data());
            in_place += expected ? 1 : 0;
          }
          ++cases;
        }
      };
      check(ops::relu_op{st}, gx);
      check(ops::neg_op{st}, gx);
      check(ops::exp_op{st}, gx);
      check(ops::log_op{st}, gpos);
      check(ops::sigmoid_op{st}, gx);
      check(ops::tanh_op{st}, gx);
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " cases, " << in_place << " written over dy's elements");
  CHECK(in_place > 0);
  if (p > 1) CHECK(in_place < cases);  // on 1 rank every layout is the output's
}

TEST_CASE("elementwise: every strategy of bias_add; dbias is partial over the rows' axes") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (const extents& shape : {extents{8, 16}, extents{4, 8, 16}}) {
    const extents bshape{shape.v[shape.ndim - 1]};
    const xt::xarray<float> gx = global_tensor(shape, 7), gb = global_tensor(bshape, 8);
    const xt::xarray<float> gdy = global_tensor(shape, 9);
    for (const split_tuple& s : split_tuples(shape, p)) {
      const strategy st{s, split_tuple{s.v[shape.ndim - 1]}};
      CAPTURE(to_string(st));
      const ops::bias_add_op op{st};
      const elementwise_layouts r = op.rule(p, shape_list{shape, bshape});
      int rows = 1;
      for (int d = 0; d + 1 < shape.ndim; ++d) rows *= s.v[d];
      CHECK(r.grad[1].has_partial() == (rows > 1));
      for (bool in_rule_layout : {true, false}) {
        const testing::test_tensor x =
            shard_of(gx, in_rule_layout ? r.in[0] : layout::replicated(mesh{p}, shape.ndim), me);
        const testing::test_tensor b = shard_of(gb, in_rule_layout ? r.in[1] : layout::replicated(mesh{p}, 1), me);
        const testing::test_tensor dy = shard_of(gdy, layout::replicated(mesh{p}, shape.ndim), me);
        const testing::test_tensor y = ops::bias_add(op, x, b, ctx);
        CHECK(y.layout() == r.out);
        CHECK(gather(y, ctx) == k::bias_add(gx, gb));
        const auto [dx, db] = ops::bias_add_backward(op, dy, x, b, ctx);
        CHECK(dx.layout() == r.grad[0]);
        CHECK(db.layout() == r.grad[1]);
        CHECK(gather(dx, ctx) == gdy);
        CHECK(gather(db, ctx) == k::bias_add_grad_bias(gdy));
        ++cases;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " bias_add strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("elementwise: a bad strategy names the operator, the rule, the numbers and the strategy") {
  const shape_list bcast{extents{16, 32}, extents{1, 32}};
  CHECK_THROWS_WITH_AS((ops::add_op{strategy{{2, 4}, {2, 4}}}.rule(8, bcast)),
                       "add: elementwise: a broadcast dim cannot be split: input 1, dim 0 has "
                       "extent 1 and split 2; strategy ((2, 4), (2, 4))",
                       error);
  CHECK_THROWS_WITH_AS((ops::mul_op{strategy{{2, 4}, {1, 2}}}.rule(8, bcast)),
                       "mul: elementwise: inputs must split a shared dim alike: input 1 splits "
                       "output dim 1 2 ways, an earlier input 4 ways; strategy ((2, 4), (1, 2))",
                       error);
  CHECK_THROWS_WITH_AS((ops::sub_op{strategy{{2, 4}, {4}}}.rule(8, shape_list{extents{16, 32}, extents{16}})),
                       "sub: elementwise: the input shapes must broadcast: input 1, output dim 1: "
                       "extent 16, an earlier input has 32; strategy ((2, 4), (4,))",
                       error);
  CHECK_THROWS_WITH_AS((ops::add_op{strategy{{2, 1}, {1, 8}}}.rule(8, shape_list{extents{8, 1}, extents{1, 16}})),
                       "add: operator: the device matrix of a strategy must divide the device "
                       "count: device matrix size 16, device count 8; strategy ((2, 1), (1, 8))",
                       error);
  CHECK_THROWS_WITH_AS((ops::div_op{strategy{{2, 4}}}.rule(8, bcast)),
                       "div: operator: a strategy has one split tuple per operator input: 1 split "
                       "tuples for 2 inputs; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::relu_op{strategy{{2}}}.rule(8, shape_list{extents{16, 32}})),
                       "relu: operator: each split tuple has one entry per dim of its input: input 0 "
                       "has 1 entries, the input has rank 2; strategy ((2,),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::bias_add_op{strategy{{2, 4}, {4}}}.rule(8, shape_list{extents{16, 32}, extents{16}})),
                       "bias_add: bias is (16,), expected (32,) for x (16, 32)", error);
  static_assert(check_elementwise(strategy{{2, 4}, {4}}, 8, shape_list{extents{16, 32}, extents{32}}).ok());
  static_assert(check_elementwise(strategy{{2, 4}, {2}}, 8, shape_list{extents{16, 32}, extents{32}}) ==
                fail(errc::elementwise_split_mismatch, 1, 1, 2, 4));
}
}  // namespace ops_test_elementwise
