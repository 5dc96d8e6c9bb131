#include "lazyfuse/runtime/pool_allocator.h"

#include <array>
#include <cstdint>
#include <new>

namespace lazyfuse {
namespace {

#if !defined(__SANITIZE_ADDRESS__)
// Size classes of 16 bytes up to 2 KiB; larger blocks come from the heap.
constexpr size_t kClassBytes = 16, kClasses = 128;
// What a graph of a few thousand nodes frees at once, per class and thread.
constexpr uint32_t kMaxCached = 8192;

// Each thread keeps its own free lists, so a block costs no lock: a node of a graph is made and
// dropped by the thread that writes the expression and evaluates it (callgrind over
// bench/host_cost.cc's BM_EvaluateOneElement: the pools' mutex was 1.1K of its 17.5K
// instructions). A block freed by another thread joins that thread's lists.
struct ThreadBlocks {
  struct Block {
    Block* next;
  };
  std::array<Block*, kClasses> heads{};
  std::array<uint32_t, kClasses> counts{};
  ~ThreadBlocks();
};

// Trivially destructible, so they can be read while the thread's other objects are destroyed:
// blocks freed after the thread's lists are gone go straight back to the heap.
thread_local ThreadBlocks* thread_blocks = nullptr;
thread_local bool thread_blocks_gone = false;

ThreadBlocks::~ThreadBlocks() {
  thread_blocks = nullptr;
  thread_blocks_gone = true;
  for (Block* head : heads)
    while (head != nullptr) {
      Block* next = head->next;
      ::operator delete(head);
      head = next;
    }
}

ThreadBlocks* blocks_of_this_thread() {
  if (thread_blocks != nullptr || thread_blocks_gone) return thread_blocks;
  thread_local ThreadBlocks blocks;
  thread_blocks = &blocks;
  return thread_blocks;
}
#endif

}  // namespace

void* pool_allocate(size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  return ::operator new(size);
#else
  const size_t size_class = (size + kClassBytes - 1) / kClassBytes;
  if (size_class == 0 || size_class > kClasses) return ::operator new(size);
  if (ThreadBlocks* blocks = blocks_of_this_thread()) {
    if (ThreadBlocks::Block* block = blocks->heads[size_class - 1]) {
      blocks->heads[size_class - 1] = block->next;
      --blocks->counts[size_class - 1];
      return block;
    }
  }
  return ::operator new(size_class* kClassBytes);
#endif
}

void pool_deallocate(void* pointer, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  ::operator delete(pointer, size);
#else
  const size_t size_class = (size + kClassBytes - 1) / kClassBytes;
  if (size_class == 0 || size_class > kClasses) return ::operator delete(pointer, size);
  ThreadBlocks* blocks = blocks_of_this_thread();
  if (blocks == nullptr || blocks->counts[size_class - 1] >= kMaxCached)
    return ::operator delete(pointer);
  blocks->heads[size_class - 1] = new (pointer) ThreadBlocks::Block{blocks->heads[size_class - 1]};
  ++blocks->counts[size_class - 1];
#endif
}

}  // namespace lazyfuse
