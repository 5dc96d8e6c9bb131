// Host memory for tensors: a caching allocator, as each GPU has (runtime/cuda/cuda_memory.h). A
// freed block is kept by its rounded size and handed to the next request of that size, so a
// repeated evaluation's outputs land in memory that is already mapped: a fresh allocation above
// glibc's mmap threshold is a new mapping, faulted in a page at a time on first write. Blocks of 2
// MiB and more are 2 MiB aligned and advised as huge pages (MADV_HUGEPAGE). The cache holds at most
// LAZYFUSE_HOST_CACHE_MB (default a quarter of physical memory); past that a freed block goes
// back to the system. When an allocation fails the cache is emptied and it is tried again
// before OutOfMemoryError.
#pragma once

#include <cstdint>

#include "lazyfuse/runtime/storage.h"

namespace lazyfuse::cpu {

// A block of at least `nbytes`, 64-byte aligned.
void* allocate(int64_t nbytes);
void release(void* pointer, int64_t nbytes);
AllocatorStats allocator_stats();
// Sets peak_bytes to what is allocated now (torch.cuda.reset_peak_memory_stats for the host).
void reset_peak_memory_stats();
// Returns every cached block to the system.
void empty_cache();

}  // namespace lazyfuse::cpu
