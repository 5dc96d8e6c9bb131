// Exceptions across OpenMP regions. An exception that leaves a parallel region terminates the
// process (the OpenMP runtime has nowhere to send it), so a host allocation that fails inside
// one would end the program instead of reaching the caller as an OutOfMemoryError. Work inside
// a region goes through ParallelFailure::run, which keeps the first exception and makes the
// remaining work a no-op; after the region, rethrow_if_any() throws it on the calling thread.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

namespace lazyfuse {

class ParallelFailure {
 public:
  template <typename Work>
  void run(Work&& work) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      work();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }

  // Throws the first exception run() caught, if any. Call after the region, on one thread.
  void rethrow_if_any() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace lazyfuse
