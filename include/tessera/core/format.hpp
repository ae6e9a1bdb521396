// Text forms of meshes, shapes and layouts, as plans and errors print them.
#pragma once

#include <string>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>

namespace tessera {

/// "(2, 4)"
inline std::string to_string(const mesh& m) {
  std::string s = "(";
  for (int a = 0; a < m.ndim; ++a) {
    s += a ? ", " : "";
    s += std::to_string(m.dims[a]);
  }
  return s + (m.ndim == 1 ? ",)" : ")");
}

/// "(16, 32)"
inline std::string to_string(const extents& e) {
  std::string s = "(";
  for (int d = 0; d < e.ndim; ++d) {
    s += d ? ", " : "";
    s += e.v[d] == dynamic_extent ? std::string("?") : std::to_string(e.v[d]);
  }
  return s + (e.ndim == 1 ? ",)" : ")");
}

/// A layout, one entry per tensor dim: the mesh axes splitting it ("-" if none,
/// several joined major first), then the partial axes. "[0, -] partial sum {1}"
/// is dim 0 split by mesh axis 0, dim 1 whole, partial sums over mesh axis 1;
/// "[1.0, -]" is dim 0 split by axes 1 (major) and 0.
inline std::string to_string(const layout& l) {
  std::string s = "[";
  for (int d = 0; d < l.ndim; ++d) {
    if (d) s += ", ";
    if (l.split[d].n == 0) s += "-";
    for (int i = 0; i < l.split[d].n; ++i) {
      s += i ? "." : "";
      s += std::to_string(l.split[d].v[i]);
    }
  }
  s += "]";
  if (l.has_partial()) {
    s += " partial " + std::string(to_string(l.op)) + " {";
    bool first = true;
    for (int a = 0; a < l.dev.ndim; ++a)
      if (l.is_partial(a)) {
        s += first ? "" : ", ";
        s += std::to_string(a);
        first = false;
      }
    s += "}";
  }
  return s;
}

}  // namespace tessera
