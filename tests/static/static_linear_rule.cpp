// Compile-time tests of partial sums through linear operators (ops/linear_rule.hpp):
// the rule that the operators of ops/ and the graph's parallel pass both use.
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/matmul_rule.hpp>
#include <tessera/ops/reduce_rule.hpp>

namespace tessera::static_linear_rule_test {

// MatMul ((1, 4), (4, 1)) on 4 devices: C [0, 2] partial sum {1} on (1, 4, 1), whole but
// for the partial sums (axes 0 and 2 have size 1).
inline constexpr matmul_layouts mm = matmul_rule(strategy{{1, 4}, {4, 1}}, 4);
static_assert(mm.c == layout(mesh{1, 4, 1}, {{0}, {2}}).with_partial(1));

// Neg ((1, 1),) on 4 devices wants [-, -] on (4, 1, 1): the partial sums pass, on (4,).
inline constexpr layout whole = layout::replicated(mesh{4, 1, 1}, 2);
inline constexpr partial_pass neg = pass_partial(linearity::jointly(1u), &mm.c, &whole, 1, whole);
static_assert(neg.passes() && neg.dev == mesh{4} && neg.slots == 1u);
static_assert(neg.input(whole, 0) == layout::replicated(mesh{4}, 2).with_partial(0));
static_assert(neg.output(whole) == layout::replicated(mesh{4}, 2).with_partial(0));
static_assert(neg.input_grad(whole, 0) == layout::replicated(mesh{4}, 2));  // the gradient of the sum
static_assert(neg.output_grad(whole) == layout::replicated(mesh{4}, 2));

// A rule that splits the partial axis resolves them (ReLU (4, 1) wants the rows split).
inline constexpr layout rows = layout(mesh{4, 1}, {{0}, {}});
static_assert(!pass_partial(linearity::jointly(1u), &mm.c, &rows, 1, rows).passes());
// Not linear: nothing passes.
static_assert(!pass_partial(linearity{}, &mm.c, &whole, 1, whole).passes());
// A partial max is not a sum.
inline constexpr layout maxima = layout(mesh{1, 4, 1}, {{}, {}}).with_partial(1, reduce_op::max);
static_assert(!pass_partial(linearity::jointly(1u), &maxima, &whole, 1, whole).passes());

// Mul: the other factor must hold replicas on the partial axes.
inline constexpr layout two[2] = {mm.c, layout::replicated(mesh{4, 1, 1}, 2)};
inline constexpr layout wants_split[2] = {whole, layout(mesh{4, 1, 1}, {{0}, {}})};
static_assert(!pass_partial(linearity::each(2), two, wants_split, 2, whole).passes());
inline constexpr layout wants_whole[2] = {whole, whole};
static_assert(pass_partial(linearity::each(2), two, wants_whole, 2, whole).slots == 1u);
// Add: both summands partial, or nothing passes.
static_assert(!pass_partial(linearity::all(2), two, wants_whole, 2, whole).passes());
inline constexpr layout both[2] = {mm.c, mm.c};
static_assert(pass_partial(linearity::all(2), both, wants_whole, 2, whole).slots == 3u);

// MatMul ((1, 1), (1, 1)) given that partial A: C partial over the same ranks, dB too.
inline constexpr matmul_layouts mm2 = pass_product(matmul_rule(strategy{{1, 1}, {1, 1}}, 4), mm.c,
                                                   layout::replicated(mesh{4, 1, 1, 1}, 2));
static_assert(mm2.dev == mesh{4});
static_assert(mm2.c == layout::replicated(mesh{4}, 2).with_partial(0));
static_assert(mm2.grad_b == layout::replicated(mesh{4}, 2).with_partial(0));
static_assert(!mm2.grad_a.has_partial());

// ReduceSum ((1, 1),) of it: partial; ReduceMax: not linear.
inline constexpr reduce_layouts rs = reduce_rule(strategy{{1, 1}}, 4, extents{8, 8}, dim_list{1}, false, reduce_op::sum);
static_assert(pass_unary(rs, mm.c, reduction_linearity(reduce_op::sum)).out.has_partial());
static_assert(!pass_unary(rs, mm.c, reduction_linearity(reduce_op::max)).out.has_partial());

}  // namespace tessera::static_linear_rule_test
