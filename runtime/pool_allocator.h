// Objects the frontend makes by the hundred for every training step (lazy values, tensor
// handles, gradient nodes) come from free lists of blocks of their size rather than from
// malloc: glibc's thread cache keeps 7 blocks of a size, and a step frees hundreds of each at
// once, so most went through malloc's slow bins. Measured under callgrind over bench/
// host_cost.cc's BM_TrainStep/8/16: a node made by make_op took 1561 instructions, against 1728
// through malloc and 1968 through std::pmr::synchronized_pool_resource (whose locking costs more
// than malloc's slow path). Under AddressSanitizer the objects come from the heap as before,
// so that a use after free is still caught.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

namespace lazyfuse {

namespace internal {

// Blocks of one size, kept after use up to a bound; shared by every thread.
class BlockPool {
 public:
  explicit BlockPool(size_t size) : size_(size < sizeof(Block) ? sizeof(Block) : size) {}
  void* allocate() {
    {
      std::lock_guard lock(mutex_);
      if (Block* block = head_) {
        head_ = block->next;
        --cached_;
        return block;
      }
    }
    return ::operator new(size_);
  }
  void deallocate(void* pointer) {
    {
      std::lock_guard lock(mutex_);
      if (cached_ < kMaxCached) {
        head_ = new (pointer) Block{head_};
        ++cached_;
        return;
      }
    }
    ::operator delete(pointer);
  }

 private:
  struct Block {
    Block* next;
  };
  // What a graph of a few thousand nodes frees at once.
  static constexpr size_t kMaxCached = 8192;
  std::mutex mutex_;
  Block* head_ = nullptr;
  size_t cached_ = 0;
  size_t size_;
};

// The pool of blocks of `Size` bytes, never destroyed: objects may be freed by static
// destructors after every other static is gone.
template <size_t Size>
BlockPool& block_pool() {
  static BlockPool* pool = new BlockPool(Size);
  return *pool;
}

}  // namespace internal

// An allocator over block_pool for single objects (what std::allocate_shared asks for).
template <typename T>
struct PoolAllocator {
  using value_type = T;
  static_assert(alignof(T) <= alignof(std::max_align_t));
  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) {
    if (n != 1) return std::allocator<T>().allocate(n);
    return static_cast<T*>(internal::block_pool<sizeof(T)>().allocate());
  }
  void deallocate(T* pointer, size_t n) {
    if (n != 1) return std::allocator<T>().deallocate(pointer, n);
    internal::block_pool<sizeof(T)>().deallocate(pointer);
  }
  friend bool operator==(const PoolAllocator&, const PoolAllocator&) { return true; }
};

// std::make_shared through the pools.
template <typename T, typename... Args>
std::shared_ptr<T> make_pooled(Args&&... args) {
#if defined(__SANITIZE_ADDRESS__)
  return std::make_shared<T>(std::forward<Args>(args)...);
#else
  return std::allocate_shared<T>(PoolAllocator<T>(), std::forward<Args>(args)...);
#endif
}

}  // namespace lazyfuse
