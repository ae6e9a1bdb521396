// Shared by the optimizer tests: parameters built on one rank with known values, and
// gradients in their layouts.
#pragma once

#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/nn/module.hpp>

namespace optim_test {

using namespace tessera;

/// A parameter of the given values, built on one rank.
inline nn::parameter<double> param(const std::string& name, std::vector<double> v) {
  nn::parameter<double> p(extents{index_t(v.size())}, nn::initializer::values(v));
  p.set_name(name);
  p.build(layout::replicated(mesh{1}, 1), 0, 0);
  return p;
}

/// A gradient for `p` holding `v`.
inline dist_tensor<double> grad(const nn::parameter<double>& p, const std::vector<double>& v) {
  dist_tensor<double> g(p.layout(), p.shape(), 0);
  for (std::size_t i = 0; i < v.size(); ++i) g.data()[i] = v[i];
  return g;
}

inline std::vector<double> values(const nn::parameter<double>& p) {
  return std::vector<double>(p.data().data().begin(), p.data().data().end());
}

}  // namespace optim_test
