// Pipeline schedules (MindSpore's pipeline_stages with micro_size; the orders of GPipe,
// 1F1B and Megatron's interleaved 1F1B): the order in which each stage runs the
// forward and backward passes of its micro-batches, and a simulation of those orders
// that gives a step's length, its bubble (the share of time stages wait) and the
// micro-batches each stage holds at once. The graph executor runs the same orders.
// Standard library only.
//
// The ranks form S stages of equal size. Each stage holds V chunks of the network
// (virtual stages; V = 1 except in the interleaved schedule): chunk c of physical stage
// s is virtual stage c S + s, so that micro-batches pass through the physical stages V
// times. A unit is one chunk's forward or backward pass of one micro-batch. A stage
// sends its outputs without waiting (non-blocking sends) and waits only for the inputs
// of the unit it runs next, so an order runs exactly when every unit's inputs were
// produced by units that can run before it: simulate_schedule checks that.
//
// | schedule                | order on stage s                                 | units held at once (M large) | bubble            |
// |-------------------------|--------------------------------------------------|------------------------------|-------------------|
// | gpipe                   | every forward, chunk by chunk, then every backward | M V                        | (S-1) / (V M + S - 1) |
// | one_f_one_b (V = 1)     | S-s-1 forwards, then one forward and one backward in turn, then the backwards left | S - s | (S-1) / (M + S - 1) |
// | interleaved_one_f_one_b | Megatron's: chunks in turns of S micro-batches, 2 (S-s-1) + (V-1) S forwards before the first backward | 2 (S-s-1) + (V-1) S + 1 | (S-1) / (V M + S - 1) |
//
// (The bubble with each chunk's forward taking f / V and backward b / V, as
// simulate_schedule finds it; tests/graph/test_pipeline.cpp checks these formulas.)
//
// Worked example: S = 2 stages, M = 4 micro-batches, one_f_one_b. Stage 0 runs F0 F1 B0
// F2 B1 F3 B2 B3, stage 1 runs F0 B0 F1 B1 F2 B2 F3 B3. With forward 1 and backward 2
// time units the step takes (M + S - 1)(f + b) = 15 units, of which each stage works
// M (f + b) = 12: the bubble is 3 / 15 = 0.2, and stage 0 holds 2 micro-batches at once.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>

namespace tessera::graph {

/// The order of a pipeline's units (see the top of this header).
enum class pipeline_schedule { gpipe, one_f_one_b, interleaved_one_f_one_b };

constexpr std::string_view to_string(pipeline_schedule k) {
  switch (k) {
    case pipeline_schedule::gpipe: return "gpipe";
    case pipeline_schedule::one_f_one_b: return "one_f_one_b";
    case pipeline_schedule::interleaved_one_f_one_b: return "interleaved_one_f_one_b";
  }
  return "?";
}

/// The schedule named `text` ("gpipe", "one_f_one_b", "interleaved_one_f_one_b");
/// throws tessera::error naming the three.
inline pipeline_schedule parse_pipeline_schedule(std::string_view text) {
  for (pipeline_schedule k :
       {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b, pipeline_schedule::interleaved_one_f_one_b})
    if (text == to_string(k)) return k;
  throw error("pipeline_schedule: '" + std::string(text) + "' is not gpipe, one_f_one_b or interleaved_one_f_one_b");
}

/// One unit of a stage's order: the forward (or backward) pass of micro-batch `micro`
/// through the stage's chunk `chunk` (virtual stage chunk S + stage).
struct pipeline_unit {
  bool forward = true;
  int chunk = 0;
  int micro = 0;
  bool operator==(const pipeline_unit&) const = default;
};

/// Throws tessera::error unless the schedule can run `stages` stages of `chunks`
/// chunks each with `micro` micro-batches: all at least 1; one_f_one_b runs one chunk
/// per stage; the interleaved schedule with several chunks takes micro-batches in turns
/// of `stages`, so `stages` must divide `micro`.
inline void check_schedule(pipeline_schedule k, int stages, int chunks, int micro) {
  const std::string who = "pipeline " + std::string(to_string(k)) + ": ";
  if (stages < 1) throw error(who + "pipeline_stages must be at least 1, got " + std::to_string(stages));
  if (chunks < 1) throw error(who + "the chunks per stage must be at least 1, got " + std::to_string(chunks));
  if (micro < 1) throw error(who + "micro_size must be at least 1, got " + std::to_string(micro));
  if (k == pipeline_schedule::one_f_one_b && chunks > 1)
    throw error(who + "runs one chunk per stage; the operators are on " + std::to_string(stages * chunks) +
                " virtual stages of " + std::to_string(stages) +
                " pipeline stages (" + std::to_string(chunks) +
                " chunks each): use interleaved_one_f_one_b or gpipe");
  if (k == pipeline_schedule::interleaved_one_f_one_b && chunks > 1 && micro % stages != 0)
    throw error(who + "takes micro-batches in turns of pipeline_stages: micro_size " + std::to_string(micro) +
                " is not a multiple of " + std::to_string(stages));
}

/// The order in which physical stage `stage` (0 .. stages - 1) runs its units.
inline std::vector<pipeline_unit> schedule_order(pipeline_schedule k, int stages, int chunks, int micro, int stage) {
  check_schedule(k, stages, chunks, micro);
  if (stage < 0 || stage >= stages)
    throw error("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(stages) + " stages");
  std::vector<pipeline_unit> order;
  const int S = stages, V = chunks, M = micro, s = stage;
  switch (k) {
    case pipeline_schedule::gpipe:
      for (int c = 0; c < V; ++c)
        for (int m = 0; m < M; ++m) order.push_back({true, c, m});
      for (int c = V - 1; c >= 0; --c)
        for (int m = 0; m < M; ++m) order.push_back({false, c, m});
      break;
    case pipeline_schedule::one_f_one_b: {
      const int warmup = std::min(S - s - 1, M);
      for (int m = 0; m < warmup; ++m) order.push_back({true, 0, m});
      for (int m = warmup; m < M; ++m) {
        order.push_back({true, 0, m});
        order.push_back({false, 0, m - warmup});
      }
      for (int m = M - warmup; m < M; ++m) order.push_back({false, 0, m});
      break;
    }
    case pipeline_schedule::interleaved_one_f_one_b: {
      // Unit k of M V: turns of S micro-batches through chunk 0, then chunk 1, ...
      // (the backwards through the chunks in reverse).
      const int total = M * V;
      auto unit = [&](int k, bool fwd) {
        const int group = k / (S * V), in = k % (S * V);
        const int c = in / S;
        return pipeline_unit{fwd, fwd ? c : V - 1 - c, V == 1 ? k : group * S + in % S};
      };
      const int warmup = std::min((S - s - 1) * 2 + (V - 1) * S, total);
      for (int i = 0; i < warmup; ++i) order.push_back(unit(i, true));
      for (int i = 0; i < total - warmup; ++i) {
        order.push_back(unit(warmup + i, true));
        order.push_back(unit(i, false));
      }
      for (int i = total - warmup; i < total; ++i) order.push_back(unit(i, false));
      break;
    }
  }
  return order;
}

/// What simulate_schedule finds.
struct pipeline_timing {
  double makespan = 0;         ///< the step's length
  double bubble_fraction = 0;  ///< 1 - the stages' work / (stages x makespan)
  std::vector<int> peak_units; ///< per stage, the most units forwarded and not yet backwarded at once
};

/// Runs the orders of every stage against each other, each unit starting when its stage
/// is free and its input is ready (forward of virtual stage v after forward of v - 1;
/// backward of v after backward of v + 1, and after its own forward), a forward of one
/// chunk taking `forward_time` / chunks and a backward `backward_time` / chunks (the
/// network cut into S V equal parts; transfers free). Throws tessera::error if the
/// orders deadlock (a stage waits for a unit that waits for it).
inline pipeline_timing simulate_schedule(pipeline_schedule k, int stages, int chunks, int micro,
                                         double forward_time = 1, double backward_time = 2) {
  const int S = stages, V = chunks, M = micro, VS = stages * chunks;
  std::vector<std::vector<pipeline_unit>> orders;
  for (int s = 0; s < S; ++s) orders.push_back(schedule_order(k, S, V, M, s));
  const double f = forward_time / V, b = backward_time / V;
  // Finish times of each (virtual stage, micro-batch)'s forward and backward; < 0: not yet.
  std::vector<double> fdone(std::size_t(VS * M), -1), bdone(std::size_t(VS * M), -1);
  std::vector<std::size_t> next(std::size_t(S), 0);
  std::vector<double> free_at(std::size_t(S), 0);
  pipeline_timing t;
  t.peak_units.assign(std::size_t(S), 0);
  std::vector<int> held(std::size_t(S), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      while (next[std::size_t(s)] < orders[std::size_t(s)].size()) {
        const pipeline_unit u = orders[std::size_t(s)][next[std::size_t(s)]];
        const int v = u.chunk * S + s;
        const std::size_t at = std::size_t(v * M + u.micro);
        double ready = free_at[std::size_t(s)];
        if (u.forward) {
          if (v > 0) {
            const double in = fdone[std::size_t((v - 1) * M + u.micro)];
            if (in < 0) break;
            ready = std::max(ready, in);
          }
        } else {
          if (fdone[at] < 0) break;
          ready = std::max(ready, fdone[at]);
          if (v + 1 < VS) {
            const double in = bdone[std::size_t((v + 1) * M + u.micro)];
            if (in < 0) break;
            ready = std::max(ready, in);
          }
        }
        const double end = ready + (u.forward ? f : b);
        (u.forward ? fdone : bdone)[at] = end;
        free_at[std::size_t(s)] = end;
        held[std::size_t(s)] += u.forward ? 1 : -1;
        t.peak_units[std::size_t(s)] = std::max(t.peak_units[std::size_t(s)], held[std::size_t(s)]);
        ++next[std::size_t(s)];
        progress = true;
      }
    }
  }
  for (int s = 0; s < S; ++s)
    if (next[std::size_t(s)] < orders[std::size_t(s)].size()) {
      const pipeline_unit u = orders[std::size_t(s)][next[std::size_t(s)]];
      throw error("pipeline " + std::string(to_string(k)) + ": the orders deadlock: stage " + std::to_string(s) +
                  " waits to run the " + (u.forward ? "forward" : "backward") + " of micro-batch " +
                  std::to_string(u.micro) + " through chunk " + std::to_string(u.chunk));
    }
  for (double e : free_at) t.makespan = std::max(t.makespan, e);
  const double work = double(M) * (forward_time + backward_time) * S;
  t.bubble_fraction = t.makespan > 0 ? 1 - work / (S * t.makespan) : 0;
  return t;
}

}  // namespace tessera::graph
