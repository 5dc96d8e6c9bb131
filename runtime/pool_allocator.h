// Objects the frontend makes by the hundred for every training step (lazy values, tensor
// handles, gradient nodes) come from free lists of blocks of their size rather than from
// malloc (each thread its own lists, without a lock): glibc's thread cache keeps 7 blocks of a
// size, and a step frees hundreds of each at once, so most went through malloc's slow bins.
// Measured under callgrind over bench/host_cost.cc's BM_TrainStep/8/16: a node made by make_op
// took 1587 instructions, against 1728 through malloc and 1968 through
// std::pmr::synchronized_pool_resource (whose locking costs more than malloc's slow path). A
// library built with AddressSanitizer takes them from the heap, so that a use after free is
// still caught (pool_allocator.cc decides, so that every translation unit sees the same inline
// code).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace lazyfuse {

// A block of `size` bytes (aligned for any scalar type) from the pool of its size class, and
// its return.
void* pool_allocate(size_t size);
void pool_deallocate(void* pointer, size_t size);

// An allocator over the pools for single objects (what std::allocate_shared asks for).
template <typename T>
struct PoolAllocator {
  using value_type = T;
  static_assert(alignof(T) <= alignof(std::max_align_t));
  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) {
    if (n != 1) return std::allocator<T>().allocate(n);
    return static_cast<T*>(pool_allocate(sizeof(T)));
  }
  void deallocate(T* pointer, size_t n) {
    if (n != 1) return std::allocator<T>().deallocate(pointer, n);
    pool_deallocate(pointer, sizeof(T));
  }
  friend bool operator==(const PoolAllocator&, const PoolAllocator&) { return true; }
};

// std::make_shared through the pools.
template <typename T, typename... Args>
std::shared_ptr<T> make_pooled(Args&&... args) {
  return std::allocate_shared<T>(PoolAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace lazyfuse
