// Tests of io/rotation.hpp: checkpoint file names are made and parsed back, listed
// in (epoch, step) order (numeric, not lexicographic), and a training loop that saves
// then rotates keeps exactly the newest keep_checkpoint_max files, touching nothing
// else in the directory.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <tessera/io/rotation.hpp>
#include "error_text.hpp"

namespace io_test_rotation {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("tessera_test_rotation_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void touch(const fs::path& p) { std::ofstream(p) << "x"; }

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

using testing::error_of;

}  // namespace

TEST_CASE("checkpoint file names: made and parsed back") {
  CHECK(checkpoint_file_name("resnet", 3, 156) == "resnet-3_156.safetensors");
  CHECK(checkpoint_file_name("semi_auto-parallel", 0, 0) == "semi_auto-parallel-0_0.safetensors");
  for (long long e : {0LL, 1LL, 9LL, 10LL, 123456789012LL})
    for (long long s : {0LL, 7LL, 100LL}) {
      const auto back = parse_checkpoint_file_name(checkpoint_file_name("a-b_c", e, s), "a-b_c");
      REQUIRE(back);
      CHECK(back->epoch == e);
      CHECK(back->step == s);
    }
  for (const char* bad : {"net-1_2.ckpt", "net-1-2.safetensors", "net-_2.safetensors", "net-1_.safetensors",
                          "net-1_2_3.safetensors", "net-a_2.safetensors", "net1_2.safetensors", "other-1_2.safetensors",
                          ".net-1_2.safetensors.tmp.0123456789abcdef", "net-1_2.safetensors.bak", "net-+1_2.safetensors"})
    CHECK_MESSAGE(!parse_checkpoint_file_name(bad, "net"), bad);
  CHECK(error_of([] { (void)checkpoint_file_name("", 1, 1); }) == "checkpoint_file_name: the checkpoint prefix must not be empty");
  CHECK(error_of([] { (void)checkpoint_file_name("a/b", 1, 1); }) ==
        "checkpoint_file_name: the checkpoint prefix \"a/b\" must be a file name, without a directory");
  CHECK(error_of([] { (void)checkpoint_file_name("a", -1, 1); }) ==
        "checkpoint_file_name: epoch and step must not be negative: epoch -1, step 1");
}

TEST_CASE("rotate_checkpoints: a training loop keeps the newest keep_checkpoint_max") {
  temp_dir dir;
  touch(dir.path / "notes.txt");
  touch(dir.path / "other-1_1.safetensors");  // another prefix
  touch(dir.path / "net-1_1.safetensors.bak");
  fs::create_directories(dir.path / "net-0_99.safetensors");  // a directory, not a checkpoint
  const int keep = 3, steps_per_epoch = 4;
  std::vector<std::string> saved;
  for (int epoch = 1; epoch <= 3; ++epoch)
    for (int step = steps_per_epoch; step <= 3 * steps_per_epoch; step += steps_per_epoch) {  // steps 4, 8, 12
      const std::string name = checkpoint_file_name("net", epoch, step);
      touch(dir.path / name);
      saved.push_back(name);
      const std::vector<fs::path> removed = rotate_checkpoints(dir.path, "net", keep);
      CHECK(removed.size() == (saved.size() > std::size_t(keep) ? 1u : 0u));
      if (!removed.empty()) CHECK(removed[0].filename() == saved[saved.size() - keep - 1]);
    }
  const std::vector<checkpoint_entry> left = list_checkpoints(dir.path, "net");
  REQUIRE(left.size() == 3);
  CHECK(left[0].path.filename() == "net-3_4.safetensors");
  CHECK(left[2].path.filename() == "net-3_12.safetensors");
  CHECK(latest_checkpoint(dir.path, "net")->path.filename() == "net-3_12.safetensors");
  CHECK(names_in(dir.path) == std::vector<std::string>{"net-0_99.safetensors", "net-1_1.safetensors.bak",
                                                       "net-3_12.safetensors", "net-3_4.safetensors",
                                                       "net-3_8.safetensors", "notes.txt", "other-1_1.safetensors"});
}

TEST_CASE("list_checkpoints: numeric order; rotation limits") {
  temp_dir dir;
  for (const char* n : {"m-10_1.safetensors", "m-9_20.safetensors", "m-9_3.safetensors", "m-100_0.safetensors"})
    touch(dir.path / n);
  std::vector<std::string> order;
  for (const checkpoint_entry& e : list_checkpoints(dir.path, "m")) order.push_back(e.path.filename().string());
  CHECK(order == std::vector<std::string>{"m-9_3.safetensors", "m-9_20.safetensors", "m-10_1.safetensors",
                                          "m-100_0.safetensors"});
  CHECK(rotate_checkpoints(dir.path, "m", 4).empty());
  CHECK(rotate_checkpoints(dir.path, "m", 1).size() == 3);
  CHECK(names_in(dir.path) == std::vector<std::string>{"m-100_0.safetensors"});
  CHECK(error_of([&] { (void)rotate_checkpoints(dir.path, "m", 0); }) ==
        "rotate_checkpoints: keep_checkpoint_max must be at least 1, got 0");
  CHECK(list_checkpoints(dir.path / "missing", "m").empty());
  CHECK(!latest_checkpoint(dir.path / "missing", "m"));
}
}  // namespace io_test_rotation
