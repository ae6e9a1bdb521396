// docs/checkpoints.md's example: a layer's tensors saved whole and per rank, loaded into
// other layouts and into one process; then the page's other statements, checked: the
// file format, the metadata, the error texts, the file names and a strategy file.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/io/checkpoint.hpp>

#include "shared_folder.hpp"
#include <tessera/io/json.hpp>
#include <tessera/io/layout_text.hpp>
#include <tessera/io/rotation.hpp>
#include <tessera/io/strategy_file.hpp>

namespace fs = std::filesystem;

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw tessera::error("checkpoints: " + what);
}

float weight_at(const std::array<tessera::index_t, tessera::max_tensor_ndim>& i) { return float(i[0] * 32 + i[1]); }
float bias_at(const std::array<tessera::index_t, tessera::max_tensor_ndim>& i) { return float(i[0]) / 2; }

// Whether t's shard holds the values f gives.
template <class F>
bool holds(const tessera::dist_tensor<float>& t, F f) {
  tessera::dist_tensor<float> want(t.layout(), t.global_shape(), t.rank());
  want.fill_global(f);
  return t.local() == want.local();
}

// What `f` throws, or "".
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const tessera::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](tessera::any_communicator& world) {
    shared_folder tmp(world, "checkpoints");
    const fs::path ckpt = tmp.path / "ckpt";
    // [save_load]
    namespace io = tessera::io;
    using tessera::dist_tensor, tessera::extents, tessera::layout, tessera::mesh;
    const int n = world.size(), rank = world.rank();
    tessera::context ctx(world);
    // fc1 of a network on n ranks: the weight's rows split over the ranks, the bias replicated
    dist_tensor<float> w1(layout(mesh{n}, {{0}, {}}), extents{16, 32}, rank);
    dist_tensor<float> b1(layout::replicated(mesh{n}, 1), extents{16}, rank);
    w1.fill_global([](const auto& i) { return float(i[0] * 32 + i[1]); });
    b1.fill_global([](const auto& i) { return float(i[0]) / 2; });

    std::vector<io::param_ref> net{{"fc1.weight", w1}, {"fc1.bias", b1}};  // views of the dist_tensors
    const auto whole = ckpt / io::checkpoint_file_name("net", 1, 4);       // ckpt/net-1_4.safetensors
    io::save_checkpoint(whole, net, ctx);                                  // rank 0 writes it
    io::save_options per_rank;
    per_rank.integrated_save = false;                                      // each rank writes its shards,
    const auto sharded = ckpt / io::checkpoint_file_name("net", 2, 4);     //   to ckpt/rank_R/net-2_4.safetensors
    io::save_checkpoint(sharded, net, ctx, per_rank);

    // the same tensors under other layouts: the weight's columns split, the bias too
    dist_tensor<float> w2(layout(mesh{n}, {{}, {0}}), extents{16, 32}, rank);
    dist_tensor<float> b2(layout(mesh{n}, {{0}}), extents{16}, rank);
    std::vector<io::param_ref> other_net{{"fc1.weight", w2}, {"fc1.bias", b2}};
    io::load_distributed_checkpoint(sharded, other_net);  // each rank reads the pieces of its shards
    // and a cluster of one: the whole tensors in this process, from the n ranks' files
    dist_tensor<float> w(layout::replicated(mesh{1}, 2), extents{16, 32}, 0);
    dist_tensor<float> b(layout::replicated(mesh{1}, 1), extents{16}, 0);
    std::vector<io::param_ref> one{{"fc1.weight", w}, {"fc1.bias", b}};
    io::load_distributed_checkpoint(sharded, one);
    io::load_param_into_net(io::load_checkpoint(whole), other_net);  // the whole file, read into memory
    // [/save_load]
    require(holds(w, weight_at) && holds(b, bias_at), "the per-rank checkpoint loaded into one process is wrong");
    require(holds(w2, weight_at) && holds(b2, bias_at), "load_param_into_net loaded the whole file wrong");
    const auto forget = [&] {
      w2.fill_global([](const auto&) { return -1.0f; });
      b2.fill_global([](const auto&) { return -1.0f; });
    };
    forget();
    io::load_distributed_checkpoint(sharded, other_net);
    require(holds(w2, weight_at) && holds(b2, bias_at), "the per-rank checkpoint loaded into other layouts is wrong");
    forget();
    io::load_distributed_checkpoint(whole, other_net);
    require(holds(w2, weight_at) && holds(b2, bias_at), "the whole checkpoint loaded into other layouts is wrong");
    require(io::rank_file(sharded, rank) == ckpt / ("rank_" + std::to_string(rank)) / "net-2_4.safetensors" &&
                fs::is_regular_file(io::rank_file(sharded, rank)) && fs::is_regular_file(whole),
            "the checkpoint files are not where the page says");

    // The metadata, in the text forms tessera prints.
    const std::map<std::string, std::string> mw = io::checkpoint_metadata(whole);
    const std::map<std::string, std::string> ms = io::load_checkpoint(io::rank_file(sharded, rank)).metadata;
    const std::string split = "(" + std::to_string(n) + ", 1)", offset = "(" + std::to_string(16 / n * rank) + ", 0)";
    require(mw.at("tessera.format") == "1" && mw.at("tessera.kind") == "whole" && !mw.count("tessera.rank") &&
                mw.at("mesh:fc1.weight") == tessera::to_string(mesh{n}) && mw.at("layout:fc1.weight") == "[0, -]" &&
                mw.at("shape:fc1.weight") == "(16, 32)" && mw.at("split:fc1.weight") == split &&
                !mw.count("offset:fc1.weight"),
            "the whole file's metadata differs from the table");
    require(ms.at("tessera.kind") == "shard" && ms.at("tessera.rank") == std::to_string(rank) &&
                ms.at("tessera.ranks") == std::to_string(n) && ms.at("offset:fc1.weight") == offset &&
                ms.at("layout:fc1.bias") == "[-]",
            "the shard file's metadata differs from the table");
    // The table's examples: layout [0, -] on mesh (2, 4) of shape (16, 32) splits it (2, 1),
    // rank 4's shard starts at (8, 0); a partial layout reads back as it prints.
    const layout l = io::parse_layout(io::parse_mesh("(2, 4)"), "[0, -]");
    const layout p = io::parse_layout(io::parse_mesh("(2, 4)"), "[0, -] partial sum {1}");
    require(tessera::to_string(tessera::to_split_tuple(l)) == "(2, 1)" &&
                tessera::to_string(tessera::local_offset(l, extents{16, 32}, 4)) == "(8, 0)" &&
                tessera::to_string(p) == "[0, -] partial sum {1}" && tessera::to_string(p.dev) == "(2, 4)",
            "the metadata table's examples do not hold");

    world.barrier();  // every rank has read the files that rank 0 now changes
    if (rank == 0) {
      // The format: an 8-byte little-endian header length N, N bytes of JSON padded to a
      // multiple of 8, then the data (16 x 32 + 16 floats).
      std::ifstream in(whole, std::ios::binary);
      unsigned char len[8];
      in.read(reinterpret_cast<char*>(len), 8);
      std::uint64_t header = 0;
      for (int k = 7; k >= 0; --k) header = header << 8 | len[k];
      require(header % 8 == 0 && fs::file_size(whole) == 8 + header + (16 * 32 + 16) * 4,
              "the file is not 8 + N + data bytes with N a multiple of 8");
      // A truncated file: its name and the numbers.
      const fs::path cut = tmp.path / "net.safetensors";
      fs::copy_file(whole, cut);
      fs::resize_file(cut, 8 + header + 1000);
      const std::string got = error_of([&] { io::load_checkpoint(cut); });
      const std::string want = "safetensors: " + cut.string() +
                               ": tensor 'fc1.weight': data_offsets [0, 2048] run past the end of the data section, "
                               "which has 1000 bytes: the file is truncated or the offsets are wrong";
      require(got == want, "a truncated file gave \"" + got + "\", expected \"" + want + "\"");
      // File names and the rotation.
      require(io::checkpoint_file_name("resnet", 3, 156) == "resnet-3_156.safetensors", "checkpoint_file_name");
      fs::copy_file(whole, ckpt / "net-2_2.safetensors");
      fs::copy_file(whole, ckpt / "net-3_1.safetensors");
      const auto removed = io::rotate_checkpoints(ckpt, "net", 2);
      require(removed == std::vector<fs::path>{whole} && fs::is_regular_file(ckpt / "net-3_1.safetensors"),
              "rotate_checkpoints does not keep the newest 2");
      // A strategy file: the page's JSON loads.
      const fs::path strategy = tmp.path / "strategy.json";
      std::ofstream(strategy) << R"({"format": "tessera.strategy", "version": 1, "device_num": 8, "operators":
{"fc1.matmul": [[2, 4], [4, 1]]}, "parameters": {"fc1.weight": {"shape": [32, 16],
"mesh": [2, 4, 1], "layout": "[1, 2]"}}})";
      const io::strategy_map sm = io::load_strategy_file(strategy);
      require(sm.device_num == 8 && sm.operators.size() == 1 && sm.parameters.at("fc1.weight").shape == extents{32, 16},
              "the strategy file of the page does not load as written");
    }
    world.barrier();

    // Every mismatch with the network in one error.
    dist_tensor<float> wt(layout::replicated(mesh{1}, 2), extents{32, 16}, 0);
    dist_tensor<float> b3(layout::replicated(mesh{1}, 1), extents{16}, 0), c2(layout::replicated(mesh{1}, 1), extents{16}, 0);
    std::vector<io::param_ref> wrong{{"fc1.weight", wt}, {"fc1.bias", b3}, {"fc2.bias", c2}};
    const std::string e = error_of([&] { io::load_distributed_checkpoint(sharded, wrong); });
    require(e.find("2 mismatches with the network:\n  'fc1.weight': shape (16, 32) in the checkpoint, (32, 16) "
                   "expected\n  missing 'fc2.bias' (F32 (16,))") != std::string::npos,
            "a wrong network gave \"" + e + "\"");
  });
}
