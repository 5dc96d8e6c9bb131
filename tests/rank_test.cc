// Tensors of high rank: no rank limit anywhere. Every dim of size 2, permuted in reverse, so no
// two dims merge and every strided walk (elementwise programs and kernels, reductions, copies)
// goes through all of them. The expected values come from index arithmetic alone: element j of
// the reversed view of arange is the number whose bits are j's reversed.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include <lazyfuse/lazyfuse.h>

#include "lazyfuse/runtime/cuda/cuda_memory.h"

namespace lazyfuse {
namespace {

int64_t reverse_bits(int64_t j, int rank) {
  int64_t r = 0;
  for (int b = 0; b < rank; ++b) r |= ((j >> b) & 1) << (rank - 1 - b);
  return r;
}

void check_reversed_views(const Device& device) {
  for (int rank : {1, 2, 3, 8, 15, 16, 17, 18, 19, 20}) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank << " on " << device.str());
    const int64_t n = int64_t{1} << rank;
    Shape shape(rank, 2);
    std::vector<int64_t> reversed(rank);
    std::iota(reversed.rbegin(), reversed.rend(), 0);
    Tensor x = arange(n, TensorOptions().dtype(DType::Float64).device(device)).reshape(shape);
    Tensor view = x.permute(reversed);

    // An elementwise kernel over the strided view, and a copy of it.
    const std::vector<double> plus_one = (view + 1).to_vector<double>();
    const std::vector<double> copied = view.contiguous().to_vector<double>();
    // A reduction over the last dim of the view (a strided inner dim), and over every dim.
    const std::vector<double> row_sums = view.sum({rank - 1}).to_vector<double>();
    const double total = view.sum().item<double>();
    ASSERT_EQ(plus_one.size(), static_cast<size_t>(n));
    ASSERT_EQ(copied.size(), static_cast<size_t>(n));
    ASSERT_EQ(row_sums.size(), static_cast<size_t>(n / 2));
    int64_t mismatches = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double want = static_cast<double>(reverse_bits(j, rank));
      mismatches += plus_one[j] != want + 1 || copied[j] != want;
    }
    for (int64_t row = 0; row < n / 2; ++row) {
      const double want =
          static_cast<double>(reverse_bits(2 * row, rank) + reverse_bits(2 * row + 1, rank));
      mismatches += row_sums[row] != want;
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(total, static_cast<double>(n) * static_cast<double>(n - 1) / 2);
  }
}

TEST(HighRank, ReversedViewsOfEveryRankOnTheCpu) { check_reversed_views(Device::cpu()); }

TEST(CudaHighRank, ReversedViewsOfEveryRankOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  check_reversed_views(Device("cuda:0"));
}

}  // namespace
}  // namespace lazyfuse
