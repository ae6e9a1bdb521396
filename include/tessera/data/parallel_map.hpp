// Parallel map workers (MindSpore's num_parallel_workers): a map's transforms run on
// several threads, the rows handed out in their order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>
#include <tessera/data/node.hpp>

namespace tessera::data::detail {

/// A pass whose rows, read from `child` in order by the consumer's thread, are each
/// given to `work` (which changes the row in place) on one of `workers` threads, and
/// handed out in the child's order. Up to 2 x workers rows are in flight, so the
/// threads stay busy while the consumer takes the oldest. Since each row's result
/// depends only on the row (a transform is seeded by the row's index and pass), the
/// rows are those of the sequential map, whatever the threads' timing. An exception in
/// `work` is rethrown by next() when its row's turn comes (the rows before it are
/// handed out first); one in the child's next() at once. Destroying the cursor stops
/// the threads after their current row and joins them.
class parallel_map_cursor final : public cursor {
 public:
  parallel_map_cursor(std::unique_ptr<cursor> child, std::function<void(row&)> work, int workers)
      : child_(std::move(child)), work_(std::move(work)), window_(2 * static_cast<std::size_t>(workers)) {
    for (int t = 0; t < workers; ++t) threads_.emplace_back([this] { run(); });
  }
  ~parallel_map_cursor() override {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    has_work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  parallel_map_cursor(const parallel_map_cursor&) = delete;
  parallel_map_cursor& operator=(const parallel_map_cursor&) = delete;

  std::optional<row> next() override {
    fill();
    if (order_.empty()) return std::nullopt;
    const std::shared_ptr<job> j = std::move(order_.front());
    order_.pop_front();
    {
      std::unique_lock lock(m_);
      done_.wait(lock, [&] { return j->done; });
    }
    if (j->error) std::rethrow_exception(j->error);
    fill();  // the slot just freed: the next row starts before the consumer uses this one
    return std::move(j->r);
  }

 private:
  struct job {
    row r;
    bool done = false;
    std::exception_ptr error;
  };

  // Reads rows from the child until the window is full or the child is exhausted.
  void fill() {
    while (!exhausted_ && order_.size() < window_) {
      std::optional<row> r = child_->next();
      if (!r) {
        exhausted_ = true;
        return;
      }
      auto j = std::make_shared<job>();
      j->r = std::move(*r);
      order_.push_back(j);
      {
        std::lock_guard lock(m_);
        queue_.push_back(std::move(j));
      }
      has_work_.notify_one();
    }
  }

  void run() {
    for (;;) {
      std::shared_ptr<job> j;
      {
        std::unique_lock lock(m_);
        has_work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        j = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        work_(j->r);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(m_);
        j->error = error;
        j->done = true;
      }
      done_.notify_all();
    }
  }

  std::unique_ptr<cursor> child_;
  std::function<void(row&)> work_;
  std::size_t window_;
  bool exhausted_ = false;                   // the consumer's thread only
  std::deque<std::shared_ptr<job>> order_;   // rows in flight, in the child's order (the consumer's)
  std::mutex m_;
  std::condition_variable has_work_, done_;
  std::deque<std::shared_ptr<job>> queue_;   // rows no thread has taken yet
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: started once the members above exist
};

}  // namespace tessera::data::detail
