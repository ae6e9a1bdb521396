// Tracing a module network with its loss into a graph (MindSpore's graph compilation):
// the same modules that run eagerly give, called on graph values, the network's
// operators with their strategies, named after the module tree, and its parameters by
// their dotted names.
#pragma once

#include <cstdint>
#include <string>
#include <tessera/core/extents.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/nn/module.hpp>

namespace tessera::nn {

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
template <class Net, class Loss>
traced_network trace(Net& net, Loss& loss_fn, const extents& input, const extents& label, std::uint64_t seed = 0) {
  net.name_all(seed);
  loss_fn.name_all(seed);
  graph::graph_builder b;
  const graph::value x = b.input("input", input);
  const graph::value y = b.input("label", label);
  const graph::value out = net(x);
  traced_network t;
  t.graph = b.build(loss_fn(out, y));
  t.output = out.id();
  return t;
}

}  // namespace tessera::nn
