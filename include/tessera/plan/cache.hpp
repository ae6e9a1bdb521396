// Run-time plans, planned once per process: plan_across_meshes (a redistribution
// between layouts on two device matrices of the same ranks, on their common
// refinement) and cached_plan, the same through a process-wide, thread-safe cache
// keyed by (from, to, global shape, element bytes). Every run-time planning call site
// asks cached_plan; plans between static layouts stay compile-time constants
// (static_plan) and never reach the cache. Standard library only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/plan/planner.hpp>

namespace tessera {

/// A redistribution between layouts on two device matrices of the same ranks: both
/// layouts written on the matrices' common refinement `fine` (core/refine.hpp), where
/// every shard stays put, and `p` planned there. On one device matrix, `fine` is that
/// matrix and `p` the plan between the layouts as given.
struct refined_plan {
  mesh fine;  ///< the device matrix `p` runs on
  plan p;     ///< the cheapest plan on `fine`
  friend constexpr bool operator==(const refined_plan&, const refined_plan&) = default;
};

/// The cheapest redistribution of a tensor of shape `global` from `from` to `to`,
/// possibly on different device matrices of the same ranks (each operator has its own).
/// Example: the seed's first MatMul output ([0, 2] partial sum {1} on (2, 4, 1)) to
/// ReLU (2, 4) ([0, 1] on (2, 4)), (16, 16) floats: fine (2, 4), one reduce_scatter
/// over mesh axis 1, 384 bytes per rank.
/// @pre check_refinement(from.dev, to.dev).ok() (throws tessera::error otherwise),
///      and the planner's own preconditions on the refined layouts.
constexpr refined_plan plan_across_meshes(const layout& from, const layout& to, const extents& global,
                                          index_t elem_bytes) {
  if (from.dev == to.dev) return refined_plan{from.dev, plan_redistribution(from, to, global, elem_bytes)};
  require(check_refinement(from.dev, to.dev), "plan_across_meshes");
  const mesh fine = common_refinement(from.dev, to.dev);
  return refined_plan{fine, plan_redistribution(refine(from, fine), refine(to, fine), global, elem_bytes)};
}

/// What a plan_cache holds and has done.
struct plan_cache_stats {
  std::size_t entries = 0;    ///< plans held now
  std::uint64_t hits = 0;     ///< lookups answered from the cache
  std::uint64_t planned = 0;  ///< planner runs (lookups that were not)
  std::uint64_t clears = 0;   ///< times the cache was full and emptied
};

/// Plans keyed by (from, to, global shape, element bytes), each planned once.
///
/// Thread-safe: lookups share a reader lock; a miss plans outside any lock (other
/// threads keep reading meanwhile) and inserts under the writer lock (two threads
/// missing the same key at once both plan, and the first insert wins).
///
/// Bounded: at most `capacity` plans (about 6.8 KiB each, so under 7 MiB); a miss that
/// finds the cache full empties it first. A program meets a fixed set of keys (its
/// operators' layouts times its values' shapes: tens to hundreds), so in steady state
/// nothing is evicted and every lookup hits; the bound only caps the memory of a
/// process whose shapes keep changing (variable sequence lengths, strategy searches
/// over many candidates), whose old keys are unlikely to recur, so emptying the whole
/// cache serves as well as a finer eviction policy and costs nothing on the hit path.
/// Lookups return shared pointers, so a plan being executed outlives a clear.
class plan_cache {
 public:
  static constexpr std::size_t capacity = 1024;

  /// The plan_across_meshes of the key, planned on the first lookup only. Throws what
  /// plan_across_meshes throws (nothing is cached then).
  std::shared_ptr<const refined_plan> get(const layout& from, const layout& to, const extents& global,
                                          index_t elem_bytes) {
    const key k{from, to, global, elem_bytes};
    {
      std::shared_lock lock(mutex_);
      if (auto it = plans_.find(k); it != plans_.end()) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        return it->second;
      }
    }
    auto made = std::make_shared<const refined_plan>(plan_across_meshes(from, to, global, elem_bytes));
    planned_.fetch_add(1, std::memory_order_relaxed);
    std::unique_lock lock(mutex_);
    if (plans_.size() >= capacity && !plans_.contains(k)) {
      plans_.clear();
      clears_.fetch_add(1, std::memory_order_relaxed);
    }
    return plans_.try_emplace(k, std::move(made)).first->second;
  }

  plan_cache_stats stats() const {
    plan_cache_stats s;
    {
      std::shared_lock lock(mutex_);
      s.entries = plans_.size();
    }
    s.hits = hits_.load(std::memory_order_relaxed);
    s.planned = planned_.load(std::memory_order_relaxed);
    s.clears = clears_.load(std::memory_order_relaxed);
    return s;
  }
  /// Empties the cache (counted in clears): what a benchmark of cold planning calls
  /// between runs. Plans already handed out stay valid.
  void clear() {
    std::unique_lock lock(mutex_);
    plans_.clear();
    clears_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  struct key {
    layout from, to;
    extents global;
    index_t elem_bytes = 0;
    friend bool operator==(const key&, const key&) = default;
  };
  struct key_hash {
    // Hashes the fields equality reads that are in use (unused array entries are equal
    // in equal keys, so leaving them out keeps the hash consistent with ==).
    static void mix(std::size_t& h, std::uint64_t v) {
      h ^= std::size_t(v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    }
    static void mix(std::size_t& h, const layout& l) {
      mix(h, std::uint64_t(l.dev.ndim));
      for (int a = 0; a < l.dev.ndim && a < max_mesh_ndim; ++a) mix(h, std::uint64_t(l.dev.dims[a]));
      mix(h, std::uint64_t(l.ndim));
      for (int d = 0; d < l.ndim && d < max_tensor_ndim; ++d) {
        mix(h, std::uint64_t(l.split[d].n));
        for (int i = 0; i < l.split[d].n && i < max_mesh_ndim; ++i) mix(h, std::uint64_t(l.split[d].v[i]));
      }
      mix(h, std::uint64_t(l.partial) << 8 | std::uint64_t(l.op));
    }
    std::size_t operator()(const key& k) const {
      std::size_t h = 0;
      mix(h, k.from);
      mix(h, k.to);
      mix(h, std::uint64_t(k.global.ndim));
      for (int d = 0; d < k.global.ndim && d < max_tensor_ndim; ++d) mix(h, std::uint64_t(k.global.v[d]));
      mix(h, std::uint64_t(k.elem_bytes));
      return h;
    }
  };

  mutable std::shared_mutex mutex_;
  std::unordered_map<key, std::shared_ptr<const refined_plan>, key_hash> plans_;
  std::atomic<std::uint64_t> hits_{0}, planned_{0}, clears_{0};
};

/// The process's plan cache (one for the whole program, every translation unit).
inline plan_cache& process_plan_cache() {
  static plan_cache cache;
  return cache;
}

/// plan_across_meshes(from, to, global, elem_bytes), planned once per process: the
/// entry point of every run-time planning call site.
inline std::shared_ptr<const refined_plan> cached_plan(const layout& from, const layout& to, const extents& global,
                                                       index_t elem_bytes) {
  return process_plan_cache().get(from, to, global, elem_bytes);
}

}  // namespace tessera
