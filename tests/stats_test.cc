// lazyfuse::stats() and reset_stats() (runtime/stats.h), and fused_ir's switches.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse {
namespace {

int64_t count_of(const std::string& text, const std::string& word) {
  int64_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

TEST(Stats, CountEvaluationsTheScheduleCacheAndHostMemory) {
  Tensor x = rand({1000});
  eval(x);
  reset_stats();
  const Stats zero = stats();
  EXPECT_EQ(zero.evaluations, 0);
  EXPECT_EQ(zero.schedule_cache_hits, 0);
  ASSERT_FALSE(zero.memory.empty());
  EXPECT_EQ(zero.memory[0].device, Device::cpu());
  EXPECT_EQ(zero.memory[0].peak_bytes, zero.memory[0].allocated_bytes) << "the peak starts over";
  const int64_t held = zero.memory[0].allocated_bytes;
  // The same graph twice: the second reuses the first's schedule.
  std::vector<Tensor> kept;
  for (int i = 0; i < 2; ++i) {
    kept.push_back((x * 3 + 1).exp());
    eval(kept.back());
  }
  const Stats after = stats();
  EXPECT_EQ(after.evaluations, 2);
  EXPECT_EQ(after.schedule_cache_hits, 1);
  EXPECT_EQ(after.kernels, 2) << "one fused kernel each";
  EXPECT_GE(after.nodes, 2 * 4);
  EXPECT_GE(after.memory[0].allocated_bytes, held + 2 * 1000 * 4) << "two results held";
  EXPECT_GE(after.memory[0].peak_bytes, after.memory[0].allocated_bytes);
  kept.clear();
  EXPECT_LE(stats().memory[0].allocated_bytes, held) << "freed results go back";
  EXPECT_NE(format_stats(after).find("schedule_cache_hits: 1\n"), std::string::npos)
      << format_stats(after);
  reset_stats();
  EXPECT_EQ(stats().evaluations, 0);
}

TEST(Stats, FusedIrFollowsTheSwitchesOfEvaluation) {
  if (!env_config().fusion) GTEST_SKIP() << "LAZYFUSE_FUSION=0";
  Tensor x = rand({64});
  eval(x);
  Tensor y = (x + 1).exp() * 2;
  Tensor z = (x + 1).exp() - 1;
  EXPECT_EQ(count_of(y.fused_ir(), "kernel elementwise @"), 1);
  EXPECT_EQ(count_of(y.fused_ir(EvalOptions{.fusion = false}), "kernel elementwise @"), 3)
      << "fusion off: a kernel an op\n"
      << y.fused_ir(EvalOptions{.fusion = false});
  // Both at once, as eval({y, z}) runs them: their common (x + 1).exp() computed once.
  const std::string both = fused_ir({y, z});
  EXPECT_EQ(count_of(both, " = exp "), 1) << both;
  EXPECT_EQ(count_of(both, "return "), 1) << both;
  EXPECT_FALSE(y.is_computed()) << "fused_ir computes nothing";
}

TEST(CudaStats, CountKernelsAndGpuMemory) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  Tensor x = rand({4096}, Device("cuda:0"));
  eval(x);
  reset_stats();
  // An expression no other test writes: its kernel is compiled, or loaded from the disk cache.
  Tensor y = (x * 1.25 + 0.125).sin().abs();
  eval(y);
  const Stats first = stats();
  EXPECT_EQ(first.kernels_compiled + first.kernels_loaded_from_disk + first.kernels_found_in_memory,
            1)
      << format_stats(first);
  ASSERT_GE(first.memory.size(), 2u);
  EXPECT_EQ(first.memory[1].device, Device("cuda:0"));
  EXPECT_GE(first.memory[1].allocated_bytes, 2 * 4096 * 4) << "x and y";
  Tensor again = (x * 1.25 + 0.125).sin().abs();
  eval(again);
  const Stats second = stats();
  EXPECT_EQ(second.evaluations, 2);
  EXPECT_EQ(second.kernels_compiled, first.kernels_compiled) << "nothing compiled again";
}

}  // namespace
}  // namespace lazyfuse
