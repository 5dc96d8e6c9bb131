// Exceptions across OpenMP regions. An exception that leaves a parallel region terminates the
// process (the OpenMP runtime has nowhere to send it), so a host allocation that fails inside
// one would end the program instead of reaching the caller as an OutOfMemoryError. Each piece
// of work inside a region is skipped once stopped(), and wrapped in try/catch with
// catch (...) { failure.capture(); }, which keeps the first exception; after the region,
// rethrow_if_any() throws it on the calling thread. (A lambda wrapping the work would be
// neater, but clang 14 rejects lambdas in a region that capture the enclosing function's
// variables.)
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

namespace lazyfuse {

class ParallelFailure {
 public:
  // Whether some work has failed: what is left can be skipped.
  bool stopped() const { return failed_.load(std::memory_order_relaxed); }

  // Call in a catch block: keeps the exception being handled if it is the first.
  void capture() noexcept {
    std::lock_guard lock(mutex_);
    if (!first_) first_ = std::current_exception();
    failed_.store(true, std::memory_order_relaxed);
  }

  // Throws the first exception captured, if any. Call after the region, on one thread.
  void rethrow_if_any() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace lazyfuse
