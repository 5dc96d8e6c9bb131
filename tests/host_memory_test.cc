// The host's caching allocator (runtime/host_memory.h): a repeated evaluation's outputs reuse the
// blocks its last one freed, without new mappings or page faults, and the cache can be emptied.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/host_memory.h"

namespace lazyfuse {
namespace {

int64_t minor_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

TEST(HostMemory, ARepeatedEvaluationReusesItsBlocksWithoutPageFaults) {
  // 16 MiB a tensor: a fresh one would be a new mapping, 4096 pages of 4 KiB faulted in.
  const int64_t n = int64_t{1} << 22;
  Tensor z = rand({n}), y = rand({n});
  eval({z, y});
  auto run = [&] {
    Tensor t = (z + 2).exp() * y;
    eval(t);
    return t;
  };
  // A loop that keeps its last result holds two outputs at once: two blocks, alternating.
  Tensor last = run();
  last = run();
  const AllocatorStats before = cpu::allocator_stats();
  const int64_t faults_before = minor_page_faults();
  for (int repeat = 0; repeat < 5; ++repeat) last = run();
  const int64_t faults = minor_page_faults() - faults_before;
  const AllocatorStats after = cpu::allocator_stats();
  EXPECT_EQ(after.system_allocations, before.system_allocations);
  EXPECT_GE(after.cache_hits - before.cache_hits, 5);
  EXPECT_LT(faults, 256) << "minor page faults in five evaluations";
  // The values are the expression's (against float64 on the host), whatever block held them.
  const std::vector<double> zs = z.to_vector<double>(), ys = y.to_vector<double>();
  const std::vector<double> got = last.to_vector<double>();
  for (int64_t i = 0; i < n; i += 4099)
    ASSERT_NEAR(got[i], std::exp(zs[i] + 2) * ys[i], 1e-6 * std::exp(zs[i] + 2)) << "at " << i;
}

TEST(HostMemory, StatisticsFollowTensorsAndEmptyCacheReleasesTheRest) {
  cpu::empty_cache();
  const AllocatorStats start = cpu::allocator_stats();
  EXPECT_EQ(start.cached_bytes, 0);
  {
    Tensor a = rand({1 << 20});  // 4 MiB: two huge pages
    eval(a);
    const AllocatorStats held = cpu::allocator_stats();
    EXPECT_GE(held.allocated_bytes - start.allocated_bytes, int64_t{4} << 20);
    EXPECT_GE(held.peak_bytes, held.allocated_bytes);
  }
  const AllocatorStats freed = cpu::allocator_stats();
  EXPECT_GE(freed.cached_bytes, int64_t{4} << 20);
  EXPECT_EQ(freed.allocated_bytes, start.allocated_bytes);
  cpu::empty_cache();
  EXPECT_EQ(cpu::allocator_stats().cached_bytes, 0);
  // A block of the same size after emptying comes from the system again.
  Tensor b = rand({1 << 20});
  eval(b);
  EXPECT_EQ(cpu::allocator_stats().system_allocations, freed.system_allocations + 1);
}

// Large blocks held at once start at different offsets within their huge pages, whole 4 KiB
// pages apart (Note [Coloured huge blocks] in runtime/host_memory.cc): arrays read side by side
// must not share their physical address bits below 2 MiB. Each block is whole and writable, and
// goes back to the system without error (AddressSanitizer checks the frees).
TEST(HostMemory, LargeBlocksHeldAtOnceStartAtDifferentPagesOfTheirHugePages) {
  constexpr int64_t kHugePage = int64_t{2} << 20, kBytes = int64_t{4} << 20;
  cpu::empty_cache();  // all seven from the system, each given the next colour
  std::vector<void*> blocks;
  std::vector<int64_t> offsets;
  for (int k = 0; k < 7; ++k) {
    void* block = cpu::allocate(kBytes);
    ASSERT_NE(block, nullptr);
    const auto address = reinterpret_cast<uintptr_t>(block);
    EXPECT_EQ(address % 4096, 0u) << "block " << k;
    std::memset(block, k, static_cast<size_t>(kBytes));
    blocks.push_back(block);
    offsets.push_back(static_cast<int64_t>(address % kHugePage));
  }
  std::sort(offsets.begin(), offsets.end());
  EXPECT_EQ(std::adjacent_find(offsets.begin(), offsets.end()), offsets.end())
      << "two of seven blocks held at once start at the same offset in their huge pages";
  for (int k = 0; k < 7; ++k) {
    EXPECT_EQ(static_cast<unsigned char*>(blocks[k])[kBytes - 1], k);
    cpu::release(blocks[k], kBytes);
  }
  cpu::empty_cache();
  EXPECT_EQ(cpu::allocator_stats().cached_bytes, 0);
}

}  // namespace
}  // namespace lazyfuse
