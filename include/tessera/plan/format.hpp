// A plan in readable form: its steps, mesh axes, rank groups and bytes per rank.
#pragma once

#include <string>
#include <tessera/core/format.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/plan/planner.hpp>

namespace tessera {

/// The groups of ranks over `axes`, e.g. "{0,1,2,3} {4,5,6,7}"; after `max_groups`
/// groups the rest is summarised.
inline std::string format_groups(const mesh& m, const axis_list& axes, int max_groups = 8) {
  std::string s;
  const int g = group_size(m, axes), ngroups = m.size() / g;
  int shown = 0;
  for (int r = 0; r < m.size() && shown < max_groups; ++r) {
    if (group_index(m, axes, r) != 0) continue;  // r leads its group
    s += (shown ? " {" : "{");
    for (int i = 0; i < g; ++i) {
      s += i ? "," : "";
      s += std::to_string(group_member(m, axes, r, i));
    }
    s += "}";
    ++shown;
  }
  if (ngroups > shown) s += " ... (" + std::to_string(ngroups) + " groups)";
  return s;
}

/// Example:
///   redistribute (16, 16) on mesh (2, 4), 4-byte elements: [0, -] partial sum {1} -> [0, 1]
///     1. reduce_scatter sum  mesh axis 1, dim 1   groups {0,1,2,3} {4,5,6,7}   96 bytes/rank -> [0, 1]
///   total: 96 bytes per rank
inline std::string to_string(const plan& p) {
  std::string s = "redistribute " + to_string(p.global) + " on mesh " + to_string(p.from.dev) +
                  ", " + std::to_string(p.elem_bytes) + "-byte elements: " + to_string(p.from) +
                  " -> " + to_string(p.to) + "\n";
  if (p.empty()) s += "  (nothing to do)\n";
  for (int i = 0; i < p.n; ++i) {
    const plan_step& st = p.steps[i];
    std::string line = "  " + std::to_string(i + 1) + ". " + std::string(to_string(st.kind));
    const bool reduces = st.kind == step_kind::all_reduce || st.kind == step_kind::reduce_scatter;
    if (reduces) line += " " + std::string(to_string(st.op));
    if (st.kind == step_kind::exchange) {
      line += "  point to point over the mesh";
    } else {
      line += "  mesh axis " + std::to_string(st.axis);
      if (st.kind == step_kind::all_to_all)
        line += ", dim " + std::to_string(st.dim) + " -> dim " + std::to_string(st.dim2);
      else if (st.dim >= 0)
        line += ", dim " + std::to_string(st.dim);
      line += "  groups " + format_groups(p.from.dev, axis_list{st.axis}, 4);
    }
    line += "  " + std::to_string(st.bytes) + " bytes/rank -> " + to_string(st.after) + "\n";
    s += line;
  }
  s += "  total: " + std::to_string(p.bytes_per_rank()) + " bytes per rank\n";
  return s;
}

}  // namespace tessera
