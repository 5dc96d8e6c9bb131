#include "runtime/pool_allocator.h"

#include <array>
#include <mutex>
#include <new>

namespace lazyfuse {
namespace {

#if !defined(__SANITIZE_ADDRESS__)
// Blocks of one size class, kept after use up to a bound; shared by every thread.
class BlockPool {
 public:
  void* allocate(size_t size) {
    {
      std::lock_guard lock(mutex_);
      if (Block* block = head_) {
        head_ = block->next;
        --cached_;
        return block;
      }
    }
    return ::operator new(size);
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
};

// Size classes of 16 bytes up to 2 KiB; larger blocks come from the heap.
constexpr size_t kClassBytes = 16, kClasses = 128;

// Never destroyed: objects may be freed by static destructors after every other static is gone.
std::array<BlockPool, kClasses>& pools() {
  static auto* pools = new std::array<BlockPool, kClasses>();
  return *pools;
}
#endif

}  // namespace

void* pool_allocate(size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  return ::operator new(size);
#else
  const size_t size_class = (size + kClassBytes - 1) / kClassBytes;
  if (size_class == 0 || size_class > kClasses) return ::operator new(size);
  return pools()[size_class - 1].allocate(size_class * kClassBytes);
#endif
}

void pool_deallocate(void* pointer, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  ::operator delete(pointer, size);
#else
  const size_t size_class = (size + kClassBytes - 1) / kClassBytes;
  if (size_class == 0 || size_class > kClasses) return ::operator delete(pointer, size);
  pools()[size_class - 1].deallocate(pointer);
#endif
}

}  // namespace lazyfuse
