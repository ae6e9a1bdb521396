// Sharded operators (docs/operators.md): MatMul with its contraction dim split over the
// ranks on whole inputs, its partial output kept partial through Neg and resolved by one
// ReduceScatter at ReLU, checked against the whole product; the rule's layouts and its
// errors. mpiexec -n 4 operators
#include <cmath>
#include <string>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/shape.hpp>

#include "error_text.hpp"
using namespace tessera;

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw error("operators: " + what);
}

// The rule's compile-time form and the common refinement of two device matrices.
constexpr const matmul_layouts& seed = static_matmul_rule<strategy{{2, 4}, {4, 1}}, 8>;
static_assert(seed.dev == mesh{2, 4, 1});
static_assert(seed.c.is_partial(1) && seed.grad_b.is_partial(0));  // (m, k, n): C over k, dB over m
constexpr const matmul_layouts& cube = static_matmul_rule<strategy{{2, 2}, {2, 2}}, 8>;
static_assert(cube.grad_a.is_partial(2) && cube.grad_b.is_partial(0));  // dA over n, dB over m
static_assert(common_refinement(mesh{2, 4}, mesh{4, 2}) == mesh{2, 2, 2});

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    xt::random::seed(3);  // the same whole values on every rank
    const xt::xarray<float> ga = xt::random::randn<float>({16, 32}), gb = xt::random::randn<float>({32, 8});

    // [sharded]
    context ctx(world);
    const int n = world.size(), me = world.rank();
    const layout whole = layout::replicated(mesh{n}, 2);               // every rank holds all of it
    tensor_on<float> a(whole, {16, 32}, me, xt::xarray<float>(ga));  // ga, gb: whole values
    tensor_on<float> b(whole, {32, 8}, me, xt::xarray<float>(gb));

    const ops::matmul_op mm{strategy{{1, n}, {n, 1}}};                 // MatMul().shard(((1, n), (n, 1)))
    const matmul_layouts r = mm.rule(n);                               // device matrix (1, n, 1)
    tensor_on<float> c = ops::matmul(mm, a, b, ctx);                   // a, b cut to r.a, r.b: nothing sent
    // c.layout() == r.c: (16, 8) on every rank, partial sums over the contraction axis
    tensor_on<float> y = ops::neg(ops::neg_op{strategy{{1, 1}}}, c, ctx);    // linear: stays partial
    tensor_on<float> z = ops::relu(ops::relu_op{strategy{{n, 1}}}, y, ctx);  // one ReduceScatter
    // z: this rank's 16 / n rows of relu(-(ga gb))
    // [/sharded]

    expect(r.dev == mesh{1, n, 1}, "the device matrix is " + to_string(r.dev));
    expect(a.local_shape() == extents{16, 32} && local_shape(r.a, extents{16, 32}) == extents{16, 32 / n},
           "A's shard under the rule is not (16, 32 / n)");
    expect(c.layout() == r.c && c.local_shape() == extents{16, 8} && r.c.is_partial(1) == (n > 1),
           "MatMul's output is not (16, 8) partial over the contraction axis");
    expect(y.layout().has_partial() == (n > 1), "Neg resolved its partial input");
    expect(!z.layout().has_partial() && z.local_shape() == extents{16 / n, 8}, "ReLU's output is not 16 / n rows");
    // What moved: only the ReduceScatter of the (16, 8) floats, each rank receiving
    // (n - 1) / n of them.
    const traffic moved = ctx.total_stats();
    expect(moved.bytes == (n - 1) * 16 * 8 * 4 / n, "the ranks received " + std::to_string(moved.bytes) + " bytes");
    // Against the whole product on one process.
    const xt::xarray<float> want = xt::maximum(-kernels::cpu::matmul(ga, gb), 0.0f);
    const xt::xarray<float> mine = xt::view(want, xt::range(me * 16 / n, (me + 1) * 16 / n), xt::all());
    for (std::size_t i = 0; i < mine.size(); ++i)
      expect(std::abs(z.local().data()[i] - mine.data()[i]) <= 1e-4f * (1 + std::abs(mine.data()[i])),
             "ReLU(Neg(MatMul)) is not the whole computation's rows");

    // The errors the page quotes.
    const std::string bad = tessera::testing::error_of([] { (void)ops::matmul_op{strategy{{2, 4}, {2, 1}}}.rule(8); });
    expect(bad == "matmul: both inputs must split the contraction dim into the same number of pieces: input 0 "
                  "splits it 4 ways, input 1 2 ways; strategy ((2, 4), (2, 1))",
           "a bad MatMul strategy gives: " + bad);
    const std::string reshape =
        tessera::testing::error_of([] { (void)ops::reshape_op{strategy{{2, 1}}, extents{12, 8}}.rule(2, extents{16, 8}); });
    expect(reshape == "reshape: the target shape must have the input's number of elements: the input has 128 "
                      "elements, the target 96; strategy ((2, 1),)",
           "a bad Reshape gives: " + reshape);
  });
}
