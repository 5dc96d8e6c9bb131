// Device memory: a caching allocator per GPU. Freed blocks are kept by size and reused, since
// cuMemAlloc and cuMemFree synchronise the device and cost tens of microseconds. When memory
// runs out the cache is emptied and the allocation retried before OutOfMemoryError.
#pragma once

#include <cstdint>

namespace lazyfuse::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // handed out and not yet freed
  int64_t cached_bytes = 0;     // freed, held for reuse
  int64_t peak_bytes = 0;
  int64_t device_allocations = 0;  // cuMemAlloc calls
  int64_t cache_hits = 0;
};

void* allocate(int device, int64_t nbytes);
void release(int device, void* pointer, int64_t nbytes);
AllocatorStats allocator_stats(int device);
// Returns every cached block to the driver.
void empty_cache(int device);

}  // namespace lazyfuse::cuda
