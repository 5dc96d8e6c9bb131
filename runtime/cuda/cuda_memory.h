// Device memory: a caching allocator per GPU. Freed blocks are kept by size and reused, since
// cuMemAlloc and cuMemFree synchronise the device and cost tens of microseconds. When memory
// runs out the cache is emptied and the allocation retried before OutOfMemoryError.
#pragma once

#include <cstdint>

#include "lazyfuse/runtime/storage.h"

namespace lazyfuse::cuda {

// A block of `nbytes` (rounded up) from the active pool where one is active on this thread for
// `device`, otherwise from the device's cache.
void* allocate(int device, int64_t nbytes);
void release(int device, void* pointer, int64_t nbytes);
AllocatorStats allocator_stats(int device);
// Sets peak_bytes to what is allocated now, as torch.cuda.reset_peak_memory_stats.
void reset_peak_memory_stats(int device);
// Returns every cached block to the driver, the pools' free blocks included.
void empty_cache(int device);

// Private pools (Note [A graph's own memory pool] in cuda_memory.cc). A pool's blocks return to
// it when freed and are handed out only while it is active; a destroyed pool's blocks go back to
// the device's cache, now or when freed.
int64_t create_pool(int device);
void destroy_pool(int device, int64_t pool);
// A hash of which blocks `pool` holds free now, by size: two runs that start from equal
// fingerprints and allocate alike get the same blocks.
uint64_t pool_fingerprint(int device, int64_t pool);
// The fingerprint `pool` would have with the blocks it took after its first `blocks_before`
// free as well: what a run that grew the pool leaves the next one once its blocks are freed.
uint64_t grown_pool_fingerprint(int device, int64_t pool, int64_t blocks_before);

// The blocks `pool` has taken, free or in use: it grows until its runs find what they need in it.
int64_t pool_blocks(int device, int64_t pool);

// Makes `pool` the one allocations for `device` on this thread come from while it lives.
class PoolScope {
 public:
  PoolScope(int device, int64_t pool);
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  int previous_device_;
  int64_t previous_pool_;
};

}  // namespace lazyfuse::cuda
