// Strategy files (MindSpore's strategy_ckpt_save_file / strategy_ckpt_load_file): each
// operator's shard strategy and each parameter's layout, as JSON, validated on load.
#pragma once

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/io/atomic_file.hpp>
#include <tessera/io/json.hpp>
#include <tessera/io/layout_text.hpp>

namespace tessera::io {

/// A parameter's global shape and its layout (on its own mesh).
struct parameter_layout {
  extents shape;
  layout placement;
  friend bool operator==(const parameter_layout&, const parameter_layout&) = default;
};

/// What a strategy file holds: the device count, each operator's shard strategy and
/// each parameter's layout.
struct strategy_map {
  int device_num = 1;
  std::map<std::string, strategy> operators;
  std::map<std::string, parameter_layout> parameters;
  friend bool operator==(const strategy_map&, const strategy_map&) = default;
};

inline constexpr std::string_view strategy_file_format = "tessera.strategy";
inline constexpr int strategy_file_version = 1;

/// The JSON form of a strategy map:
///
///     {
///       "format": "tessera.strategy",
///       "version": 1,
///       "device_num": 8,
///       "operators": {
///         "fc1.matmul": [[2, 4], [4, 1]]
///       },
///       "parameters": {
///         "fc1.weight": {"shape": [32, 16], "mesh": [2, 4, 1], "layout": "[1, 2]"}
///       }
///     }
///
/// A strategy is MindSpore's shard tuple as nested arrays; a layout is the text
/// to_string(layout) prints (parse_layout reads it) on the mesh "mesh" gives.
inline json::value to_json(const strategy_map& s) {
  json::value ops = json::value::object();
  for (const auto& [name, st] : s.operators) {
    json::value inputs = json::value::array();
    for (int i = 0; i < st.n; ++i) {
      json::value t = json::value::array();
      for (int d = 0; d < st.in[i].n; ++d) t.push_back(st.in[i].v[d]);
      inputs.push_back(std::move(t));
    }
    ops.append_new(name, std::move(inputs));
  }
  json::value params = json::value::object();
  for (const auto& [name, p] : s.parameters) {
    json::value shape = json::value::array(), dev = json::value::array();
    for (int d = 0; d < p.shape.ndim; ++d) shape.push_back(static_cast<long long>(p.shape.v[d]));
    for (int a = 0; a < p.placement.dev.ndim; ++a) dev.push_back(p.placement.dev.dims[a]);
    params.append_new(name, json::value::object_of({{"shape", std::move(shape)},
                                             {"mesh", std::move(dev)},
                                             {"layout", json::value(to_string(p.placement))}}));
  }
  return json::value::object_of({{"format", json::value(strategy_file_format)},
                                 {"version", json::value(strategy_file_version)},
                                 {"device_num", json::value(s.device_num)},
                                 {"operators", std::move(ops)},
                                 {"parameters", std::move(params)}});
}

namespace detail {

class strategy_reader {
 public:
  explicit strategy_reader(std::string context) : ctx_(std::move(context)) {}

  strategy_map read(const json::value& v) {
    strategy_map out;
    if (!v.is_object()) fail("the file", "must be a JSON object, found " + std::string(json::to_string(v.type())));
    only_keys(v, "the file", {"format", "version", "device_num", "operators", "parameters"});
    const json::value& format = need(v, "format", "the file");
    if (!format.is_string() || format.as_string() != strategy_file_format)
      fail("\"format\"", "must be \"" + std::string(strategy_file_format) + "\"");
    const json::value& version = need(v, "version", "the file");
    if (!version.is_integer() || version.as_integer() != strategy_file_version)
      fail("\"version\"", "is " + json::dump(version) + ", this tessera reads version " +
                              std::to_string(strategy_file_version));
    const json::value& dn = need(v, "device_num", "the file");
    if (!dn.is_integer() || dn.as_integer() < 1 || dn.as_integer() > (1 << 24))
      fail("\"device_num\"", "must be a positive integer, found " + json::dump(dn));
    out.device_num = int(dn.as_integer());

    const json::value& ops = need(v, "operators", "the file");
    if (!ops.is_object()) fail("\"operators\"", "must be an object (operator name -> strategy)");
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const std::string where = "operators.\"" + ops.keys()[i] + "\"";
      out.operators.emplace(ops.keys()[i], read_strategy(ops.member(i), out.device_num, where));
    }
    const json::value& params = need(v, "parameters", "the file");
    if (!params.is_object()) fail("\"parameters\"", "must be an object (parameter name -> layout)");
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string where = "parameters.\"" + params.keys()[i] + "\"";
      out.parameters.emplace(params.keys()[i], read_parameter(params.member(i), out.device_num, where));
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw error(ctx_ + ": " + where + " " + what);
  }
  const json::value& need(const json::value& obj, std::string_view key, const std::string& where) const {
    if (const json::value* x = obj.find(key)) return *x;
    fail(where, "lacks \"" + std::string(key) + "\"");
  }
  void only_keys(const json::value& obj, const std::string& where, std::initializer_list<std::string_view> keys) const {
    for (const std::string& k : obj.keys()) {
      bool known = false;
      for (std::string_view x : keys) known = known || k == x;
      if (!known) fail(where, "has an unknown key \"" + k + "\"");
    }
  }
  std::int64_t int_in(const json::value& x, std::int64_t lo, std::int64_t hi, const std::string& where) const {
    if (!x.is_integer() || x.as_integer() < lo || x.as_integer() > hi)
      fail(where, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found " + json::dump(x));
    return x.as_integer();
  }

  strategy read_strategy(const json::value& v, int device_num, const std::string& where) const {
    if (!v.is_array()) fail(where, "must be an array of split tuples such as [[2, 4], [4, 1]]");
    if (v.size() > std::size_t(max_strategy_inputs))
      fail(where, "has " + std::to_string(v.size()) + " inputs, at most " + std::to_string(max_strategy_inputs));
    strategy st;
    st.n = int(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const json::value& t = v[i];
      const std::string wi = where + "[" + std::to_string(i) + "]";
      if (!t.is_array()) fail(wi, "must be an array of splits such as [2, 4]");
      if (t.size() > std::size_t(max_tensor_ndim))
        fail(wi, "has " + std::to_string(t.size()) + " dims, at most " + std::to_string(max_tensor_ndim));
      st.in[i].n = int(t.size());
      for (std::size_t d = 0; d < t.size(); ++d)
        st.in[i].v[d] = int(int_in(t[d], 1, 1 << 24, wi + "[" + std::to_string(d) + "]"));
    }
    if (status s = check(st, device_num); !s.ok())
      throw error(s, ctx_ + ": " + where, "strategy " + to_string(st) + ", device_num " + std::to_string(device_num));
    return st;
  }

  parameter_layout read_parameter(const json::value& v, int device_num, const std::string& where) const {
    if (!v.is_object()) fail(where, "must be an object with \"shape\", \"mesh\" and \"layout\"");
    only_keys(v, where, {"shape", "mesh", "layout"});
    const json::value& shape = need(v, "shape", where);
    const json::value& dev = need(v, "mesh", where);
    const json::value& text = need(v, "layout", where);
    parameter_layout p;
    if (!shape.is_array() || shape.size() > std::size_t(max_tensor_ndim))
      fail(where + ".shape", "must be an array of at most " + std::to_string(max_tensor_ndim) + " extents");
    p.shape.ndim = int(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d)
      p.shape.v[d] = int_in(shape[d], 0, std::int64_t(1) << 62, where + ".shape[" + std::to_string(d) + "]");
    if (!dev.is_array() || dev.size() < 1 || dev.size() > std::size_t(max_mesh_ndim))
      fail(where + ".mesh", "must be an array of 1 to " + std::to_string(max_mesh_ndim) + " axis sizes");
    mesh m;
    m.ndim = int(dev.size());
    for (std::size_t a = 0; a < dev.size(); ++a)
      m.dims[a] = int(int_in(dev[a], 1, 1 << 24, where + ".mesh[" + std::to_string(a) + "]"));
    if (status s = check_mesh_size(m, device_num); !s.ok())
      throw error(s, ctx_ + ": " + where + ".mesh", "mesh " + to_string(m) + ", device_num " + std::to_string(device_num));
    if (!text.is_string()) fail(where + ".layout", "must be a string such as \"[0, -]\"");
    try {
      p.placement = parse_layout(m, text.as_string());
    } catch (const error& e) {
      throw error(ctx_ + ": " + where + ".layout: " + e.what());
    }
    if (status s = check(p.placement, p.shape); !s.ok())
      throw error(s, ctx_ + ": " + where, "layout " + text.as_string() + " on mesh " + to_string(m) + ", shape " + to_string(p.shape));
    return p;
  }

  std::string ctx_;
};

}  // namespace detail

/// Reads a strategy map from its JSON form, with every field validated: the format
/// and version, device_num, each strategy against device_num (check(strategy)), each
/// mesh's size against device_num, each layout text on its mesh and against its
/// shape (check(layout, shape)). Unknown keys are errors. Messages start with
/// `context` and name the field: `train_strategy.json: operators."fc1.matmul":
/// strategy: the product of an input's splits must divide the device count: ...`.
inline strategy_map strategy_map_from_json(const json::value& v, std::string_view context = "strategy file") {
  return detail::strategy_reader(std::string(context)).read(v);
}

/// Writes a strategy file (the JSON form, indented), atomically. The map is validated
/// as load would, so a file that saves also loads.
inline void save_strategy_file(const std::filesystem::path& file, const strategy_map& s) {
  const json::value v = to_json(s);
  (void)strategy_map_from_json(v, "save_strategy_file: " + file.string());
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  write_file_atomically(file, json::dump(v, 2) + "\n");
}

/// Reads and validates a strategy file (strategy_map_from_json).
inline strategy_map load_strategy_file(const std::filesystem::path& file) {
  const std::string ctx = "load_strategy_file: " + file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw error(ctx + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw error(ctx + ": reading the file failed");
  return strategy_map_from_json(json::parse(text.str(), ctx), ctx);
}

}  // namespace tessera::io
