// An operator defined outside the library (docs/operators.md): Square, y = x * x,
// recorded on a tape eagerly and traced into a graph that dynamic programming
// parallelizes and the executor runs once told of it; both give the whole computation's
// values and gradients. mpiexec -n 4 operators_define
#include <cmath>
#include <string>
#include <vector>
#include <xtensor/xrandom.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/graph/execute.hpp>
using namespace tessera;

// [definition]
namespace user {

// Square: y = x * x, element by element. Its sharding is the element-wise rule's (ReLU's
// layouts and candidates); its forward and backward run Mul.
struct square_op {
  strategy st;  // MindSpore's shard(): empty until given

  static constexpr std::string_view type() { return "Square"; }  // as the IR prints it
  static constexpr std::string_view name() { return "square"; }  // instance names, errors
  static constexpr int arity = 1;

  extents output_shape(const shape_list& in) const { return in[0]; }
  status check(const strategy& s, int n, const shape_list& in) const { return check_elementwise(s, n, in); }
  op_layouts layouts(const strategy& s, int n, const shape_list& in) const { return ops::relu_op{}.layouts(s, n, in); }
  std::vector<strategy> candidates(int n, const shape_list& in) const { return ops::relu_op{}.candidates(n, in); }
  strategy data_parallel(int n, const shape_list& in) const { return ops::relu_op{}.data_parallel(n, in); }
  // Optional: the backward reads x, not y, so the graph executor frees y once the
  // forward pass is done with it (the default says every value is read).
  static constexpr bool backward_reads_output() { return false; }

  ops::mul_op mul() const { return ops::mul_op{strategy{st.in[0], st.in[0]}}; }
};
static_assert(ops::operator_definition<square_op>);

// Found by argument-dependent lookup; T the element type, D the device (host or GPU).
template <class T, class D, class C>
tensor_on<T, D> forward(const square_op& op, ops::op_inputs<T, D> x, device_context<C>& ctx) {
  return ops::mul(op.mul(), *x[0], *x[0], ctx);
}
template <class T, class D, class C>
ops::op_grads<T, D> backward(const square_op& op, const tensor_on<T, D>& dy, ops::op_inputs<T, D> x,
                             const tensor_on<T, D>& /*y*/, device_context<C>& ctx) {
  tensor_on<T, D> dx = ops::mul(op.mul(), dy, *x[0], ctx);  // dy x
  kernels::backend<D>::scale(dx.local(), T(2));             // 2 dy x
  return ops::grads_of(std::move(dx));
}
}  // namespace user
// [/definition]

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw error("operators_define: " + what);
}

bool close(const xt::xarray<float>& x, const xt::xarray<float>& y) {
  if (x.shape() != y.shape()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(x.data()[i] - y.data()[i]) > 1e-4f * (1.0f + std::abs(y.data()[i]))) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    xt::random::seed(4);  // the same whole values on every rank
    const xt::xarray<float> x0 = xt::random::randn<float>({8, 8}), w0 = xt::random::randn<float>({8, 8});

    // [use]
    context ctx(world);
    const int n = world.size(), me = world.rank();
    // Eagerly, on a tape: sum(square(x)) with x's rows split n ways, and its gradient.
    tensor_on<float> x(layout::replicated(mesh{n}, 2), {8, 8}, me, xt::xarray<float>(x0));
    auto [total, dx] = autodiff::value_and_grad(
        [&](autodiff::tape<float>&, const auto& p) {
          auto y = autodiff::apply(user::square_op{strategy{{n, 1}}}, p[0]);
          return autodiff::apply(ops::reduce_sum_op{}, y);  // no strategy: data parallel
        },
        std::vector{x}, ctx);
    // Traced: the searches price it as any operator; the executor is told how to run it.
    graph::graph_builder b;
    auto in = b.input("x", {8, 8});
    auto h = b.apply(user::square_op{}, {b.matmul(in, b.parameter("w", {8, 8}))});  // named "square"
    graph::traced_graph g = b.build(b.reduce_sum(h));
    graph::parallel_config cfg;
    cfg.mode = graph::parallel_mode::auto_parallel;
    cfg.search = graph::search_mode::dynamic_programming;
    cfg.device_num = n;
    graph::executor<float> ex(graph::parallelize(g, cfg), ctx);
    ex.add_operator<user::square_op>();
    ex.set_parameter("w", w0);
    auto r = ex.value_and_grad(ex.slice_batch({x0}));  // sum((x w)^2) and 2 x^T (x w)
    // [/use]

    // The tape: sum(x^2) and 2 x.
    const auto whole = [&](const tensor_on<float>& t) {
      return redistribute(t, layout::replicated(mesh{n}, t.ndim()), ctx).local();
    };
    const float want_sum = xt::sum(x0 * x0)();
    expect(std::abs(whole(total)() - want_sum) <= 1e-4f * want_sum, "the tape's sum of squares is wrong");
    expect(dx[0].layout() == x.layout() && close(whole(dx[0]), xt::xarray<float>(2.0f * x0)),
           "the tape's gradient is not 2 x");
    // The graph: its name and strategy, and the whole computation's loss and gradient.
    expect(h.name() == "square", "the traced operator is named " + h.name());
    expect(ex.plan().op(h.id()).source == graph::strategy_source::dynamic_programming,
           "dynamic programming did not choose Square's strategy");
    const xt::xarray<float> xw = kernels::cpu::matmul(x0, w0);
    const float want = xt::sum(xw * xw)();
    expect(std::abs(r.loss - want) <= 1e-4f * want, "the graph's loss is not sum((x w)^2)");
    expect(close(ex.gather(r.grads[0]), xt::xarray<float>(2.0f * kernels::cpu::matmul(x0, xw, true, false))),
           "the graph's gradient is not 2 x^T (x w)");
    // An executor not told of it names the call to make.
    graph::executor<float> untold(ex.plan(), ctx);
    untold.set_parameter("w", w0);
    std::string what;
    try {
      untold.value_and_grad(untold.slice_batch({x0}));
    } catch (const error& e) {
      what = e.what();
    }
    expect(what.starts_with("graph executor: Square 'square' is an operator defined outside the library (") &&
               what.ends_with("); let the executor run it with add_operator<Op>()"),
           "an executor not told of Square says: " + what);
  });
}
