// Strategy files (MindSpore's strategy_ckpt_save_file / strategy_ckpt_load_file): each
// operator's shard strategy and each parameter's layout, as JSON, validated on load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
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
inline json::ordered_value to_json(const strategy_map& s) {
  using ordered = json::ordered_value;
  ordered ops = ordered::object();
  for (const auto& [name, st] : s.operators) {
    ordered inputs = ordered::array();
    for (int i = 0; i < st.n; ++i) {
      ordered t = ordered::array();
      for (int d = 0; d < st.in[i].n; ++d) t.push_back(st.in[i].v[d]);
      inputs.push_back(std::move(t));
    }
    json::append_new(ops, name, std::move(inputs));
  }
  ordered params = ordered::object();
  for (const auto& [name, p] : s.parameters) {
    ordered shape = ordered::array(), dev = ordered::array();
    for (int d = 0; d < p.shape.ndim; ++d) shape.push_back(std::int64_t(p.shape.v[d]));
    for (int a = 0; a < p.placement.dev.ndim; ++a) dev.push_back(p.placement.dev.dims[a]);
    ordered entry = ordered::object();
    json::append_new(entry, "shape", std::move(shape));
    json::append_new(entry, "mesh", std::move(dev));
    json::append_new(entry, "layout", to_string(p.placement));
    json::append_new(params, name, std::move(entry));
  }
  ordered file = ordered::object();
  json::append_new(file, "format", std::string(strategy_file_format));
  json::append_new(file, "version", strategy_file_version);
  json::append_new(file, "device_num", s.device_num);
  json::append_new(file, "operators", std::move(ops));
  json::append_new(file, "parameters", std::move(params));
  return file;
}

namespace detail {

class strategy_reader {
 public:
  explicit strategy_reader(std::string context) : ctx_(std::move(context)) {}

  strategy_map read(const json::value& v) {
    strategy_map out;
    if (!v.is_object()) fail("the file", "must be a JSON object, found " + std::string(json::kind_name(v)));
    only_keys(v, "the file", {"format", "version", "device_num", "operators", "parameters"});
    const json::value& format = need(v, "format", "the file");
    if (!format.is_string() || format.get_ref<const std::string&>() != strategy_file_format)
      fail("\"format\"", "must be \"" + std::string(strategy_file_format) + "\"");
    const json::value& version = need(v, "version", "the file");
    if (json::to_int64(version) != strategy_file_version)
      fail("\"version\"", "is " + json::dump(version) + ", this tessera reads version " +
                              std::to_string(strategy_file_version));
    const json::value& dn = need(v, "device_num", "the file");
    const std::optional<std::int64_t> device_num = json::to_int64(dn);
    if (!device_num || *device_num < 1 || *device_num > (1 << 24))
      fail("\"device_num\"", "must be a positive integer, found " + json::dump(dn));
    out.device_num = int(*device_num);

    const json::value& ops = need(v, "operators", "the file");
    if (!ops.is_object()) fail("\"operators\"", "must be an object (operator name -> strategy)");
    for (const auto& [name, st] : members(ops))
      out.operators.emplace(name, read_strategy(st, out.device_num, "operators.\"" + name + "\""));
    const json::value& params = need(v, "parameters", "the file");
    if (!params.is_object()) fail("\"parameters\"", "must be an object (parameter name -> layout)");
    for (const auto& [name, p] : members(params))
      out.parameters.emplace(name, read_parameter(p, out.device_num, "parameters.\"" + name + "\""));
    return out;
  }

 private:
  static const json::value::object_t& members(const json::value& obj) {
    return obj.get_ref<const json::value::object_t&>();
  }
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw error(ctx_ + ": " + where + " " + what);
  }
  const json::value& need(const json::value& obj, const std::string& key, const std::string& where) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail(where, "lacks \"" + key + "\"");
    return *it;
  }
  void only_keys(const json::value& obj, const std::string& where, std::initializer_list<std::string_view> keys) const {
    for (const auto& [k, x] : members(obj)) {
      bool known = false;
      for (std::string_view key : keys) known = known || k == key;
      if (!known) fail(where, "has an unknown key \"" + k + "\"");
    }
  }
  std::int64_t int_in(const json::value& x, std::int64_t lo, std::int64_t hi, const std::string& where) const {
    const std::optional<std::int64_t> i = json::to_int64(x);
    if (!i || *i < lo || *i > hi)
      fail(where, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found " + json::dump(x));
    return *i;
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
    const std::string& layout_text = text.get_ref<const std::string&>();
    try {
      p.placement = parse_layout(m, layout_text);
    } catch (const error& e) {
      throw error(ctx_ + ": " + where + ".layout: " + e.what());
    }
    if (status s = check(p.placement, p.shape); !s.ok())
      throw error(s, ctx_ + ": " + where, "layout " + layout_text + " on mesh " + to_string(m) + ", shape " + to_string(p.shape));
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
  const std::string ctx = "save_strategy_file: " + file.string();
  const json::ordered_value v = to_json(s);
  (void)strategy_map_from_json(json::value(v), ctx);
  std::string text;
  try {
    text = json::dump(v, 2) + "\n";
  } catch (const error& e) {
    throw error(ctx + ": " + e.what());
  }
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  write_file_atomically(file, text);
}

/// Reads and validates a strategy file (strict JSON: json::parse; then
/// strategy_map_from_json).
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
