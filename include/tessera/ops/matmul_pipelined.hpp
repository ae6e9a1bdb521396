// Sharded MatMul with its communication overlapped with the local product: a
// contraction-split strategy resolves the partial sums of one chunk of C
// while the next chunk is multiplied (matmul_overlapped), and a strategy on a 2-D mesh
// broadcasts the next panel of A and B while the current one is multiplied (SUMMA,
// matmul_summa). The products are the device's gemm on the shards in place: BLAS on
// a compute thread for host tensors, queued on the stream for device tensors.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cpu/blas.hpp>
#include <tessera/kernels/cpu/common.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// Where matmul_overlapped puts the partial sums of C over the contraction axis.
enum class partial_resolution {
  scatter_rows,  ///< ReduceScatter onto C's dim 0: the contraction axis splits the rows, minor
  scatter_cols,  ///< ReduceScatter onto C's dim 1: the contraction axis splits the columns, minor
  all_reduce,    ///< AllReduce: C replicated over the contraction axis
};

/// Options of the pipelined products.
struct pipeline_options {
  /// matmul_overlapped: the pieces the local product is cut into (rows of C); the
  /// collective of one runs while the next is multiplied. matmul_summa: the panels the
  /// contraction dim is cut into, at least one per block of A and of B.
  int chunks = 4;
  /// The longest pause, in microseconds, of the communicating thread between two polls
  /// of the collectives in flight while the products run. After anything happens (a
  /// chunk computed, a collective complete) it polls again after poll_us / 32, and
  /// doubles the pause while nothing does: few wake-ups during a long product, a quick
  /// answer to a short one. 0: poll continuously, yielding the core between polls.
  int poll_us = 1000;
};

/// What one pipelined call spent on this rank, in seconds.
struct pipeline_stats {
  double total_s = 0;    ///< the whole call
  double compute_s = 0;  ///< in the local products (on the compute thread; waits for data excluded)
  int pieces = 0;        ///< chunks (matmul_overlapped) or panels (matmul_summa) used
  /// The time the call took beyond its products: communication not hidden behind them,
  /// and waiting for a slower peer.
  double exposed_s() const { return total_s - compute_s; }
};

/// C's layout once the partial sums over the contraction axis are resolved as `how`
/// says; C's own layout when the strategy does not split the contraction dim.
/// Example: ((1, 2), (2, 1)) on 2 ranks, device matrix (1, 2, 1), C partial over axis 1:
/// scatter_rows gives [0.1, 2] (rows cut by axes 0 and 1), scatter_cols [0, 2.1],
/// all_reduce [0, 2].
inline layout resolved_layout(const matmul_layouts& r, partial_resolution how) {
  if (!r.c.has_partial()) return r.c;
  int k_axis = -1;
  for (int a = 0; a < r.c.dev.ndim; ++a)
    if (r.c.is_partial(a)) k_axis = a;
  const layout base = r.c.without_partial();
  if (how == partial_resolution::all_reduce) return base;
  const int d = how == partial_resolution::scatter_rows ? 0 : 1;
  axis_list s = base.split[d];
  s.push_back(k_axis);
  return base.with_split(d, s);
}

/// The layouts of matmul_summa for a strategy that does not split the contraction dim,
/// ((pm, 1), (1, pn)) on a device matrix (pm, 1, pn): C split (pm, pn) as the rule
/// says, and A and B split like C (ScaLAPACK's block distribution on a pm x pn grid):
/// A's contraction dim cut by the n axis, B's by the m axis, so that no rank holds a
/// replica. Example: ((2, 1), (1, 4)) on 8 ranks: A (m x k) in 2 x 4 blocks, B (k x n)
/// in 2 x 4 blocks, C in 2 x 4 blocks.
struct summa_layouts {
  layout a, b, c;
};

/// matmul_summa's layouts; throws tessera::error when the strategy splits the
/// contraction dim or breaks MatMul's rule.
inline summa_layouts summa_rule(const matmul_op& op, int device_num) {
  const matmul_layouts r = op.rule(device_num);
  const int k = op.trans_a ? op.st.in[0].v[0] : op.st.in[0].v[1];
  if (k != 1)
    throw error("matmul_summa: the strategy must not split the contraction dim (SUMMA cuts it into "
                "panels instead): it is split " + std::to_string(k) + " ways; strategy " +
                to_string(op.st));
  const int first = r.dev.ndim == 4 ? 1 : 0;
  const int am = first, an = first + 2;
  summa_layouts s{r.a, r.b, r.c};
  if (r.dev.dims[an] > 1) s.a = r.a.with_split(op.trans_a ? 0 : 1, axis_list{an});
  if (r.dev.dims[am] > 1) s.b = r.b.with_split(op.trans_b ? 1 : 0, axis_list{am});
  return s;
}

namespace detail {

using pipeline_clock = std::chrono::steady_clock;

inline double seconds_since(pipeline_clock::time_point t0) {
  return std::chrono::duration<double>(pipeline_clock::now() - t0).count();
}

// The communicating thread's pauses between polls: from poll_us / 32 after an event,
// doubling up to poll_us while nothing happens.
class poll_backoff {
 public:
  explicit poll_backoff(int poll_us) : max_(poll_us), min_(std::max(1, poll_us / 32)), cur_(min_) {}
  void event() { cur_ = min_; }
  void pause() {
    if (max_ <= 0) return std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(cur_));
    cur_ = std::min(max_, 2 * cur_);
  }

 private:
  int max_, min_, cur_;
};

inline void check_pipeline_options(const char* fn, const pipeline_options& opt) {
  if (opt.chunks < 1)
    throw error(std::string(fn) + ": chunks must be at least 1: chunks " + std::to_string(opt.chunks));
  if (opt.poll_us < 0)
    throw error(std::string(fn) + ": poll_us must not be negative: poll_us " + std::to_string(opt.poll_us));
}

/// Counts what the compute thread did (a piece multiplied, its end) and wakes the
/// communicating thread when it sleeps with nothing in flight: no polling then.
class pipeline_events {
 public:
  void signal() {
    count_.fetch_add(1, std::memory_order_release);
    count_.notify_all();
  }
  int seen() const { return count_.load(std::memory_order_acquire); }
  /// Sleeps until an event after `seen` (returns at once if there was one).
  void wait(int seen) const { count_.wait(seen, std::memory_order_acquire); }

 private:
  std::atomic<int> count_{0};
};

/// The thread that runs a pipeline's products while the calling thread, the only one
/// that communicates (MPI_THREAD_FUNNELED is enough), starts and polls the collectives.
/// `work(stop)` should return soon after stop becomes true; join() rethrows its error.
/// `events`, when given, is signalled when the work ends (normally or not).
class compute_thread {
 public:
  template <class F>
  explicit compute_thread(F&& work, pipeline_events* events = nullptr)
      : thread_([this, events, w = std::forward<F>(work)]() mutable {
          const auto t0 = pipeline_clock::now();
          try {
            w(static_cast<const std::atomic<bool>&>(stop_));
          } catch (...) {
            error_ = std::current_exception();
          }
          busy_s_ = seconds_since(t0);
          done_.store(true, std::memory_order_release);
          if (events) events->signal();
        }) {}
  compute_thread(const compute_thread&) = delete;
  compute_thread& operator=(const compute_thread&) = delete;
  ~compute_thread() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  bool done() const { return done_.load(std::memory_order_acquire); }
  /// Asks the work to return early (it sees `stop` become true).
  void request_stop() { stop_.store(true); }
  /// Waits for the thread; rethrows what the work threw. Returns its busy time.
  double join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    return busy_s_;
  }

 private:
  std::atomic<bool> stop_{false}, done_{false};
  std::exception_ptr error_;
  double busy_s_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

/// Boundaries of n pieces of [0, total) (n <= total) shrinking linearly, piece i about
/// total * (n - i) / (n (n + 1) / 2) and at least 1: the last piece, whose collective no
/// later product overlaps, is the smallest. Example: total 100, n 4 -> 0 40 70 90 100.
inline std::vector<index_t> shrinking_cuts(index_t total, int n) {
  const index_t sum = index_t(n) * (n + 1) / 2;
  std::vector<index_t> w(static_cast<std::size_t>(n));
  index_t used = 0;
  for (int i = 0; i < n; ++i) used += w[std::size_t(i)] = std::max<index_t>(1, total * (n - i) / sum);
  for (int i = 0; used != total; i = (i + 1) % n) {  // the rounding, on the first pieces
    if (used < total) ++w[std::size_t(i)], ++used;
    else if (w[std::size_t(i)] > 1) --w[std::size_t(i)], --used;
  }
  std::vector<index_t> cuts(std::size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) cuts[std::size_t(i) + 1] = cuts[std::size_t(i)] + w[std::size_t(i)];
  return cuts;
}

/// gemm of rows [r0, r0 + rows) of op(A) (lm x lk) and columns [c0, c0 + w) of op(B)
/// (lk x ln), read in place from row-major shards, into dst (rows x w, row stride ldc),
/// by device D's backend: BLAS on the host, cuBLAS queued on the stream on a GPU.
template <class D, class T>
void sub_product(const T* a, const T* b, bool ta, bool tb, index_t lm, index_t lk, index_t ln, index_t r0,
                 index_t rows, index_t c0, index_t w, T* dst, index_t ldc, T beta) {
  const T* pa = ta ? a + r0 : a + r0 * lk;
  const T* pb = tb ? b + c0 * lk : b + c0;
  const index_t lda = std::max<index_t>(1, ta ? lm : lk), ldb = std::max<index_t>(1, tb ? lk : ln);
  auto i = [](index_t v) { return kernels::cpu::detail::blas_int(std::size_t(v), "matmul_overlapped"); };
  kernels::backend<D>::gemm(ta, tb, i(rows), i(w), i(lk), T(1), pa, i(lda), pb, i(ldb), beta, dst,
                            i(std::max<index_t>(1, ldc)));
}

/// Runs a chunk pipeline: the compute thread runs compute(i) for i = 0 .. n - 1; the
/// calling thread starts start(i) (a pollable request) as soon as chunk i is computed,
/// polls the requests in flight (sleeping until the next chunk when none is), runs
/// finish(i) once request i is complete, and waits for the last ones. Returns the
/// compute thread's busy time.
template <class Compute, class Start, class Finish>
double run_chunk_pipeline(int n, Compute&& compute, Start&& start, Finish&& finish, int poll_us) {
  using request = decltype(start(0));
  std::vector<request> flight;
  flight.reserve(std::size_t(n));
  std::atomic<int> computed{0};
  pipeline_events events;
  compute_thread worker(
      [&](const std::atomic<bool>& stop) {
        for (int i = 0; i < n && !stop.load(std::memory_order_relaxed); ++i) {
          compute(i);
          computed.store(i + 1, std::memory_order_release);
          events.signal();
        }
      },
      &events);
  int started = 0, finished = 0;
  poll_backoff backoff(poll_us);
  auto poll = [&] {  // finishes, in order, the requests that are complete
    while (finished < started && flight[std::size_t(finished)].test()) {
      finish(finished++);
      backoff.event();
    }
    for (int i = finished + 1; i < started; ++i) flight[std::size_t(i)].test();
  };
  while (started < n) {
    const int seen = events.seen();
    const int c = computed.load(std::memory_order_acquire);
    if (started < c) backoff.event();
    while (started < c) flight.push_back(start(started++));
    poll();
    if (started == n) break;
    if (worker.done() && computed.load(std::memory_order_acquire) == started) break;  // it failed
    if (finished == started) events.wait(seen);  // nothing in flight: sleep until the next chunk
    else backoff.pause();
  }
  const double busy = worker.join();
  for (; finished < started; ++finished) {
    flight[std::size_t(finished)].wait();
    finish(finished);
  }
  return busy;
}

// One panel of SUMMA: the contraction range [k0, k0 + w), the member of the row group
// holding it in A (and where it starts in that member's block), and the member of the
// column group holding it in B.
struct summa_panel {
  index_t k0 = 0, w = 0;
  int a_owner = 0, b_owner = 0;
  index_t a_off = 0, b_off = 0;
};

// Panels cutting [0, k) at every block boundary of A (pieces_a blocks) and of B
// (pieces_b blocks), each segment between boundaries cut into `per_segment` nearly
// equal panels. Example: k 12, pieces_a 2, pieces_b 3, per_segment 1: boundaries 0, 4,
// 6, 8, 12 -> panels [0, 4) [4, 6) [6, 8) [8, 12).
inline std::vector<summa_panel> summa_panels(index_t k, int pieces_a, int pieces_b, int per_segment) {
  const index_t ka = k / pieces_a, kb = k / pieces_b;
  std::vector<index_t> cuts;
  for (int j = 0; j <= pieces_a; ++j) cuts.push_back(j * ka);
  for (int j = 0; j <= pieces_b; ++j) cuts.push_back(j * kb);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<summa_panel> out;
  for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
    const index_t x = cuts[s], len = cuts[s + 1] - x;
    const index_t parts = std::min<index_t>(per_segment, len);
    for (index_t p = 0; p < parts; ++p) {
      summa_panel pn;
      pn.k0 = x + p * len / parts;
      pn.w = x + (p + 1) * len / parts - pn.k0;
      pn.a_owner = int(pn.k0 / ka);
      pn.a_off = pn.k0 - pn.a_owner * ka;
      pn.b_owner = int(pn.k0 / kb);
      pn.b_off = pn.k0 - pn.b_owner * kb;
      out.push_back(pn);
    }
  }
  return out;
}

// Cuts the first panel into a quarter and the rest: its broadcasts are the only ones no
// product overlaps, so the first product starts after a quarter of their time.
inline void split_first_panel(std::vector<summa_panel>& panels) {
  if (panels.empty() || panels.front().w < 4) return;
  summa_panel head = panels.front(), rest = head;
  head.w = rest.w / 4;
  rest.k0 += head.w;
  rest.a_off += head.w;
  rest.b_off += head.w;
  rest.w -= head.w;
  panels.front() = rest;
  panels.insert(panels.begin(), head);
}

template <class T, class D, class C>
void check_pipelined_types(const char* fn, const C& c) {
  static_assert(kernels::cpu::blas_scalar<T>,
                "matmul_overlapped / matmul_summa: the element type must be float or double (BLAS)");
  static_assert(nonblocking_communicator<C>,
                "matmul_overlapped / matmul_summa: the communicator must start collectives "
                "without waiting (nonblocking_communicator: ireduce_scatter, ibroadcast, "
                "iall_reduce), e.g. mpi_communicator or local_communicator, and on a GPU "
                "nccl_communicator or staged_communicator<mpi_communicator>");
  tessera::detail::check_comm_memory<D>(c, fn);
}

// ---- what the host and device paths share -------------------------------------------

// matmul_overlapped's operands in the rule's layouts and the sizes of their blocks (A's
// lm x lk, B's lk x ln), the output's shape and layout, and the contraction group: its
// mesh axis and size g (1: no partial sums to resolve). Host and device paths share it.
template <class T, class D>
struct overlapped_setup {
  matmul_layouts r;
  extents cs;
  layout out_l;
  laid_out<T, D> la, lb;
  bool ta, tb;
  index_t lm, lk, ln;
  int k_axis, g;
};

template <class T, class D, class C>
overlapped_setup<T, D> overlapped_prepare(const matmul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                          device_context<C>& ctx, partial_resolution how,
                                          const pipeline_options& opt) {
  check_pipeline_options("matmul_overlapped", opt);
  const matmul_layouts r = op.rule(ctx.size());
  const extents cs = matmul_output_shape(a.global_shape(), b.global_shape(), op);
  const layout out_l = resolved_layout(r, how);
  if (const status s = check(out_l, cs); !s.ok())
    throw error(s, "matmul_overlapped: C " + to_string(cs) + " in the output layout " + to_string(out_l),
                "strategy " + to_string(op.st));
  laid_out<T, D> la = in_layout(a, r.a, ctx), lb = in_layout(b, r.b, ctx);
  const bool ta = op.trans_a, tb = op.trans_b;
  const extents sa = la->local_shape(), sb = lb->local_shape();
  int k_axis = -1;
  for (int ax = 0; ax < r.c.dev.ndim; ++ax)
    if (r.c.is_partial(ax)) k_axis = ax;
  const int g = k_axis >= 0 ? r.dev.dims[k_axis] : 1;
  return {r, cs, out_l, std::move(la), std::move(lb), ta, tb, ta ? sa.v[1] : sa.v[0], ta ? sa.v[0] : sa.v[1],
          tb ? sb.v[0] : sb.v[1], k_axis, g};
}

// matmul_summa's operands in SUMMA's layouts, the sizes of their blocks (A's lm x ka,
// B's kb x ln), the mesh axes of C's rows (am, pm ranks) and columns (an, pn ranks),
// and the panels of the contraction, as the host and device paths share them.
template <class T, class D>
struct summa_setup {
  matmul_layouts r;
  extents cs;
  laid_out<T, D> la, lb;
  bool ta, tb;
  int am, an, pm, pn;
  index_t lm, ka, ln, kb;
  std::vector<summa_panel> panels;
  index_t wmax;  // the widest panel
};

template <class T, class D, class C>
summa_setup<T, D> summa_prepare(const matmul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                device_context<C>& ctx, const pipeline_options& opt) {
  check_pipeline_options("matmul_summa", opt);
  const summa_layouts sl = summa_rule(op, ctx.size());
  const matmul_layouts r = op.rule(ctx.size());
  const extents cs = matmul_output_shape(a.global_shape(), b.global_shape(), op);
  const bool ta = op.trans_a, tb = op.trans_b;
  const index_t k = ta ? a.global_shape().v[0] : a.global_shape().v[1];
  for (const auto& [l, s, name] : {std::tuple{sl.a, a.global_shape(), "A"}, std::tuple{sl.b, b.global_shape(), "B"}})
    if (const status e = check(l, s); !e.ok())
      throw error(e, std::string("matmul_summa: ") + name + " " + to_string(s) + " in the layout " + to_string(l),
                  "strategy " + to_string(op.st));
  laid_out<T, D> la = in_layout(a, sl.a, ctx), lb = in_layout(b, sl.b, ctx);
  const int first = r.dev.ndim == 4 ? 1 : 0;
  const int am = first, an = first + 2;
  const int pm = r.dev.dims[am], pn = r.dev.dims[an];
  const extents sa = la->local_shape(), sb = lb->local_shape();
  const int segments = int(summa_panels(k, pn, pm, 1).size());
  const int per_segment = std::max(1, (opt.chunks + std::max(1, segments) - 1) / std::max(1, segments));
  std::vector<summa_panel> panels = summa_panels(k, pn, pm, per_segment);
  if (pm > 1 || pn > 1) split_first_panel(panels);
  index_t wmax = 0;
  for (const auto& p : panels) wmax = std::max(wmax, p.w);
  return {r,
          cs,
          std::move(la),
          std::move(lb),
          ta,
          tb,
          am,
          an,
          pm,
          pn,
          ta ? sa.v[1] : sa.v[0],
          ta ? sa.v[0] : sa.v[1],
          tb ? sb.v[0] : sb.v[1],
          tb ? sb.v[1] : sb.v[0],
          std::move(panels),
          wmax};
}

// On a device the products are queued on its stream by the calling thread (no compute
// thread: queuing returns at once), each piece's collective started right after its
// product is queued, so the device runs the next products while it is in flight (NCCL
// on its communication stream; the staged communicator's host transfer). The buffers
// are the device's arrays (storage<T, D>), packed and copied with its copy_box, the
// products its backend's gemm; stream order keeps every buffer safe.

/// The chunk pipeline on a device: queue compute(i), start(i) at once, finish in order
/// the requests that are complete; then wait for the rest.
template <class Compute, class Start, class Finish>
void run_device_pipeline(int n, Compute&& compute, Start&& start, Finish&& finish) {
  using request = decltype(start(0));
  std::vector<request> flight;
  flight.reserve(std::size_t(n));
  int finished = 0;
  for (int i = 0; i < n; ++i) {
    compute(i);
    flight.push_back(start(i));
    while (finished <= i && flight[std::size_t(finished)].test()) finish(finished++);
    for (int j = finished + 1; j <= i; ++j) (void)flight[std::size_t(j)].test();  // progress
  }
  for (; finished < n; ++finished) {
    flight[std::size_t(finished)].wait();
    finish(finished);
  }
}

/// A chunk pipeline on device D: on the host run_chunk_pipeline (the products on a
/// compute thread; returns its busy time), on a device run_device_pipeline (returns 0:
/// the products run asynchronously).
template <class D, class Compute, class Start, class Finish>
double run_pieces(int n, Compute&& compute, Start&& start, Finish&& finish, int poll_us) {
  if constexpr (std::is_same_v<D, cpu_device>) {
    return run_chunk_pipeline(n, compute, start, finish, poll_us);
  } else {
    run_device_pipeline(n, compute, start, finish);
    return 0;
  }
}

/// SUMMA's panel traffic on device D, which the host's and the device's loops share:
/// two slots of panel buffers (panel t lands in slot t % 2); post(t) starts panel t's
/// broadcasts (each owner sends its shard's panel: in place when it is contiguous, else
/// packed into the slot by the device's copy_box); multiply(t, c) adds panel t's
/// product to C's block (c, lm x ln; panel 0 overwrites it), reading each operand in
/// place where this rank holds it, else from the slot its broadcast landed in.
template <class T, class D, class C>
struct summa_traffic {
  using S = storage<T, D>;
  using request = decltype(std::declval<C&>().ibroadcast(std::span<T>(), 0));
  static constexpr int slots = 2;

  const summa_setup<T, D>& su;
  C& row;  // the ranks of this mesh row: A's panels
  C& col;  // the ranks of this mesh column: B's panels
  const T* pa;
  const T* pb;
  std::vector<typename S::array> abuf, bbuf;
  std::vector<request> flight_a, flight_b;

  summa_traffic(const summa_setup<T, D>& s, mesh_comm<C>& mc)
      : su(s),
        row(mc.group(axis_list{s.an})),
        col(mc.group(axis_list{s.am})),
        pa(s.la->local().data()),
        pb(s.lb->local().data()),
        flight_a(s.panels.size()),
        flight_b(s.panels.size()) {
    for (int k = 0; k < slots; ++k) {
      abuf.push_back(S::empty(extents{su.pn > 1 ? su.lm * su.wmax : 0}));
      bbuf.push_back(S::empty(extents{su.pm > 1 ? su.wmax * su.ln : 0}));
    }
  }

  void post(int t) {
    const summa_panel& p = su.panels[std::size_t(t)];
    const std::size_t slot = std::size_t(t % slots);
    const index_t lm = su.lm, ln = su.ln, ka = su.ka, kb = su.kb;
    if (su.pn > 1) {
      T* buf = abuf[slot].data();
      if (row.rank() == p.a_owner) {
        if (su.ta || p.w == ka)  // contiguous in the shard: sent in place (a root's buffer is only read)
          buf = const_cast<T*>(su.ta ? pa + p.a_off * lm : pa + p.a_off);
        else
          S::copy_box(pa, extents{lm, ka}, extents{0, p.a_off}, buf, extents{lm, p.w}, extents{0, 0},
                      extents{lm, p.w});
      }
      flight_a[std::size_t(t)] = row.ibroadcast(std::span<T>(buf, std::size_t(lm * p.w)), p.a_owner);
    }
    if (su.pm > 1) {
      T* buf = bbuf[slot].data();
      if (col.rank() == p.b_owner) {
        if (!su.tb || p.w == kb)
          buf = const_cast<T*>(su.tb ? pb + p.b_off : pb + p.b_off * ln);
        else
          S::copy_box(pb, extents{ln, kb}, extents{0, p.b_off}, buf, extents{ln, p.w}, extents{0, 0},
                      extents{ln, p.w});
      }
      flight_b[std::size_t(t)] = col.ibroadcast(std::span<T>(buf, std::size_t(p.w * ln)), p.b_owner);
    }
  }

  /// Whether panel t's broadcasts are complete (both are polled).
  bool test(int t) {
    const bool a = flight_a[std::size_t(t)].test();
    return flight_b[std::size_t(t)].test() && a;
  }
  void wait(int t) {
    flight_a[std::size_t(t)].wait();
    flight_b[std::size_t(t)].wait();
  }

  void multiply(int t, T* c) const {
    const summa_panel& p = su.panels[std::size_t(t)];
    const std::size_t slot = std::size_t(t % slots);
    const bool ta = su.ta, tb = su.tb;
    const index_t lm = su.lm, ln = su.ln;
    const T *oa = nullptr, *ob = nullptr;
    index_t lda = 1, ldb = 1;  // row strides
    if (su.pn == 1 || row.rank() == p.a_owner) {
      oa = ta ? pa + p.a_off * lm : pa + p.a_off;
      lda = ta ? lm : su.ka;
    } else {
      oa = abuf[slot].data();
      lda = ta ? lm : p.w;
    }
    if (su.pm == 1 || col.rank() == p.b_owner) {
      ob = tb ? pb + p.b_off : pb + p.b_off * ln;
      ldb = tb ? su.kb : ln;
    } else {
      ob = bbuf[slot].data();
      ldb = tb ? p.w : ln;
    }
    auto i = [](index_t v) { return kernels::cpu::detail::blas_int(std::size_t(v), "matmul_summa"); };
    kernels::backend<D>::gemm(ta, tb, i(lm), i(ln), i(p.w), T(1), oa, i(std::max<index_t>(1, lda)), ob,
                              i(std::max<index_t>(1, ldb)), t == 0 ? T(0) : T(1), c,
                              i(std::max<index_t>(1, ln)));
  }
};
}  // namespace detail

/// C = op(A) op(B) as ops::matmul computes it followed by the resolution of the partial
/// sums over the contraction axis (`how`), with the two overlapped: the local product
/// is cut into `opt.chunks` chunks, and while chunk i + 1 is multiplied (on a compute
/// thread) the ReduceScatter or AllReduce of chunk i runs (started and polled by the
/// calling thread, the only one that communicates). Returns C in
/// resolved_layout(rule, how), equal to
///
///     redistribute(ops::matmul(op, a, b, ctx), resolved_layout(op.rule(P), how), ctx)
///
/// and moving the bytes of one ReduceScatter (AllReduce) of the local product over the
/// contraction axis, which is that plan's price when the device matrix has no replica
/// axis (with one, the plan can share the resolution among the replicas and move fewer
/// bytes; matmul_overlapped resolves on each replica).
///
/// The chunks shrink linearly (detail::shrinking_cuts: 40, 30, 20 and 10% for 4), so
/// that the last, whose collective no product overlaps, is small. Each product is a
/// BLAS call on the shards in place:
/// - scatter_rows: chunks of C's columns, one product of all local rows each (so BLAS
///   packs each operand once per chunk), written as g blocks of rows, one per member of
///   the contraction group, ready for its ReduceScatter; each member's block is copied
///   into its columns of the output shard when it arrives, on the calling thread;
/// - scatter_cols: chunks of C's rows, member j's columns multiplied straight into the
///   j-th block of the chunk's send buffer; the ReduceScatter lands in the output shard;
/// - all_reduce: chunks of rows, multiplied into the output shard and reduced in place.
/// A strategy that does not split the contraction dim has no partial sums: C is one
/// product in the rule's layout. Inputs not in the rule's layouts are redistributed
/// first, as ops::matmul does. `stats`, when given, receives the time spent (the
/// products run on the compute thread, so its busy time is their time).
///
/// Device tensors (tensor_on<T, cuda_device>, with a communicator of device buffers:
/// nccl_communicator, staged_communicator<mpi_communicator>) take the same pieces: the
/// calling thread queues each product on the device's stream (its backend's gemm) and
/// starts the piece's collective right after it, so the device multiplies the next
/// pieces while it runs; `stats->compute_s` is 0 there (the products run
/// asynchronously), and the result is ready for the kernels queued after the call.
///
/// Example: ((1, 2), (2, 1)) on 2 ranks, A and B 4096 x 4096, scatter_rows, chunks 4:
/// each rank multiplies its (4096 x 2048) x (2048 x 4096) as 4 products of 1639, 1229,
/// 819 and 409 columns; chunk i's ReduceScatter (4096 x 1639 floats in, half of them
/// out, for the first) runs during chunk i + 1's product; C comes back split [0.1, 2]
/// (2048 rows per rank).
///
/// Throws tessera::error when chunks < 1 or poll_us < 0 ("matmul_overlapped: chunks must
/// be at least 1: chunks 0"), for a bad strategy or shapes (as ops::matmul), and when
/// C's shape does not divide into the output layout.
template <class T, class D, class C>
tensor_on<T, D> matmul_overlapped(const matmul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                  device_context<C>& ctx,
                                  partial_resolution how = partial_resolution::scatter_rows,
                                  const pipeline_options& opt = {}, pipeline_stats* stats = nullptr) {
  detail::check_pipelined_types<T, D, C>("matmul_overlapped", ctx.world());
  using S = storage<T, D>;
  constexpr bool host = std::is_same_v<D, cpu_device>;
  const auto t0 = detail::pipeline_clock::now();
  const detail::overlapped_setup<T, D> su = detail::overlapped_prepare(op, a, b, ctx, how, opt);
  const T* pa = su.la->local().data();
  const T* pb = su.lb->local().data();
  const bool ta = su.ta, tb = su.tb;
  const index_t lm = su.lm, lk = su.lk, ln = su.ln;
  const int g = su.g;
  // Rows [r0, r0 + rows) and columns [c0, c0 + w) of the local product into dst.
  auto product = [&](index_t r0, index_t rows, index_t c0, index_t w, T* dst, index_t ldc) {
    detail::sub_product<D>(pa, pb, ta, tb, lm, lk, ln, r0, rows, c0, w, dst, ldc, T(0));
  };
  pipeline_stats st;
  typename S::array out;
  if (g == 1) {
    // No partial sums to resolve (or a one-rank contraction group): one product.
    out = S::empty(extents{lm, ln});
    const auto tc = detail::pipeline_clock::now();
    product(0, lm, 0, ln, out.data(), ln);
    st.compute_s = host ? detail::seconds_since(tc) : 0.0;
    st.pieces = 1;
  } else {
    C& group = ctx.on(su.r.dev).group(axis_list{su.k_axis});
    // Rows per output block (R), columns per block (W), and the output shard.
    const bool rows = how == partial_resolution::scatter_rows, cols = how == partial_resolution::scatter_cols;
    const index_t R = rows ? lm / g : lm, W = cols ? ln / g : ln;
    out = S::empty(extents{R, W});
    const int n = int(std::min<index_t>(opt.chunks, R));
    const std::vector<index_t> row_cuts = detail::shrinking_cuts(R, n);
    auto begin = [&](int i) { return row_cuts[std::size_t(i)]; };
    auto none = [](int) {};
    st.pieces = n;
    if (how == partial_resolution::all_reduce) {
      // Chunks of rows, computed in place into C's shard and all-reduced there.
      auto compute = [&](int i) {
        const index_t r0 = begin(i), rs = begin(i + 1) - r0;
        product(r0, rs, 0, ln, out.data() + r0 * ln, ln);
      };
      auto start = [&](int i) {
        const index_t r0 = begin(i), rs = begin(i + 1) - r0;
        return group.iall_reduce(std::span<T>(out.data() + r0 * ln, std::size_t(rs * ln)), reduce_op::sum);
      };
      st.compute_s = detail::run_pieces<D>(n, compute, start, none, opt.poll_us);
    } else if (rows) {
      // Chunks of columns, one product each (all of C's rows: BLAS packs each operand
      // once per chunk), into a buffer of lm x w: g blocks of R x w, block j for member
      // j. The ReduceScatter lands in a block of R x w, copied into columns
      // [c0, c0 + w) of the output shard by the calling thread (overlapped too).
      const int nc = int(std::min<index_t>(opt.chunks, ln));
      const std::vector<index_t> col_cuts = detail::shrinking_cuts(ln, nc);
      auto cbegin = [&](int i) { return col_cuts[std::size_t(i)]; };
      typename S::array send = S::empty(extents{lm * ln}), recv = S::empty(extents{R * ln});
      auto compute = [&](int i) {
        const index_t c0 = cbegin(i), w = cbegin(i + 1) - c0;
        product(0, lm, c0, w, send.data() + lm * c0, w);
      };
      auto start = [&](int i) {
        const index_t c0 = cbegin(i), w = cbegin(i + 1) - c0;
        return group.ireduce_scatter(std::span<const T>(send.data() + lm * c0, std::size_t(lm * w)),
                                     std::span<T>(recv.data() + R * c0, std::size_t(R * w)), reduce_op::sum);
      };
      auto finish = [&](int i) {
        const index_t c0 = cbegin(i), w = cbegin(i + 1) - c0;
        S::copy_box(recv.data() + R * c0, extents{R, w}, extents{0, 0}, out.data(), extents{R, ln}, extents{0, c0},
                    extents{R, w});
      };
      st.compute_s = detail::run_pieces<D>(nc, compute, start, finish, opt.poll_us);
      st.pieces = nc;
    } else {
      // Chunks of rows; in each, member j's columns [j W, (j + 1) W) are computed straight
      // into the j-th block of the chunk's send buffer (g blocks of rows x W, at offset
      // g * begin(i) * W of one buffer as large as the local product), and the
      // ReduceScatter lands in the chunk's rows of the output shard: no copy.
      typename S::array send = S::empty(extents{lm * ln});
      auto compute = [&](int i) {
        const index_t r0 = begin(i), rs = begin(i + 1) - r0;
        T* chunk = send.data() + g * r0 * W;
        for (int j = 0; j < g; ++j) product(r0, rs, j * W, W, chunk + j * rs * W, W);
      };
      auto start = [&](int i) {
        const index_t r0 = begin(i), rs = begin(i + 1) - r0;
        return group.ireduce_scatter(std::span<const T>(send.data() + g * r0 * W, std::size_t(g * rs * W)),
                                     std::span<T>(out.data() + r0 * W, std::size_t(rs * W)), reduce_op::sum);
      };
      st.compute_s = detail::run_pieces<D>(n, compute, start, none, opt.poll_us);
    }
  }
  st.total_s = detail::seconds_since(t0);
  if (stats) *stats = st;
  return tensor_on<T, D>(su.out_l, su.cs, ctx.rank(), std::move(out));
}

/// C = op(A) op(B) for a strategy that does not split the contraction dim,
/// ((pm, 1), (1, pn)), with A and B split like C (summa_rule: ScaLAPACK's block
/// distribution, no replicas), by SUMMA: the contraction dim is cut into panels; for
/// each, the member of every mesh row that holds A's columns broadcasts them along the
/// row, the member of every mesh column that holds B's rows broadcasts them along the
/// column, and each rank adds the panel's product to its block of C. The broadcasts of
/// the next panels (two in flight) run while the current one is multiplied on a
/// compute thread. Equals ops::matmul(op, a, b, ctx), which first all-gathers A and B.
///
/// Panels: every block boundary of A and B is a panel boundary, and each segment
/// between boundaries is cut into ceil(chunks / segments) panels; the first panel is
/// then cut into a quarter and the rest, since nothing overlaps the broadcasts of the
/// first (with one rank per mesh row and column, no panel is broadcast). A panel of A's
/// columns is packed for its broadcast unless it is contiguous (a whole block, or A
/// transposed); panels are used in place where they lie in this rank's shard.
///
/// Device tensors: the calling thread waits for panel t's broadcasts (on NCCL, the
/// stream waits; staged, the copy to the device is queued), queues its product on the
/// device's stream and starts the broadcasts of panel t + 2 into the slot it read, so
/// they run while the device multiplies; packing is the device's copy_box;
/// `stats->compute_s` is 0.
///
/// Example: ((1, 1), (1, 2)) on 2 ranks (ScaLAPACK's 1 x 2 grid), A and B 4096 x 4096
/// split by columns: chunks 4 -> panels of 256, 768, 1024, 1024 and 1024 columns of A
/// (2048 per rank), each broadcast to the other rank while the previous one is
/// multiplied with the matching rows of B.
///
/// Throws tessera::error when the strategy splits the contraction dim ("matmul_summa:
/// the strategy must not split the contraction dim ..."), for bad options, strategies
/// or shapes.
template <class T, class D, class C>
tensor_on<T, D> matmul_summa(const matmul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                             device_context<C>& ctx, const pipeline_options& opt = {},
                             pipeline_stats* stats = nullptr) {
  detail::check_pipelined_types<T, D, C>("matmul_summa", ctx.world());
  using S = storage<T, D>;
  const auto t0 = detail::pipeline_clock::now();
  const detail::summa_setup<T, D> su = detail::summa_prepare(op, a, b, ctx, opt);
  detail::summa_traffic<T, D, C> io(su, ctx.on(su.r.dev));
  constexpr int slots = detail::summa_traffic<T, D, C>::slots;
  const int np = int(su.panels.size());
  typename S::array out = S::empty(extents{su.lm, su.ln});
  if (np == 0) S::fill(out, T(0));
  pipeline_stats st;
  st.pieces = np;

  if constexpr (!std::is_same_v<D, cpu_device>) {
    // The calling thread waits for panel t's broadcasts, queues its product and starts
    // the broadcasts of panel t + 2 into the slot the product reads: stream order
    // makes the product read the slot before they land.
    for (int t = 0; t < std::min(np, slots); ++t) io.post(t);
    for (int t = 0; t < np; ++t) {
      io.wait(t);
      io.multiply(t, out.data());
      if (t + slots < np) io.post(t + slots);
      for (int u = t + 1; u < std::min(np, t + 1 + slots); ++u) (void)io.test(u);  // progress
    }
  } else {
    // The compute thread multiplies panel t once the calling thread has seen its
    // broadcasts complete (ready > t); the calling thread posts panel t + 2 once panel
    // t is multiplied (consumed > t), freeing its slot.
    std::atomic<int> ready{0}, consumed{0};
    double gemm_s = 0;               // the compute thread's time in products (not waiting for panels)
    detail::pipeline_events events;  // a panel multiplied, or the work ended
    detail::compute_thread worker(
        [&](const std::atomic<bool>& stop) {
          for (int t = 0; t < np && !stop.load(std::memory_order_relaxed); ++t) {
            for (int seen = ready.load(std::memory_order_acquire);
                 seen <= t && !stop.load(std::memory_order_relaxed); seen = ready.load(std::memory_order_acquire))
              ready.wait(seen, std::memory_order_acquire);
            if (stop.load(std::memory_order_relaxed)) break;
            const auto tg = detail::pipeline_clock::now();
            io.multiply(t, out.data());
            gemm_s += detail::seconds_since(tg);
            consumed.store(t + 1, std::memory_order_release);
            events.signal();
          }
        },
        &events);
    struct wake_on_exit {  // a failure here must not leave the worker waiting for a panel
      detail::compute_thread& worker;
      std::atomic<int>& ready;
      int np;
      ~wake_on_exit() {
        if (ready.load() < np) {
          worker.request_stop();
          ready.store(np + 1);
          ready.notify_all();
        }
      }
    } wake{worker, ready, np};
    int posted = 0, done = 0;
    detail::poll_backoff backoff(opt.poll_us);
    while (done < np) {
      const int seen = events.seen();
      while (posted < np && posted < consumed.load(std::memory_order_acquire) + slots) {
        io.post(posted++);
        backoff.event();
      }
      while (done < posted && io.test(done)) {
        ready.store(++done, std::memory_order_release);
        ready.notify_all();
        backoff.event();
      }
      for (int t = done + 1; t < posted; ++t) (void)io.test(t);
      if (done == np || worker.done()) break;
      if (done == posted) events.wait(seen);  // nothing in flight: sleep until a slot is free
      else backoff.pause();
    }
    worker.join();
    st.compute_s = gemm_s;
  }
  st.total_s = detail::seconds_since(t0);
  if (stats) *stats = st;
  return tensor_on<T, D>(su.r.c, su.cs, ctx.rank(), std::move(out));
}

}  // namespace tessera::ops
