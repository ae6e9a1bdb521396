// A mesh bound to a communicator: the communicator of this rank's process group over
// any list of mesh axes, created on first use and cached.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/tensor/device.hpp>

namespace tessera {

/// Binds a mesh (device matrix) to a world communicator `C` whose size is the mesh
/// size; rank r of the communicator is mesh rank r. Does not own the communicator.
///
///     tessera::mesh_comm mc(tessera::mesh{2, 4}, world);   // 8 ranks
///     auto& row = mc.group({1});     // the 4 ranks sharing this rank's axis-0 index
///     row.all_reduce(std::span<float>(partial), tessera::reduce_op::sum);
///
/// group(axes) is the group of core/mesh.hpp: the ranks that share this rank's
/// coordinates on every axis not in `axes`, member i being group_member(mesh, axes,
/// rank, i) (the first listed axis most significant). The axis order matters: {0, 1}
/// and {1, 0} order the same ranks differently, so they are different communicators.
///
/// Creating a group is collective over the world communicator (a split): every rank
/// must ask for the same new groups in the same order. SPMD programs and plans do so
/// naturally; a group asked for on one rank only deadlocks.
template <communicator C>
class mesh_comm {
 public:
  /// Throws tessera::error when the mesh is invalid or its size differs from
  /// world.size(): "mesh: the mesh size must equal the number of ranks: mesh size 4,
  /// communicator size 8".
  mesh_comm(const tessera::mesh& m, C& world) : mesh_(m), world_(&world) {
    require(check_mesh_size(m, world.size()));
  }

  mesh_comm(const mesh_comm&) = delete;
  mesh_comm& operator=(const mesh_comm&) = delete;
  mesh_comm(mesh_comm&&) noexcept = default;
  mesh_comm& operator=(mesh_comm&&) noexcept = default;

  /// The communicator of this rank's group over `axes` (ordered, major first). An
  /// empty list gives a one-rank group. Created on first use (collective), then cached.
  C& group(const axis_list& axes) {
    for (auto& [key, comm] : groups_)
      if (key == axes) return *comm;
    check_axes(axes);
    const int r = world_->rank();
    auto comm = std::make_unique<C>(
        world_->split(group_color(mesh_, axes, r), group_index(mesh_, axes, r)));
    C& ref = *comm;
    groups_.emplace_back(axes, std::move(comm));
    return ref;
  }

  const tessera::mesh& mesh() const noexcept { return mesh_; }
  C& world() noexcept { return *world_; }
  const C& world() const noexcept { return *world_; }
  /// This rank's index in the world communicator and the mesh.
  int rank() const { return world_->rank(); }

  /// Traffic of the world communicator plus every cached group.
  traffic total_stats() const {
    traffic t = world_->stats();
    for (const auto& g : groups_) t += g.second->stats();
    return t;
  }

  /// Resets the counters of the world communicator and of every cached group.
  void reset_stats() {
    world_->reset_stats();
    for (auto& g : groups_) g.second->reset_stats();
  }

 private:
  void check_axes(const axis_list& axes) const {
    if (axes.n < 0 || axes.n > max_mesh_ndim)
      throw error("mesh_comm::group: " + std::to_string(axes.n) + " axes listed, limit " +
                  std::to_string(max_mesh_ndim));
    for (int i = 0; i < axes.n; ++i) {
      if (axes[i] < 0 || axes[i] >= mesh_.ndim)
        throw error("mesh_comm::group: axis " + std::to_string(axes[i]) +
                    " is out of range for a mesh with " + std::to_string(mesh_.ndim) + " axes");
      for (int j = 0; j < i; ++j)
        if (axes[j] == axes[i])
          throw error("mesh_comm::group: axis " + std::to_string(axes[i]) + " is listed twice");
    }
  }

  tessera::mesh mesh_;
  C* world_;
  std::vector<std::pair<axis_list, std::unique_ptr<C>>> groups_;
};

/// The communicators of one world for every device matrix a program uses: operators
/// with different strategies have different device matrices over the same ranks
/// (MatMul ((2, 4), (4, 1)) uses (2, 4, 1), a data-parallel op (8,)). Each mesh's
/// mesh_comm, and so its groups, is created on first use (collectively) and kept.
template <communicator C>
class device_context {
 public:
  explicit device_context(C& world) : world_(&world) {}
  device_context(const device_context&) = delete;
  device_context& operator=(const device_context&) = delete;

  C& world() noexcept { return *world_; }
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }

  /// The mesh_comm of `m`; throws unless m spans the world's ranks.
  mesh_comm<C>& on(const tessera::mesh& m) {
    for (auto& mc : meshes_)
      if (mc->mesh() == m) return *mc;
    meshes_.push_back(std::make_unique<mesh_comm<C>>(m, *world_));
    return *meshes_.back();
  }

  /// Traffic of the world and of every group of every mesh.
  traffic total_stats() const {
    traffic t = world_->stats();
    for (const auto& mc : meshes_) t += mc->total_stats() - world_->stats();
    return t;
  }
  void reset_stats() {
    for (auto& mc : meshes_) mc->reset_stats();
    world_->reset_stats();
  }

 private:
  C* world_;
  std::vector<std::unique_ptr<mesh_comm<C>>> meshes_;
};

/// The context the training layers (autodiff/, nn/, optim/, train/, the graph executor)
/// run on: the device matrices of a world whose backend is chosen when the job starts
/// (any_communicator: MPI under mpiexec, one rank without a launcher, device buffers
/// for GPU tensors). Code below them (ops/, exec/) takes any device_context<C>.
///
///     tessera::run(argc, argv, [](tessera::any_communicator& world) {
///       tessera::context ctx(world);
///       ...
///     });
using context = device_context<any_communicator>;

/// The communicator for the shards of device D over the ranks of `host`, called as
/// `device_communicator(host, D{})`: for host shards a duplicate of `host` (this
/// overload); for GPU shards a staging communicator over a duplicate (comm/staged.hpp).
inline any_communicator device_communicator(any_communicator& host, cpu_device) { return host.split(0, host.rank()); }

}  // namespace tessera
