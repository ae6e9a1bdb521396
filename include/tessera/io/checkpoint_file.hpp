// Checkpoint files: the metadata that records where each tensor lies (mesh, layout,
// global shape, shard offset), loading a file into named host tensors, and checking
// named tensors against what a network expects.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/io/layout_text.hpp>
#include <tessera/io/safetensors.hpp>

namespace tessera::io {

// ---- the metadata schema ----------------------------------------------------------
//
// A tessera checkpoint is a safetensors file whose "__metadata__" holds, besides any
// keys the caller adds:
//
//   "tessera.format"  "1"                       the version of this schema
//   "tessera.kind"    "whole" | "shard"         whole tensors, or one rank's shards
//   "tessera.rank"    "3"                       shard files: the rank that wrote it
//   "tessera.ranks"   "8"                       shard files: how many ranks wrote shards
//
// and for each tensor NAME (the key is the field, a colon, then the name):
//
//   "mesh:NAME"      "(2, 4)"                   device matrix (core/format.hpp's to_string)
//   "layout:NAME"    "[0, -] partial sum {1}"   layout on that mesh (parse_layout reads it)
//   "shape:NAME"     "(16, 32)"                 global shape
//   "split:NAME"     "(2, 1)"                   pieces per dim (MindSpore's strategy of the tensor)
//   "offset:NAME"    "(8, 0)"                   shard files: where this shard starts
//
// In a whole file the tensor itself is the global tensor; its mesh and layout say how
// it was distributed when saved. In a shard file the tensor is this rank's shard:
// shape == local_shape(layout, global) and offset == local_offset(layout, global, rank).

inline constexpr std::string_view checkpoint_format_version = "1";

/// Whether a file holds whole tensors or one rank's shards.
enum class checkpoint_kind { whole, shard };

/// How one tensor was distributed when saved.
struct tensor_placement {
  layout placement;   ///< layout on its mesh (placement.dev)
  extents global;     ///< the global shape
  extents offset;     ///< shard files: where this shard starts in the global tensor
  bool has_offset = false;
};

namespace detail {
inline std::string meta_key(std::string_view field, std::string_view name) {
  return std::string(field) + ":" + std::string(name);
}
}  // namespace detail

/// Records `p` for tensor `name` in `metadata` (the keys above).
inline void write_placement(std::map<std::string, std::string>& metadata, std::string_view name,
                            const tensor_placement& p) {
  metadata[detail::meta_key("mesh", name)] = to_string(p.placement.dev);
  metadata[detail::meta_key("layout", name)] = to_string(p.placement);
  metadata[detail::meta_key("shape", name)] = to_string(p.global);
  metadata[detail::meta_key("split", name)] = to_string(to_split_tuple(p.placement));
  if (p.has_offset) metadata[detail::meta_key("offset", name)] = to_string(p.offset);
}

/// Reads tensor `name`'s placement from `metadata`; nullopt when the file records
/// none (a file not written by tessera). A recorded placement is validated: every
/// field parses, the layout fits the global shape (check(layout, shape)), the split
/// tuple agrees with the layout, and the offset has the shape's rank. Errors start
/// with `context` (the file).
inline std::optional<tensor_placement> read_placement(const std::map<std::string, std::string>& metadata,
                                                      std::string_view name, std::string_view context) {
  auto get = [&](std::string_view field) -> const std::string* {
    auto it = metadata.find(detail::meta_key(field, name));
    return it == metadata.end() ? nullptr : &it->second;
  };
  const std::string* mesh_text = get("mesh");
  const std::string* layout_text = get("layout");
  const std::string* shape_text = get("shape");
  if (!mesh_text && !layout_text && !shape_text) return std::nullopt;
  const std::string where = std::string(context) + ": tensor '" + std::string(name) + "'";
  if (!mesh_text || !layout_text || !shape_text)
    throw error(where + ": the metadata records only part of the placement (\"mesh:\", \"layout:\" and \"shape:\" go together)");
  tensor_placement p;
  try {
    p.placement = parse_layout(parse_mesh(*mesh_text), *layout_text);
    p.global = parse_extents(*shape_text);
    if (const std::string* off = get("offset")) {
      p.offset = parse_extents(*off);
      p.has_offset = true;
    }
  } catch (const error& e) {
    throw error(where + ": " + e.what());
  }
  if (!p.global.is_static()) throw error(where + ": the global shape " + *shape_text + " has an unknown extent");
  if (status s = check(p.placement, p.global); !s.ok())
    throw error(s, where, "layout " + *layout_text + " on mesh " + *mesh_text + ", shape " + *shape_text);
  if (p.has_offset && p.offset.ndim != p.global.ndim)
    throw error(where + ": offset " + to_string(p.offset) + " has rank " + std::to_string(p.offset.ndim) +
                ", the shape " + std::to_string(p.global.ndim));
  if (const std::string* split = get("split")) {
    split_tuple st;
    try {
      st = parse_split_tuple(*split);
    } catch (const error& e) {
      throw error(where + ": " + e.what());
    }
    if (!(st == to_split_tuple(p.placement)))
      throw error(where + ": split " + *split + " disagrees with layout " + *layout_text + " on mesh " + *mesh_text +
                  ", which splits it " + to_string(to_split_tuple(p.placement)));
  }
  return p;
}

/// The file's kind from "tessera.kind" (whole when absent: any safetensors file holds
/// whole tensors). Throws for another value, and for a "tessera.format" other than
/// this schema's version.
inline checkpoint_kind read_kind(const std::map<std::string, std::string>& metadata, std::string_view context) {
  if (auto f = metadata.find("tessera.format"); f != metadata.end() && f->second != checkpoint_format_version)
    throw error(std::string(context) + ": \"tessera.format\" is \"" + f->second + "\", this tessera reads version " +
                std::string(checkpoint_format_version));
  auto it = metadata.find("tessera.kind");
  if (it == metadata.end() || it->second == "whole") return checkpoint_kind::whole;
  if (it->second == "shard") return checkpoint_kind::shard;
  throw error(std::string(context) + ": \"tessera.kind\" is \"" + it->second + "\", expected \"whole\" or \"shard\"");
}

// ---- named host tensors -----------------------------------------------------------

/// A tensor read from a file: dtype, shape and its elements in host byte order.
class host_tensor {
 public:
  host_tensor() = default;
  host_tensor(dtype type, extents shape, std::vector<std::byte> bytes)
      : type_(type), shape_(shape), bytes_(std::move(bytes)) {}

  dtype type() const { return type_; }
  const extents& shape() const { return shape_; }
  index_t size() const { return shape_.size(); }
  std::span<const std::byte> bytes() const { return bytes_; }

  /// The elements as T, which must be the tensor's element type.
  template <class T>
  std::span<const T> values() const {
    if (dtype_of<T>() != type_)
      throw error("host_tensor: the tensor is " + std::string(dtype_name(type_)) + ", read as " +
                  std::string(dtype_name(dtype_of<T>())));
    return {reinterpret_cast<const T*>(bytes_.data()), bytes_.size() / sizeof(T)};
  }
  template <class T>
  std::vector<T> to_vector() const {
    std::span<const T> v = values<T>();
    return std::vector<T>(v.begin(), v.end());
  }

 private:
  dtype type_ = dtype::f32;
  extents shape_;
  std::vector<std::byte> bytes_;
};

/// A checkpoint file read whole: its tensors by name, its metadata and each
/// tensor's recorded placement (absent for files tessera did not write).
struct checkpoint {
  std::filesystem::path file;
  checkpoint_kind kind = checkpoint_kind::whole;
  std::map<std::string, host_tensor> tensors;
  std::map<std::string, std::string> metadata;
  std::map<std::string, tensor_placement> placements;

  bool contains(std::string_view name) const { return tensors.find(std::string(name)) != tensors.end(); }
  const host_tensor& at(std::string_view name) const {
    auto it = tensors.find(std::string(name));
    if (it == tensors.end())
      throw error("checkpoint: " + file.string() + ": no tensor named '" + std::string(name) + "'");
    return it->second;
  }
};

/// Reads every tensor of a safetensors file (MindSpore's load_checkpoint): for a whole
/// checkpoint the global tensors, for a shard file (integrated_save off) that rank's
/// shards, with their placements. Any safetensors file with tensors of rank <= 6 reads.
inline checkpoint load_checkpoint(const std::filesystem::path& file) {
  safetensors_reader r(file);
  checkpoint c;
  c.file = file;
  c.metadata = r.metadata();
  const std::string ctx = "load_checkpoint: " + file.string();
  c.kind = read_kind(c.metadata, ctx);
  for (const tensor_info& t : r.tensors()) {
    c.tensors.emplace(t.name, host_tensor(t.type, t.shape_extents(), r.read_host_bytes(t)));
    if (auto p = read_placement(c.metadata, t.name, ctx)) {
      const extents want = p->has_offset ? local_shape(p->placement, p->global) : p->global;
      if (!(want == t.shape_extents()))
        throw error(ctx + ": tensor '" + t.name + "' has shape " + to_string(t.shape_extents()) + ", its placement (" +
                    to_string(p->placement) + " on mesh " + to_string(p->placement.dev) + ", global " +
                    to_string(p->global) + ") says " + to_string(want));
      c.placements.emplace(t.name, *p);
    }
  }
  return c;
}

// ---- checking names, shapes and dtypes --------------------------------------------

/// What a network expects of one parameter (or what a file holds): name, dtype and
/// global shape.
struct param_spec {
  std::string name;
  dtype type = dtype::f32;
  extents shape;
};

/// Every difference between the tensors `found` (in a checkpoint) and those
/// `expected` (by a network), one line each, in expected order then the unexpected
/// ones: "missing 'fc2.bias' (F32 (16,))", "unexpected 'fc3.weight' (F32 (4, 4))",
/// "'fc1.weight': shape (16, 32) in the checkpoint, (32, 16) expected",
/// "'step': dtype I64 in the checkpoint, F32 expected". Unexpected tensors are
/// listed only when `strict`.
inline std::vector<std::string> param_mismatches(std::span<const param_spec> found,
                                                 std::span<const param_spec> expected, bool strict = true) {
  std::vector<std::string> out;
  std::map<std::string_view, const param_spec*> by_name, wanted;
  for (const param_spec& p : found) by_name.emplace(p.name, &p);
  for (const param_spec& p : expected) wanted.emplace(p.name, &p);
  for (const param_spec& e : expected) {
    auto it = by_name.find(e.name);
    const param_spec* f = it == by_name.end() ? nullptr : it->second;
    if (!f) {
      out.push_back("missing '" + e.name + "' (" + std::string(dtype_name(e.type)) + " " + to_string(e.shape) + ")");
      continue;
    }
    if (!(f->shape == e.shape))
      out.push_back("'" + e.name + "': shape " + to_string(f->shape) + " in the checkpoint, " + to_string(e.shape) +
                    " expected");
    if (f->type != e.type)
      out.push_back("'" + e.name + "': dtype " + std::string(dtype_name(f->type)) + " in the checkpoint, " +
                    std::string(dtype_name(e.type)) + " expected");
  }
  if (strict)
    for (const param_spec& f : found)
      if (!wanted.count(f.name))
        out.push_back("unexpected '" + f.name + "' (" + std::string(dtype_name(f.type)) + " " + to_string(f.shape) +
                      ")");
  return out;
}

/// Throws one tessera::error listing every mismatch (param_mismatches), e.g.
///
///     load_param_into_net: model.safetensors: 2 mismatches with the network:
///       missing 'fc2.bias' (F32 (16,))
///       'fc1.weight': shape (16, 32) in the checkpoint, (32, 16) expected
inline void check_params(std::span<const param_spec> found, std::span<const param_spec> expected, bool strict,
                         std::string_view context) {
  const std::vector<std::string> m = param_mismatches(found, expected, strict);
  if (m.empty()) return;
  std::string msg = std::string(context) + ": " + std::to_string(m.size()) + (m.size() == 1 ? " mismatch" : " mismatches") +
                    " with the network:";
  for (const std::string& line : m) msg += "\n  " + line;
  throw error(msg);
}

/// The specs of a checkpoint's tensors: for a whole checkpoint their shapes; for a
/// shard file the global shapes its placements record.
inline std::vector<param_spec> specs_of(const checkpoint& c) {
  std::vector<param_spec> out;
  for (const auto& [name, t] : c.tensors) {
    auto p = c.placements.find(name);
    const bool shard = c.kind == checkpoint_kind::shard && p != c.placements.end();
    out.push_back({name, t.type(), shard ? p->second.global : t.shape()});
  }
  return out;
}

}  // namespace tessera::io
