// Tests of io/checkpoint_file.hpp: placements written to metadata read back equal
// for every layout of small tensors; load_checkpoint returns named tensors and their
// placements, also from a file with no tessera metadata; inconsistent placements are
// errors naming the file, the tensor and the numbers; and the network check reports
// every missing, unexpected, wrong-shape and wrong-dtype tensor in one message.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>
#include <tessera/core/enumerate.hpp>
#include <tessera/io/checkpoint_file.hpp>
#include "error_text.hpp"

namespace io_test_checkpoint_file {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("tessera_test_checkpoint_file_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const fs::path& tmp() {
  static temp_dir d;
  return d.path;
}

using testing::error_of;

// A file with one F32 tensor "w" of `shape` and the given metadata.
fs::path file_with(const std::vector<index_t>& shape, const std::map<std::string, std::string>& md,
                   const std::string& name = "meta.safetensors") {
  index_t n = 1;
  for (index_t e : shape) n *= e;
  std::vector<float> v(std::size_t(n), 1.0f);
  safetensors_writer w;
  w.add("w", shape, std::span<const float>(v));
  for (const auto& [k, x] : md) w.set_metadata(k, x);
  const fs::path p = tmp() / name;
  w.write(p);
  return p;
}

}  // namespace

TEST_CASE("checkpoint metadata: every placement written reads back equal") {
  long count = 0;
  for (const mesh& m : {mesh{1}, mesh{4}, mesh{2, 2}, mesh{2, 4}, mesh{2, 2, 2}})
    for (int ndim = 0; ndim <= 3; ++ndim) {
      extents g;
      g.ndim = ndim;
      for (int d = 0; d < ndim; ++d) g.v[d] = 8 * (d + 1);
      for_each_layout(m, ndim, true, [&](const layout& l) {
        for (int rank : {0, m.size() - 1}) {
          std::map<std::string, std::string> md;
          const tensor_placement p{l, g, local_offset(l, g, rank), rank != 0};
          write_placement(md, "net.fc1.weight", p);
          const std::optional<tensor_placement> back = read_placement(md, "net.fc1.weight", "test");
          REQUIRE(back);
          CHECK(back->placement == l);
          CHECK(back->global == g);
          CHECK(back->has_offset == p.has_offset);
          if (p.has_offset) CHECK(back->offset == p.offset);
          ++count;
        }
      });
    }
  CHECK(count > 900);
  std::map<std::string, std::string> md;
  write_placement(md, "x", {layout(mesh{2, 4}, {{0}, {}}).with_partial(1), extents{16, 32}, extents{8, 0}, true});
  CHECK(md == std::map<std::string, std::string>{{"layout:x", "[0, -] partial sum {1}"},
                                                 {"mesh:x", "(2, 4)"},
                                                 {"offset:x", "(8, 0)"},
                                                 {"shape:x", "(16, 32)"},
                                                 {"split:x", "(2, 1)"}});
  CHECK(!read_placement(md, "y", "test"));
}

TEST_CASE("checkpoint metadata: inconsistent placements are errors naming the tensor") {
  const std::map<std::string, std::string> good{
      {"mesh:w", "(2, 4)"}, {"layout:w", "[0, 1]"}, {"shape:w", "(16, 32)"}, {"split:w", "(2, 4)"}};
  auto with = [&](const std::string& k, const std::string& v) {
    std::map<std::string, std::string> md = good;
    if (v.empty()) md.erase(k);
    else md[k] = v;
    return error_of([&] { (void)read_placement(md, "w", "f.safetensors"); });
  };
  CHECK(with("layout:w", "") ==
        "f.safetensors: tensor 'w': the metadata records only part of the placement (\"mesh:\", \"layout:\" and \"shape:\" go together)");
  CHECK(with("layout:w", "[0, 2]") ==
        "f.safetensors: tensor 'w': parse_layout: layout: a mesh axis index is out of range: dim 1 names mesh axis 2, "
        "mesh has 2 axes; in \"[0, 2]\" on mesh (2, 4)");
  CHECK(with("mesh:w", "(2, x)") ==
        "f.safetensors: tensor 'w': parse_mesh: expected a mesh axis size, found 'x' at character 4 in \"(2, x)\"");
  CHECK(with("shape:w", "(16, 30)") ==
        "f.safetensors: tensor 'w': layout: a tensor dim must be divisible by the product of its splits: dim 1 has "
        "extent 30, split into 4 pieces; layout [0, 1] on mesh (2, 4), shape (16, 30)");
  CHECK(with("shape:w", "(16,)") ==
        "f.safetensors: tensor 'w': layout: the shape's rank must equal the layout's tensor rank: shape has rank 1, "
        "layout has rank 2; layout [0, 1] on mesh (2, 4), shape (16,)");
  CHECK(with("shape:w", "(16, ?)") == "f.safetensors: tensor 'w': the global shape (16, ?) has an unknown extent");
  CHECK(with("split:w", "(2, 2)") ==
        "f.safetensors: tensor 'w': split (2, 2) disagrees with layout [0, 1] on mesh (2, 4), which splits it (2, 4)");
  CHECK(with("offset:w", "(8,)") == "f.safetensors: tensor 'w': offset (8,) has rank 1, the shape 2");
  CHECK(error_of([] { (void)read_kind({{"tessera.kind", "partial"}}, "f"); }) ==
        "f: \"tessera.kind\" is \"partial\", expected \"whole\" or \"shard\"");
  CHECK(error_of([] { (void)read_kind({{"tessera.format", "2"}, {"tessera.kind", "whole"}}, "f"); }) ==
        "f: \"tessera.format\" is \"2\", this tessera reads version 1");
  CHECK(read_kind({{"tessera.format", "1"}, {"tessera.kind", "shard"}}, "f") == checkpoint_kind::shard);
  CHECK(read_kind({}, "f") == checkpoint_kind::whole);
}

TEST_CASE("load_checkpoint: named tensors and their placements") {
  std::vector<float> w(16 * 32);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(i);
  const std::vector<std::int64_t> step{42};
  safetensors_writer sw;
  sw.add("fc1.weight", {16, 32}, std::span<const float>(w));
  sw.add("step", {}, std::span<const std::int64_t>(step));
  std::map<std::string, std::string> md{{"tessera.kind", "whole"}, {"epoch", "3"}};
  write_placement(md, "fc1.weight", {layout(mesh{2, 4}, {{0}, {1}}), extents{16, 32}, extents{}, false});
  for (const auto& [k, v] : md) sw.set_metadata(k, v);
  const fs::path p = tmp() / "net.safetensors";
  sw.write(p);

  const checkpoint c = load_checkpoint(p);
  CHECK(c.kind == checkpoint_kind::whole);
  CHECK(c.tensors.size() == 2);
  CHECK(c.at("fc1.weight").shape() == extents{16, 32});
  CHECK(c.at("fc1.weight").to_vector<float>() == w);
  CHECK(c.at("step").shape() == extents{});
  CHECK(c.at("step").values<std::int64_t>()[0] == 42);
  CHECK(c.metadata.at("epoch") == "3");
  CHECK(c.placements.at("fc1.weight").placement == layout(mesh{2, 4}, {{0}, {1}}));
  CHECK(c.placements.count("step") == 0);
  CHECK(error_of([&] { (void)c.at("step").values<float>(); }) == "host_tensor: the tensor is I64, read as F32");
  CHECK(error_of([&] { (void)c.at("nope"); }) == "checkpoint: " + p.string() + ": no tensor named 'nope'");
  const std::vector<param_spec> specs = specs_of(c);
  CHECK(specs.size() == 2);
  CHECK(specs[0].name == "fc1.weight");
  CHECK(specs[0].shape == extents{16, 32});
  CHECK(specs[1].type == dtype::i64);

  // a file with no tessera metadata (as other tools write) loads as whole tensors
  const fs::path plain = file_with({3, 2}, {}, "plain.safetensors");
  const checkpoint q = load_checkpoint(plain);
  CHECK(q.kind == checkpoint_kind::whole);
  CHECK(q.placements.empty());
  CHECK(q.at("w").to_vector<float>() == std::vector<float>(6, 1.0f));

  // a placement that disagrees with the tensor's own shape
  std::map<std::string, std::string> bad{{"tessera.kind", "shard"}};
  write_placement(bad, "w", {layout(mesh{2}, {{0}, {}}), extents{8, 2}, extents{4, 0}, true});
  const fs::path wrong = file_with({3, 2}, bad, "wrong.safetensors");
  CHECK(error_of([&] { (void)load_checkpoint(wrong); }) ==
        "load_checkpoint: " + wrong.string() +
            ": tensor 'w' has shape (3, 2), its placement ([0, -] on mesh (2,), global (8, 2)) says (4, 2)");
}

TEST_CASE("check_params: every mismatch with the network in one message") {
  const std::vector<param_spec> found{{"fc1.weight", dtype::f32, extents{16, 32}},
                                      {"fc1.bias", dtype::f32, extents{16}},
                                      {"fc3.weight", dtype::f32, extents{4, 4}},
                                      {"step", dtype::i64, extents{}}};
  const std::vector<param_spec> expected{{"fc1.weight", dtype::f32, extents{32, 16}},
                                         {"fc1.bias", dtype::f32, extents{16}},
                                         {"fc2.bias", dtype::f32, extents{16}},
                                         {"step", dtype::f32, extents{}}};
  CHECK(param_mismatches(found, found).empty());
  CHECK(param_mismatches(found, expected) ==
        std::vector<std::string>{"'fc1.weight': shape (16, 32) in the checkpoint, (32, 16) expected",
                                 "missing 'fc2.bias' (F32 (16,))",
                                 "'step': dtype I64 in the checkpoint, F32 expected",
                                 "unexpected 'fc3.weight' (F32 (4, 4))"});
  CHECK(param_mismatches(found, expected, false).size() == 3);
  CHECK(error_of([&] { check_params(found, expected, true, "load_param_into_net: net.safetensors"); }) ==
        "load_param_into_net: net.safetensors: 4 mismatches with the network:\n"
        "  'fc1.weight': shape (16, 32) in the checkpoint, (32, 16) expected\n"
        "  missing 'fc2.bias' (F32 (16,))\n"
        "  'step': dtype I64 in the checkpoint, F32 expected\n"
        "  unexpected 'fc3.weight' (F32 (4, 4))");
  const std::vector<param_spec> one{{"fc1.bias", dtype::f64, extents{16}}};
  CHECK(error_of([&] { check_params(found, one, false, "x"); }) ==
        "x: 1 mismatch with the network:\n  'fc1.bias': dtype F32 in the checkpoint, F64 expected");
  CHECK_NOTHROW(check_params(found, std::vector<param_spec>{found[0]}, false, "x"));
}
}  // namespace io_test_checkpoint_file
