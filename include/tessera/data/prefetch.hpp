// Prefetch: a background thread runs a pipeline ahead of its consumer and hands
// over its rows through a bounded queue.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/data/node.hpp>

namespace tessera::data::detail {

/// The consumer's end of a prefetching pass. The worker thread opens the child's
/// cursor and pulls rows from it while fewer than `depth` rows wait in the queue, so
/// at most depth + 1 rows are ready or being prepared. An exception in the worker
/// (opening, reading, transforming) ends the pass: the consumer receives the rows
/// made before it, then the exception itself, rethrown by next(). Destroying the
/// cursor mid-pass stops the worker at its next row and joins it.
class prefetch_cursor final : public cursor {
 public:
  prefetch_cursor(node_ptr child, std::int64_t pass, std::size_t depth) : depth_(depth) {
    worker_ = std::thread([this, child = std::move(child), pass] { run(*child, pass); });
  }
  ~prefetch_cursor() override {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    not_full_.notify_all();
    worker_.join();
  }
  prefetch_cursor(const prefetch_cursor&) = delete;
  prefetch_cursor& operator=(const prefetch_cursor&) = delete;

  std::optional<row> next() override {
    std::unique_lock lock(m_);
    not_empty_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (!queue_.empty()) {
      row r = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      not_full_.notify_one();
      return r;
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return std::nullopt;
  }

 private:
  void run(const node& child, std::int64_t pass) {
    try {
      std::unique_ptr<cursor> c = child.open(pass);
      for (;;) {
        {
          std::lock_guard lock(m_);
          if (stop_) return;
        }
        std::optional<row> r = c->next();
        std::unique_lock lock(m_);
        not_full_.wait(lock, [&] { return queue_.size() < depth_ || stop_; });
        if (stop_) return;
        if (!r) {
          done_ = true;
          break;
        }
        queue_.push_back(std::move(*r));
        lock.unlock();
        not_empty_.notify_one();
      }
    } catch (...) {
      std::lock_guard lock(m_);
      error_ = std::current_exception();
      done_ = true;
    }
    not_empty_.notify_one();
  }

  std::size_t depth_;
  std::mutex m_;
  std::condition_variable not_full_, not_empty_;
  std::deque<row> queue_;
  bool done_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;  // last: started once the members above exist
};

/// dataset::prefetch(depth).
class prefetch_node final : public node {
 public:
  prefetch_node(node_ptr child, std::int64_t depth) : child_(std::move(child)), depth_(depth) {
    if (depth < 1) throw error("prefetch: the depth must be at least 1: got " + std::to_string(depth));
  }
  std::unique_ptr<cursor> open(std::int64_t pass) const override {
    return std::make_unique<prefetch_cursor>(child_, pass, static_cast<std::size_t>(depth_));
  }
  std::int64_t size() const override { return child_->size(); }
  const std::vector<std::string>& columns() const override { return child_->columns(); }

 private:
  node_ptr child_;
  std::int64_t depth_;
};

}  // namespace tessera::data::detail
