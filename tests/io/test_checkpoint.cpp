// Tests of io/checkpoint.hpp, run under mpiexec. Tensors of rank 0 to 2 in every
// layout of every mesh of M ranks (partial sums, maxima and minima included; float,
// double, int32, int64) are saved by M ranks, whole or per rank, then loaded by M'
// ranks into other layouts on other meshes, for every M, M' in {1, 2, 4, 8} up to the
// job's size: every loaded shard equals the original global tensor's box (and a
// partial target holds the values on the first rank of its partial group, the
// identity elsewhere). Also: the seed's scenario (semi-auto MatMul weight saved per
// rank, loaded into another strategy and into one process), every mismatch with the
// network in one error, failures on one rank reported on all, and corrupt shard
// files named in the error.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/io/checkpoint.hpp>
#include "error_text.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

std::vector<mesh> meshes_for(int p) {
  switch (p) {
    case 1: return {mesh{1}};
    case 2: return {mesh{2}};
    case 4: return {mesh{4}, mesh{2, 2}};
    case 8: return {mesh{8}, mesh{2, 4}, mesh{4, 2}, mesh{2, 2, 2}};
    default: return {mesh{p}};
  }
}

std::vector<int> sizes_up_to(int n) {
  std::vector<int> out;
  for (int m : {1, 2, 4, 8})
    if (m <= n) out.push_back(m);
  return out;
}

// A directory all ranks share (one host): named after rank 0's process id.
struct shared_dir {
  fs::path path;
  mpi_communicator& world;
  shared_dir(mpi_communicator& w, const std::string& tag) : world(w) {
    std::int64_t pid[1] = {w.rank() == 0 ? std::int64_t(::getpid()) : 0};
    w.broadcast(std::span<std::int64_t>(pid, 1), 0);
    path = fs::temp_directory_path() / ("tessera_test_checkpoint_" + tag + "_" + std::to_string(pid[0]));
    if (w.rank() == 0) {
      fs::remove_all(path);
      fs::create_directories(path);
    }
    w.barrier();
  }
  ~shared_dir() {
    world.barrier();
    std::error_code ec;
    if (world.rank() == 0) fs::remove_all(path, ec);
  }
};

index_t linear(const extents& g, const std::array<index_t, max_tensor_ndim>& idx) {
  index_t lin = 0;
  for (int d = 0; d < g.ndim; ++d) lin = lin * g.v[d] + idx[d];
  return lin;
}

// The global value of tensor k at a linear index: small integers, exact in every
// element type, so that partial sums are exact; different per tensor, so that a
// mix-up shows.
template <class T>
T truth(int k, index_t lin) {
  return T((lin * 7 + k * 13) % 101 + 1);
}

// A tensor of some element type behind one interface.
struct any_tensor {
  virtual ~any_tensor() = default;
  virtual io::param_ref ref(const std::string& name) = 0;
  /// Sets this rank's share of tensor k's values (for a partial layout, shares that
  /// reduce to the truth over the partial group).
  virtual void fill_source(int k) = 0;
  /// Elements of the shard that differ from what loading tensor k must give.
  virtual index_t wrong(int k) const = 0;
};

template <class T>
struct typed_tensor final : any_tensor {
  dist_tensor<T> t;
  typed_tensor(const layout& l, const extents& g, int rank) : t(l, g, rank) {}

  io::param_ref ref(const std::string& name) override { return io::param_ref(name, t); }

  void fill_source(int k) override {
    const layout& l = t.layout();
    axis_list pax;
    for (int a = 0; a < l.dev.ndim; ++a)
      if (l.is_partial(a)) pax.push_back(a);
    const int q = group_size(l.dev, pax), j = group_index(l.dev, pax, t.rank());
    const extents g = t.global_shape();
    t.fill_global([&](const auto& idx) {
      const index_t lin = linear(g, idx);
      const T v = truth<T>(k, lin), other = T(lin % 3 + 1);
      if (q == 1) return v;
      switch (l.op) {
        case reduce_op::max: return j == 0 ? v : T(v - other);
        case reduce_op::min: return j == 0 ? v : T(v + other);
        default: return j == 0 ? T(v - T(q - 1) * other) : other;
      }
    });
  }

  index_t wrong(int k) const override {
    const layout& l = t.layout();
    const mesh_coords c = l.dev.coords(t.rank());
    bool holder = true;  // the first rank of the partial group holds the values
    for (int a = 0; a < l.dev.ndim; ++a) holder = holder && (!l.is_partial(a) || c[a] == 0);
    dist_tensor<T> want(l, t.global_shape(), t.rank());
    const extents g = t.global_shape();
    want.fill_global([&](const auto& idx) { return holder ? truth<T>(k, linear(g, idx)) : reduce_identity<T>(l.op); });
    index_t bad = 0;
    for (std::size_t i = 0; i < want.local().size(); ++i) bad += t.local().data()[i] != want.local().data()[i];
    return bad;
  }
};

std::unique_ptr<any_tensor> make_tensor(int k, const layout& l, const extents& g, int rank) {
  switch (k % 4) {
    case 0: return std::make_unique<typed_tensor<float>>(l, g, rank);
    case 1: return std::make_unique<typed_tensor<double>>(l, g, rank);
    case 2: return std::make_unique<typed_tensor<std::int32_t>>(l, g, rank);
    default: return std::make_unique<typed_tensor<std::int64_t>>(l, g, rank);
  }
}

extents cube(int ndim) {
  extents g;
  g.ndim = ndim;
  for (int d = 0; d < ndim; ++d) g.v[d] = 8;
  return g;
}

// The source tensors on mesh m: every layout of ranks 0 to 2 (partial sums), and of
// rank 1 with partial maxima and minima.
std::vector<layout> source_layouts(const mesh& m) {
  std::vector<layout> out;
  for (int nd = 0; nd <= 2; ++nd) for_each_layout(m, nd, true, [&](const layout& l) { out.push_back(l); });
  for (reduce_op op : {reduce_op::max, reduce_op::min})
    for_each_layout(m, 1, true, [&](const layout& l) { if (l.has_partial()) out.push_back(l); }, op);
  return out;
}

// Target layouts on mesh m per tensor rank (partial sums included).
std::vector<std::vector<layout>> target_layouts(const mesh& m) {
  std::vector<std::vector<layout>> out(3);
  for (int nd = 0; nd <= 2; ++nd) for_each_layout(m, nd, true, [&](const layout& l) { out[nd].push_back(l); });
  return out;
}

std::string tensor_name(int k) {
  std::string name(1, 't');
  name += std::to_string(k);
  return name;
}

// Loads `file` into targets on every mesh of every size M' (this rank takes part when
// it is below M'), the k-th source tensor into the layout of its rank chosen by
// (k * 7 + shift * 5); returns the number of tensors checked. `whole` loads whole
// files also through load_checkpoint + load_param_into_net.
int load_everywhere(const fs::path& file, const std::vector<layout>& sources, int world_rank, int world_size,
                    int shifts, bool whole) {
  int checked = 0;
  std::unique_ptr<io::checkpoint> dict;
  if (whole) dict = std::make_unique<io::checkpoint>(io::load_checkpoint(file));
  for (int m2 : sizes_up_to(world_size)) {
    if (world_rank >= m2) continue;
    for (const mesh& tm : meshes_for(m2)) {
      const std::vector<std::vector<layout>> targets = target_layouts(tm);
      for (int shift = 0; shift < shifts; ++shift)
        for (int via_dict = 0; via_dict <= (whole ? 1 : 0); ++via_dict) {
          std::vector<std::unique_ptr<any_tensor>> ts;
          std::vector<io::param_ref> refs;
          for (std::size_t k = 0; k < sources.size(); ++k) {
            const int nd = sources[k].ndim;
            const std::vector<layout>& choices = targets[std::size_t(nd)];
            const layout& tl = choices[(k * 7 + std::size_t(shift) * 5) % choices.size()];
            ts.push_back(make_tensor(int(k), tl, cube(nd), world_rank));
            refs.push_back(ts.back()->ref(tensor_name(int(k))));
          }
          if (via_dict) io::load_param_into_net(*dict, refs);
          else io::load_distributed_checkpoint(file, refs);
          for (std::size_t k = 0; k < ts.size(); ++k) {
            const index_t bad = ts[k]->wrong(int(k));
            if (bad) {
              const layout& tl = refs[k].layout();
              FAIL_CHECK("rank " << world_rank << ": " << file.string() << ": t" << k << " saved as "
                                 << to_string(sources[k]) << " on mesh " << to_string(sources[k].dev)
                                 << ", loaded as " << to_string(tl) << " on mesh " << to_string(tl.dev) << ": "
                                 << bad << " wrong elements" << (via_dict ? " (load_param_into_net)" : ""));
            }
            ++checked;
          }
        }
    }
  }
  return checked;
}

// Saves every source layout on every mesh of every size M (the first M ranks, through
// their own communicator), then loads everywhere.
void save_and_load_everywhere(bool integrated) {
  mpi_communicator world = mpi_communicator::world();
  const int me = world.rank(), n = world.size();
  shared_dir dir(world, integrated ? "whole" : "shard");
  long checked = 0, saved = 0;
  for (int m : sizes_up_to(n)) {
    mpi_communicator sub = world.split(me < m ? 0 : 1, me);
    int mesh_index = 0;
    for (const mesh& sm : meshes_for(m)) {
      const std::vector<layout> sources = source_layouts(sm);
      const fs::path file = dir.path / ("M" + std::to_string(m) + "_mesh" + std::to_string(mesh_index++)) / "net.safetensors";
      if (me < m) {
        device_context<mpi_communicator> ctx(sub);
        std::vector<std::unique_ptr<any_tensor>> ts;
        std::vector<io::param_ref> refs;
        for (std::size_t k = 0; k < sources.size(); ++k) {
          ts.push_back(make_tensor(int(k), sources[k], cube(sources[k].ndim), me));
          ts.back()->fill_source(int(k));
          refs.push_back(ts.back()->ref(tensor_name(int(k))));
        }
        io::save_options opt;
        opt.integrated_save = integrated;
        opt.metadata["epoch"] = "1";
        const fs::path wrote = io::save_checkpoint(file, refs, ctx, opt);
        CHECK(wrote == (integrated ? file : io::rank_file(file, me)));
        saved += long(sources.size());
      }
      world.barrier();
      if (integrated) {
        CHECK(fs::exists(file));
        CHECK(!fs::exists(io::rank_file(file, 0)));
      } else {
        CHECK(!fs::exists(file));
        for (int r = 0; r < m; ++r) CHECK(fs::exists(io::rank_file(file, r)));
      }
      checked += load_everywhere(file, sources, me, n, integrated ? 1 : 2, integrated);
      world.barrier();
    }
  }
  if (me == 0)
    MESSAGE(n << " ranks, " << std::string(integrated ? "whole" : "per-rank") << " checkpoints: " << saved
              << " tensors saved by rank 0, " << checked << " loaded shards checked on rank 0");
  CHECK(checked > 0);
}

using testing::error_of;

}  // namespace

TEST_CASE("per-rank checkpoints (integrated_save off) load into any layout on any number of ranks") {
  save_and_load_everywhere(false);
}

TEST_CASE("whole checkpoints load into any layout on any number of ranks") { save_and_load_everywhere(true); }

TEST_CASE("seed 003: a semi-auto MatMul weight saved per rank, loaded into another strategy and one process") {
  mpi_communicator world = mpi_communicator::world();
  const int me = world.rank(), n = world.size();
  if (n < 2) return;
  shared_dir dir(world, "seed");
  device_context<mpi_communicator> ctx(world);
  // MatMul().shard(((1, 1), (1, 2))): the weight (512, 128) split in two along its
  // columns, replicated over the other n / 2 ranks.
  const layout w_layout = strategy_layout(split_tuple{1, 2}, n);
  dist_tensor<float> w(w_layout, extents{512, 128}, me);
  w.fill_global([](const auto& i) { return float(i[0] * 128 + i[1]) * 0.5f; });
  const fs::path file = dir.path / "ckpt" / "semi_auto_parallel-1_156.safetensors";
  std::vector<io::param_ref> refs{{"weight", w}};
  io::save_checkpoint(file, refs, ctx, {.integrated_save = false, .metadata = {}});
  world.barrier();
  // another strategy on the same ranks: rows split n ways
  dist_tensor<float> rows(strategy_layout(split_tuple{n, 1}, n), extents{512, 128}, me);
  std::vector<io::param_ref> into{{"weight", rows}};
  io::load_distributed_checkpoint(file, into);
  dist_tensor<float> want(rows.layout(), extents{512, 128}, me);
  want.fill_global([](const auto& i) { return float(i[0] * 128 + i[1]) * 0.5f; });
  CHECK(rows.local() == want.local());
  // a cluster of one: the whole weight in one process (each rank does it alone)
  dist_tensor<float> one(layout::replicated(mesh{1}, 2), extents{512, 128}, 0);
  std::vector<io::param_ref> whole{{"weight", one}};
  io::load_distributed_checkpoint(file, whole);
  dist_tensor<float> all(one.layout(), extents{512, 128}, 0);
  all.fill_global([](const auto& i) { return float(i[0] * 128 + i[1]) * 0.5f; });
  CHECK(one.local() == all.local());
}

TEST_CASE("checkpoint errors: every mismatch with the network, on every rank, in one message") {
  mpi_communicator world = mpi_communicator::world();
  const int me = world.rank(), n = world.size();
  shared_dir dir(world, "errors");
  device_context<mpi_communicator> ctx(world);
  const layout rows(mesh{n}, {{0}, {}});
  dist_tensor<float> w(rows, extents{8, 4}, me), b(layout::replicated(mesh{n}, 1), extents{4}, me);
  dist_tensor<std::int64_t> step(layout::replicated(mesh{n}, 0), extents{}, me);
  std::vector<io::param_ref> net{{"fc.weight", w}, {"fc.bias", b}, {"step", step}};
  const fs::path whole = dir.path / "whole.safetensors", shards = dir.path / "shards.safetensors";
  io::save_checkpoint(whole, net, ctx);
  io::save_checkpoint(shards, net, ctx, {.integrated_save = false, .metadata = {}});
  world.barrier();

  dist_tensor<float> w2(rows, extents{16, 4}, me), extra(layout::replicated(mesh{n}, 1), extents{2}, me);
  dist_tensor<double> step2(layout::replicated(mesh{n}, 0), extents{}, me);
  std::vector<io::param_ref> other{{"fc.weight", w2}, {"step", step2}, {"extra", extra}};
  const std::string lines =
      " mismatches with the network:\n"
      "  'fc.weight': shape (8, 4) in the checkpoint, (16, 4) expected\n"
      "  'step': dtype I64 in the checkpoint, F64 expected\n"
      "  missing 'extra' (F32 (2,))";
  CHECK(error_of([&] { io::load_distributed_checkpoint(whole, other); }) ==
        "load_distributed_checkpoint: " + whole.string() + ": 4" + lines + "\n  unexpected 'fc.bias' (F32 (4,))");
  CHECK(error_of([&] { io::load_distributed_checkpoint(whole, other, false); }) ==
        "load_distributed_checkpoint: " + whole.string() + ": 3" + lines);
  CHECK(error_of([&] { io::load_distributed_checkpoint(shards, other); }) ==
        "load_distributed_checkpoint: " + shards.string() + " (" + std::to_string(n) + " shard files): 4" + lines +
            "\n  unexpected 'fc.bias' (F32 (4,))");
  CHECK(error_of([&] { io::load_param_into_net(io::load_checkpoint(whole), other); }) ==
        "load_param_into_net: " + whole.string() + ": 4" + lines + "\n  unexpected 'fc.bias' (F32 (4,))");
  CHECK(error_of([&] { io::load_param_into_net(io::load_checkpoint(io::rank_file(shards, me)), net); }) ==
        "load_param_into_net: " + io::rank_file(shards, me).string() +
            ": the file holds one rank's shards (saved with integrated_save off); load it with load_distributed_checkpoint");
  CHECK(error_of([&] { io::load_distributed_checkpoint(io::rank_file(shards, me), net); }) ==
        "load_distributed_checkpoint: " + io::rank_file(shards, me).string() +
            ": the file holds one rank's shards; pass the checkpoint's name without the rank_R folder (DIR/NAME for "
            "DIR/rank_R/NAME)");
  CHECK(error_of([&] { io::load_distributed_checkpoint(dir.path / "none.safetensors", net); }) ==
        "load_distributed_checkpoint: neither " + (dir.path / "none.safetensors").string() +
            " (a whole checkpoint) nor " + (dir.path / "rank_0" / "none.safetensors").string() +
            " (rank 0's shards) exists");
  const dist_tensor<float>& cw = w;
  std::vector<io::param_ref> read_only{{"fc.weight", cw}};
  CHECK(error_of([&] { io::load_distributed_checkpoint(whole, read_only, false); }) ==
        "param_ref: 'fc.weight' views a const tensor and cannot be loaded into");
  std::vector<io::param_ref> twice{{"a", w}, {"a", b}};
  CHECK(error_of([&] { io::save_checkpoint(whole, twice, ctx); }) == "save_checkpoint: the name 'a' is used twice");
  CHECK(error_of([&] { io::save_checkpoint(whole, net, ctx, {.integrated_save = true, .metadata = {{"tessera.kind", "x"}}}); }) ==
        "save_checkpoint: metadata key \"tessera.kind\" is reserved (keys starting with \"tessera.\" or holding ':' "
        "describe the tensors)");
  dist_tensor<float> small(layout::replicated(mesh{1}, 1), extents{4}, 0);
  std::vector<io::param_ref> wrong_mesh{{"s", small}};
  if (n > 1)
    CHECK(error_of([&] { io::save_checkpoint(whole, wrong_mesh, ctx); }) ==
          "save_checkpoint: mesh: the mesh size must equal the number of ranks: mesh size 1, communicator size " +
              std::to_string(n) + "; tensor 's' on mesh (1,)");
  world.barrier();
}

TEST_CASE("checkpoint errors: a failure on one rank is reported on every rank") {
  mpi_communicator world = mpi_communicator::world();
  const int me = world.rank(), n = world.size();
  shared_dir dir(world, "failures");
  device_context<mpi_communicator> ctx(world);
  dist_tensor<float> w(layout(mesh{n}, {{0}}), extents{8}, me);
  std::vector<io::param_ref> net{{"w", w}};
  // different tensor lists on different ranks: an error everywhere, not a hang
  if (n > 1) {
    dist_tensor<float> b(layout::replicated(mesh{n}, 1), extents{3}, me);
    std::vector<io::param_ref> mine = net;
    if (me == n - 1) mine.push_back(io::param_ref("b", b));
    CHECK(error_of([&] { io::save_checkpoint(dir.path / "x.safetensors", mine, ctx); }) ==
          "save_checkpoint: the ranks passed different tensor lists (names, dtypes, shapes or layouts); every rank "
          "must save the same tensors in the same order");
  }
  // rank 0 cannot write the whole file: a regular file where its folder should be
  if (me == 0) std::ofstream(dir.path / "blocked") << "x";
  world.barrier();
  const std::string whole_error = error_of([&] { io::save_checkpoint(dir.path / "blocked" / "x.safetensors", net, ctx); });
  CHECK(whole_error.rfind("save_checkpoint: ", 0) == 0);
  CHECK(whole_error.find((dir.path / "blocked").string()) != std::string::npos);
  // the last rank cannot write its shard file
  const int victim = n - 1;
  if (me == 0) std::ofstream(dir.path / ("rank_" + std::to_string(victim))) << "x";
  world.barrier();
  const std::string shard_error =
      error_of([&] { io::save_checkpoint(dir.path / "y.safetensors", net, ctx, {.integrated_save = false, .metadata = {}}); });
  if (me == victim) {
    CHECK(shard_error.rfind("save_checkpoint: rank " + std::to_string(victim) + ": ", 0) == 0);
  } else {
    CHECK(shard_error == "save_checkpoint: rank " + std::to_string(victim) + " failed to write its shard file " +
                             io::rank_file(dir.path / "y.safetensors", victim).string());
  }
  world.barrier();
}

TEST_CASE("checkpoint errors: corrupt or mismatched shard files are named in the error") {
  mpi_communicator world = mpi_communicator::world();
  const int me = world.rank(), n = world.size();
  if (n < 2) return;
  shared_dir dir(world, "corrupt");
  device_context<mpi_communicator> ctx(world);
  dist_tensor<float> w(layout(mesh{n}, {{0}, {}}), extents{2 * n, 3}, me);
  std::vector<io::param_ref> net{{"w", w}};
  const fs::path file = dir.path / "c.safetensors";
  io::save_checkpoint(file, net, ctx, {.integrated_save = false, .metadata = {}});
  world.barrier();
  // everything below reads files only: each rank checks on its own
  dist_tensor<float> all(layout::replicated(mesh{1}, 2), extents{2 * n, 3}, 0);
  std::vector<io::param_ref> into{{"w", all}};
  const fs::path r1 = io::rank_file(file, 1);
  const std::string saved = [&] {
    std::ifstream in(r1, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto with_rank1 = [&](const std::string& bytes, auto&& check) {
    world.barrier();
    if (me == 0) std::ofstream(r1, std::ios::binary | std::ios::trunc) << bytes;
    world.barrier();
    check(error_of([&] { io::load_distributed_checkpoint(file, into); }));
    world.barrier();
  };
  const std::string at = "load_distributed_checkpoint: " + r1.string() + ": ";
  // rank 0's file copied over rank 1's
  {
    std::ifstream in(io::rank_file(file, 0), std::ios::binary);
    const std::string r0((std::istreambuf_iterator<char>(in)), {});
    with_rank1(r0, [&](const std::string& e) { CHECK(e == at + "the file says it was written by rank 0, expected 1"); });
  }
  // a different recorded offset
  {
    std::string bad = saved;
    const std::string from = "\"offset:w\":\"(2, 0)\"";
    const auto pos = bad.find(from);
    REQUIRE(pos != std::string::npos);
    bad.replace(pos, from.size(), "\"offset:w\":\"(0, 0)\"");
    with_rank1(bad, [&](const std::string& e) {
      CHECK(e == at + "tensor 'w' records offset (0, 0), but layout [0, -] on mesh (" + std::to_string(n) +
                     ",) puts rank 1's shard at (2, 0)");
    });
  }
  // truncated
  with_rank1(saved.substr(0, saved.size() - 4), [&](const std::string& e) {
    CHECK(e.rfind("safetensors: " + r1.string() + ": tensor 'w': data_offsets [0, 24] run past the end", 0) == 0);
  });
  // missing
  world.barrier();
  if (me == 0) fs::remove(r1);
  world.barrier();
  CHECK(error_of([&] { io::load_distributed_checkpoint(file, into); }) == "safetensors: " + r1.string() + ": cannot open the file");
  // a target that needs only rank 0's rows never opens rank 1's file
  dist_tensor<float> part(layout(mesh{n}, {{0}, {}}), extents{2 * n, 3}, 0);
  std::vector<io::param_ref> first{{"w", part}};
  CHECK_NOTHROW(io::load_distributed_checkpoint(file, first));
  world.barrier();
}
