// Tracing a module network with its loss into a graph (MindSpore's graph compilation):
// the same modules that run eagerly give, called on graph values, the network's
// operators with their strategies, named after the module tree, and its parameters by
// their dotted names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/core/extents.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/nn/module.hpp>

namespace tessera::nn {

namespace detail {
// Every module of the tree under `m` that sets a pipeline stage, with its dotted name.
template <class T, class D>
void staged_modules(module<T, D>& m, std::vector<std::pair<std::string, int>>& out) {
  if (m.pipeline_stage() >= 0) out.emplace_back(m.full_name(), m.pipeline_stage());
  visit_with<T, D>(m, [](std::string_view, parameter<T, D>&) {}, [&](std::string_view, module<T, D>& c) { staged_modules(c, out); });
}
}  // namespace detail

/// A network and its loss as a graph: the graph (inputs "input" and "label", in that
/// order), and the node of the network's output (its logits).
struct traced_network {
  graph::traced_graph graph;
  int output = -1;
};

/// Traces `net` and `loss_fn` for a global batch: the network's input of shape `input`,
/// the labels of shape `label` ((batch,) class indices for a cross entropy, the
/// output's shape for a regression). The modules are named first (as build() names
/// them, under `seed`), so the traced operators and parameters carry their dotted
/// names: "dense_relu_sequential.0.matmul", "dense_relu_sequential.0.weight".
///
///     nn::traced_network t = nn::trace(net, loss_fn, extents{64, 1, 28, 28}, extents{64});
///     graph::parallel_graph pg = graph::parallelize(t.graph, cfg);
///
/// The modules' pipeline stages (module::set_pipeline_stage) go to their operators: an
/// operator is on the stage of the innermost module around it that sets one (by the
/// dotted names); the others, the loss's included, follow their inputs.
template <class Net, class Loss>
traced_network trace(Net& net, Loss& loss_fn, const extents& input, const extents& label, std::uint64_t seed = 0) {
  net.name_all(seed);
  loss_fn.name_all(seed);
  graph::graph_builder b;
  const graph::value x = b.input("input", input);
  const graph::value y = b.input("label", label);
  const int first = b.current().size();
  const graph::value out = net(x);
  std::vector<std::pair<std::string, int>> staged;  // (module name, stage)
  detail::staged_modules(static_cast<module<typename Net::value_type, typename Net::device_type>&>(net), staged);
  if (!staged.empty())
    for (int id = first; id < b.current().size(); ++id) {
      const graph::node& n = b.current().at(id);
      if (n.kind != graph::node_kind::op) continue;
      std::size_t best = 0;
      int stage = -1;
      for (const auto& [name, k] : staged) {
        const bool inside = name.empty() || n.name.starts_with(name + ".");
        if (inside && (stage < 0 || name.size() >= best)) {
          best = name.size();
          stage = k;
        }
      }
      if (stage >= 0) b.value_of(id).pipeline_stage(stage);
    }
  traced_network t;
  t.graph = b.build(loss_fn(out, y));
  t.output = out.id();
  return t;
}

}  // namespace tessera::nn
