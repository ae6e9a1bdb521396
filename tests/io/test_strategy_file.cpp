// Tests of io/strategy_file.hpp: a strategy map (operators' shard strategies and
// parameters' layouts, partial ones included) saved and loaded is equal to itself,
// over every layout of small tensors; the file is the documented JSON; each kind of
// corrupt or invalid file is an error naming the field and the numbers; an invalid
// map is refused before anything is written; the file is strict JSON (duplicate keys
// and trailing text are errors); random corruptions parse or throw tessera::error.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tessera/core/enumerate.hpp>
#include <tessera/io/strategy_file.hpp>
#include "error_text.hpp"

namespace io_test_strategy_file {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("tessera_test_strategy_file_" + std::to_string(::getpid()));
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

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The seed's quickstart network on 8 devices.
strategy_map seed_strategies() {
  strategy_map s;
  s.device_num = 8;
  s.operators["fc1.matmul"] = strategy{{2, 4}, {4, 1}};
  s.operators["relu"] = strategy{{2, 4}};
  s.operators["fc2.matmul"] = strategy{{2, 4}, {4, 1}};
  s.operators["loss.mse"] = strategy{{8, 1}, {8, 1}};
  s.operators["scalar_op"] = strategy{{}};
  s.parameters["fc1.weight"] = {extents{32, 16}, layout(mesh{2, 4, 1}, {{1}, {2}})};
  s.parameters["fc1.out"] = {extents{16, 16}, layout(mesh{2, 4, 1}, {{0}, {2}}).with_partial(1)};
  s.parameters["bias"] = {extents{16}, layout::replicated(mesh{8}, 1)};
  return s;
}

// The error loading a file with `text` gives (the file name replaced by "F").
std::string load_error(const std::string& text) {
  const fs::path p = tmp() / "bad.json";
  std::ofstream(p, std::ios::binary) << text;
  std::string e = error_of([&] { (void)load_strategy_file(p); });
  const std::string name = p.string();
  const auto at = e.find(name);
  if (at == std::string::npos) return e;
  std::string out = e.substr(0, at);
  out += 'F';
  out += e.substr(at + name.size());
  return out;
}

// A valid file's text with `from` replaced by `to`.
std::string edited(const std::string& from, const std::string& to) {
  std::string t = json::dump(to_json(seed_strategies()), 2);
  const auto at = t.find(from);
  REQUIRE(at != std::string::npos);
  t.replace(at, from.size(), to);
  return t;
}

}  // namespace

TEST_CASE("strategy files: the seed's strategies round-trip, as the documented JSON") {
  const strategy_map s = seed_strategies();
  const fs::path p = tmp() / "train_strategy.json";
  save_strategy_file(p, s);
  CHECK(load_strategy_file(p) == s);
  const json::value v = json::parse(slurp(p));
  CHECK(v.at("format").get<std::string>() == "tessera.strategy");
  CHECK(json::to_int64(v.at("version")) == 1);
  CHECK(json::to_int64(v.at("device_num")) == 8);
  CHECK(json::dump(v.at("operators").at("fc1.matmul")) == "[[2,4],[4,1]]");
  CHECK(json::dump(v.at("parameters").at("fc1.out")) ==
        R"({"layout":"[0, 2] partial sum {1}","mesh":[2,4,1],"shape":[16,16]})");
  // the file keeps the documented order of its fields, one per line, splits on one line
  const std::string text = slurp(p);
  CHECK(text.rfind("{\n  \"format\": \"tessera.strategy\",\n  \"version\": 1,\n  \"device_num\": 8,\n", 0) == 0);
  CHECK(text.find("    \"fc1.matmul\": [[2, 4], [4, 1]],\n") != std::string::npos);
  CHECK(text.find("    \"fc1.out\": {\n      \"shape\": [16, 16],\n      \"mesh\": [2, 4, 1],\n      \"layout\": "
                  "\"[0, 2] partial sum {1}\"\n    },\n") != std::string::npos);
  CHECK(json::dump(to_json(s)["parameters"]["fc1.out"]) ==
        R"({"shape":[16,16],"mesh":[2,4,1],"layout":"[0, 2] partial sum {1}"})");
  CHECK(text.back() == '\n');
}

TEST_CASE("strategy files: every layout of small parameters round-trips") {
  for (const mesh& m : {mesh{4}, mesh{2, 2}, mesh{2, 4}, mesh{2, 2, 2}}) {
    strategy_map s;
    s.device_num = m.size();
    int i = 0;
    for (int ndim = 0; ndim <= 3; ++ndim) {
      extents g;
      g.ndim = ndim;
      for (int d = 0; d < ndim; ++d) g.v[d] = 8;
      for (reduce_op op : {reduce_op::sum, reduce_op::max})
        for_each_layout(m, ndim, true, [&](const layout& l) { s.parameters[std::string("p").append(std::to_string(i++))] = {g, l}; }, op);
    }
    s.operators["op"] = strategy{{m.size(), 1}, {1, 1}};
    const fs::path p = tmp() / "all.json";
    save_strategy_file(p, s);
    CHECK(load_strategy_file(p) == s);
    CHECK(i >= 28);  // 28 on a one-axis mesh, more on the others
  }
}

TEST_CASE("strategy files: corrupt or invalid files are errors naming the field") {
  CHECK(load_error("") == "load_strategy_file: F: invalid JSON at byte 0 (line 1, column 1): syntax error while "
                          "parsing value - unexpected end of input; expected '[', '{', or a literal");
  CHECK(load_error(json::dump(to_json(seed_strategies()), 2).substr(0, 60))
            .find("load_strategy_file: F: invalid JSON at byte 60 (line 4, column ") == 0);
  // strict JSON: duplicate keys (which would silently pick one strategy), trailing text
  CHECK(load_error(edited("\"relu\": [[2, 4]]", "\"relu\": [[2, 4]], \"relu\": [[8, 1]]")) ==
        "load_strategy_file: F: invalid JSON at byte 219 (line 9, column 28): duplicate object key \"relu\"");
  CHECK(load_error(edited("\"version\": 1", "\"version\": 1, \"version\": 2")) ==
        "load_strategy_file: F: invalid JSON at byte 58 (line 3, column 25): duplicate object key \"version\"");
  CHECK(load_error(json::dump(to_json(seed_strategies()), 2) + "\n}") ==
        "load_strategy_file: F: invalid JSON at byte 564 (line 30, column 1): syntax error while parsing value - "
        "unexpected '}'; expected end of input");
  CHECK(load_error(json::dump(to_json(seed_strategies()), 2) + "{}").find("expected end of input") != std::string::npos);
  CHECK(load_error("{\"format\": \"tessera.strategy\", // a comment\n}")
            .find("load_strategy_file: F: invalid JSON at byte 31 (line 1, column 32): ") == 0);
  CHECK(load_error("[]") == "load_strategy_file: F: the file must be a JSON object, found an array");
  CHECK(load_error(edited("\"format\": \"tessera.strategy\"", "\"format\": \"mindspore\"")) ==
        "load_strategy_file: F: \"format\" must be \"tessera.strategy\"");
  CHECK(load_error(edited("\"version\": 1", "\"version\": 2")) ==
        "load_strategy_file: F: \"version\" is 2, this tessera reads version 1");
  CHECK(load_error(edited("\"device_num\": 8", "\"device_num\": 0")) ==
        "load_strategy_file: F: \"device_num\" must be a positive integer, found 0");
  CHECK(load_error(edited("\"device_num\": 8,", "")) == "load_strategy_file: F: the file lacks \"device_num\"");
  CHECK(load_error(edited("\"version\": 1", "\"version\": 1, \"extra\": true")) ==
        "load_strategy_file: F: the file has an unknown key \"extra\"");
  CHECK(load_error(edited("\"fc1.matmul\": [[2, 4], [4, 1]]", "\"fc1.matmul\": [[2, 4], [3, 1]]")) ==
        "load_strategy_file: F: operators.\"fc1.matmul\": strategy: the product of an input's splits must divide the "
        "device count: input 1: product of splits 3, device count 8; strategy ((2, 4), (3, 1)), device_num 8");
  CHECK(load_error(edited("\"fc1.matmul\": [[2, 4], [4, 1]]", "\"fc1.matmul\": [[2, 4], [0, 1]]")) ==
        "load_strategy_file: F: operators.\"fc1.matmul\"[1][0] must be an integer in [1, 16777216], found 0");
  CHECK(load_error(edited("\"fc1.matmul\": [[2, 4], [4, 1]]", "\"fc1.matmul\": [2, 4]")) ==
        "load_strategy_file: F: operators.\"fc1.matmul\"[0] must be an array of splits such as [2, 4]");
  CHECK(load_error(edited("\"fc1.matmul\": [[2, 4], [4, 1]]", "\"fc1.matmul\": \"((2, 4), (4, 1))\"")) ==
        "load_strategy_file: F: operators.\"fc1.matmul\" must be an array of split tuples such as [[2, 4], [4, 1]]");
  CHECK(load_error(edited("\"mesh\": [8]", "\"mesh\": [4]")) ==
        "load_strategy_file: F: parameters.\"bias\".mesh: mesh: the mesh size must equal the number of ranks: mesh "
        "size 4, communicator size 8; mesh (4,), device_num 8");
  CHECK(load_error(edited("\"layout\": \"[1, 2]\"", "\"layout\": \"[1, 3]\"")) ==
        "load_strategy_file: F: parameters.\"fc1.weight\".layout: parse_layout: layout: a mesh axis index is out of "
        "range: dim 1 names mesh axis 3, mesh has 3 axes; in \"[1, 3]\" on mesh (2, 4, 1)");
  CHECK(load_error(edited("\"layout\": \"[1, 2]\"", "\"layout\": \"[1 2]\"")) ==
        "load_strategy_file: F: parameters.\"fc1.weight\".layout: parse_layout: expected ',' or ']', found '2' at "
        "character 3 in \"[1 2]\"");
  CHECK(load_error(edited("\"shape\": [32, 16]", "\"shape\": [30, 16]")) ==
        "load_strategy_file: F: parameters.\"fc1.weight\": layout: a tensor dim must be divisible by the product of "
        "its splits: dim 0 has extent 30, split into 4 pieces; layout [1, 2] on mesh (2, 4, 1), shape (30, 16)");
  CHECK(load_error(edited("\"shape\": [32, 16]", "\"shape\": [32]")) ==
        "load_strategy_file: F: parameters.\"fc1.weight\": layout: the shape's rank must equal the layout's tensor "
        "rank: shape has rank 1, layout has rank 2; layout [1, 2] on mesh (2, 4, 1), shape (32,)");
  CHECK(load_error(edited("\"shape\": [32, 16],", "")) == "load_strategy_file: F: parameters.\"fc1.weight\" lacks \"shape\"");
  CHECK(load_error(edited("\"shape\": [32, 16]", "\"shape\": [32, 16], \"dtype\": \"F32\"")) ==
        "load_strategy_file: F: parameters.\"fc1.weight\" has an unknown key \"dtype\"");
  CHECK(error_of([] { (void)load_strategy_file(tmp() / "missing.json"); }) ==
        "load_strategy_file: " + (tmp() / "missing.json").string() + ": cannot open the file");
}

TEST_CASE("strategy files: an invalid map is refused before anything is written") {
  strategy_map s = seed_strategies();
  s.operators["bad"] = strategy{{16, 1}};
  const fs::path p = tmp() / "refused.json";
  CHECK(error_of([&] { save_strategy_file(p, s); }) ==
        "save_strategy_file: " + p.string() +
            ": operators.\"bad\": strategy: the product of an input's splits must divide the device count: input 0: "
            "product of splits 16, device count 8; strategy ((16, 1),), device_num 8");
  CHECK(!fs::exists(p));
}

TEST_CASE("strategy files: random corruptions parse or throw tessera::error") {
  const std::string base = json::dump(to_json(seed_strategies()), 2);
  std::mt19937 rng(99);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string t = base;
    const std::size_t pos = rng() % t.size();
    switch (rng() % 3) {
      case 0: t.resize(pos); break;
      case 1: t[pos] = "0123456789[]{},:\"-x "[rng() % 21]; break;
      case 2: t.erase(pos, 1 + rng() % 4); break;
    }
    try {
      (void)strategy_map_from_json(json::parse(t, "fuzz"), "fuzz");
      ++ok;
    } catch (const error& e) {
      ++rejected;
      CHECK(std::string(e.what()).rfind("fuzz: ", 0) == 0);
    }
  }
  CHECK(ok + rejected == 400);
  CHECK(rejected > 200);
}
}  // namespace io_test_strategy_file
