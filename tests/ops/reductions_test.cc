// Differential tests of lazyfuse's reductions: sum, mean, max and min over each dim, several
// dims and all of them, with and without keepdim, on contiguous, transposed, permuted and
// narrowed inputs of every dtype; reductions of pending expressions; NaN propagation; and
// int64 accumulation of integer sums.
//
// Expected values come from the independent float64 reference in tests/reference/ (long double
// sums, NaN-propagating max and min), which never calls lazyfuse to compute them.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "lazyfuse/lazyfuse.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

// The expected values and their vocabulary (Host, ref_map, random_host, expect_matches, ...)
// come from the independent float64 reference.
using namespace reference;

TEST(OpsReduction, SumMeanMaxMinOverDimsAndLayouts) {
  struct ReduceInput {
    const char* name;
    Shape base;
    std::function<Tensor(const Tensor&)> view;
    std::function<Host(const Host&)> host_view;
    std::vector<std::vector<int64_t>> dim_lists;  // {} means all dims, via the no-dim overloads
    std::vector<DType> dtypes;
  };
  const std::vector<DType> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  const std::vector<DType> large_dtypes = {DType::Float32, DType::Float64, DType::Int32,
                                           DType::Float16};
  const std::vector<ReduceInput> inputs = {
      // 210000 elements: several reduction blocks (2^15) per row, and rows of their own.
      {"3x70000", {3, 70000}, nullptr, nullptr, {{}, {0}, {1}, {-1}, {0, 1}}, large_dtypes},
      {"transposed 70000x3",
       {70000, 3},
       [](const Tensor& t) { return t.t(); },
       [](const Host& h) { return host_transpose(h, 0, 1); },
       {{}, {0}, {-1}},
       {DType::Float32, DType::Int64}},
      {"4x5x6", {4, 5, 6}, nullptr, nullptr, {{}, {0}, {1}, {-1}, {0, 2}, {-1, -3}, {1, 2}}, all},
      {"permuted 5x6x4",
       {5, 6, 4},
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       },
       [](const Host& h) {
         return host_permute(h, {2, 0, 1});
       },
       {{}, {0}, {-2}, {0, 2}},
       all},
      {"narrowed 9x30",
       {9, 30},
       [](const Tensor& t) { return t.narrow(1, 5, 17); },
       [](const Host& h) { return host_narrow(h, 1, 5, 17); },
       {{}, {0}, {1}},
       all},
      {"scalar", {}, nullptr, nullptr, {{}}, all},
  };
  std::mt19937 rng(9);
  for (const ReduceInput& input : inputs) {
    for (DType dtype : input.dtypes) {
      Host base = random_host(rng, input.base, dtype, {-1, 1, -50, 50});
      Tensor x = to_tensor(base, dtype);
      Host h = base;
      if (input.view) {
        x = input.view(x);
        h = input.host_view(base);
      }
      for (const std::vector<int64_t>& dims : input.dim_lists) {
        for (bool keepdim : {false, true}) {
          if (dims.empty() && keepdim) continue;  // the all-dims overloads have no keepdim
          std::string what = std::string(input.name) + " " + name_of(dtype) + " dims " +
                             shape_text(dims) + (keepdim ? " keepdim" : "");
          // sum: integers and bool accumulate to int64.
          DType sum_dtype = is_floating(dtype) ? dtype : DType::Int64;
          Reduced sum = host_reduce(h, dims, keepdim, Reduce::Sum);
          Tensor s = dims.empty() ? x.sum() : x.sum(dims, keepdim);
          expect_matches(s, sum.value, sum_dtype, tol_for(sum_dtype), "sum " + what,
                         sum_slack(sum));
          // mean: floating only.
          if (is_floating(dtype)) {
            Reduced mean = host_reduce(h, dims, keepdim, Reduce::Mean);
            Tensor m = dims.empty() ? x.mean() : x.mean(dims, keepdim);
            expect_matches(m, mean.value, dtype, tol_for(dtype), "mean " + what, sum_slack(mean));
          } else {
            EXPECT_THROW(dims.empty() ? x.mean() : x.mean(dims, keepdim), DTypeError) << what;
          }
          // max and min: one dim or all; exact, they only pick elements.
          if (dims.size() <= 1) {
            for (Reduce kind : {Reduce::Max, Reduce::Min}) {
              Reduced want = host_reduce(h, dims, keepdim, kind);
              bool is_max = kind == Reduce::Max;
              Tensor got = dims.empty()
                               ? (is_max ? x.max() : x.min())
                               : (is_max ? x.max(dims[0], keepdim) : x.min(dims[0], keepdim));
              expect_matches(got, want.value, dtype, {}, (is_max ? "max " : "min ") + what);
            }
          }
        }
      }
    }
  }
}

// A reduction over leading dims reduces a tile of columns at a time (Note [Column reductions]
// in runtime/cpu/cpu_library.cc), in place of a row per column: every column must keep the bits its
// row gives, here the same column read as a row of the transposed copy. 33,000 rows: two
// reduction blocks, several stretches; 20 and 80 columns: a partial tile, and a full one too.
TEST(OpsReduction, ColumnsReduceToTheBitsOfTheirRows) {
  std::mt19937 rng(11);
  for (int64_t columns : {20, 80}) {
    for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float64}) {
      const Host h = random_host(rng, {33000, columns}, dtype, {-1, 1, -50, 50});
      const Tensor x = to_tensor(h, dtype);
      const Tensor rows = x.t().contiguous();
      eval(rows);
      const std::string what = std::to_string(columns) + " columns of " + name_of(dtype);
      auto bits = [](const Tensor& t) { return t.to(kFloat64).to_vector<double>(); };
      EXPECT_EQ(bits(x.sum({0})), bits(rows.sum({1}))) << "sum, " << what;
      EXPECT_EQ(bits(x.mean({0})), bits(rows.mean({1}))) << "mean, " << what;
      EXPECT_EQ(bits(x.max(0)), bits(rows.max(1))) << "max, " << what;
      EXPECT_EQ(bits(x.min(0)), bits(rows.min(1))) << "min, " << what;
      // And against float64, within the sum's tolerance.
      Reduced sum = host_reduce(h, {0}, false, Reduce::Sum);
      expect_matches(x.sum({0}), sum.value, dtype, tol_for(dtype), "column sum, " + what,
                     sum_slack(sum));
    }
  }
}

TEST(OpsReduction, ReductionsOfPendingExpressions) {
  // A reduction reading a fused producer, and a reduction feeding further elementwise work.
  std::mt19937 rng(10);
  Host a = random_host(rng, {40, 1300}, kFloat64, {-1, 1, 0, 0});
  Tensor x = to_tensor(a, kFloat64);
  Host doubled = ref_unary(a, [](double v) { return v * 2 + 1; });
  Reduced rows = host_reduce(doubled, {1}, true, Reduce::Sum);
  expect_matches((x * 2 + 1).sum({1}, true), rows.value, kFloat64, tol_for(kFloat64),
                 "sum of pending", sum_slack(rows));
  Reduced col_max = host_reduce(a, {0}, false, Reduce::Max);
  Host centred = ref_map({&a, &col_max.value}, [](double v, double m, double) { return v - m; });
  expect_matches(x - x.max(0), centred, kFloat64, tol_for(kFloat64), "x - max(0)");
}

TEST(OpsReduction, NanPropagatesThroughMaxAndMin) {
  Host h{{3, 2000}, std::vector<double>(6000)};
  for (int64_t i = 0; i < 6000; ++i) h.v[i] = std::sin(static_cast<double>(i));
  h.v[1 * 2000 + 1777] = kNan;  // row 1, past the first block of 1024
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    Host q = ref_map({&h}, [dtype](double v, double, double) { return quantize(v, dtype); });
    Tensor x = to_tensor(q, dtype);
    EXPECT_TRUE(std::isnan(x.max().item<double>())) << name_of(dtype);
    EXPECT_TRUE(std::isnan(x.min().item<double>())) << name_of(dtype);
    EXPECT_TRUE(std::isnan(x.sum().item<double>())) << name_of(dtype);
    for (Reduce kind : {Reduce::Max, Reduce::Min}) {
      for (int64_t dim : {0, 1, -1}) {
        Reduced want = host_reduce(q, {dim}, false, kind);
        Tensor got = kind == Reduce::Max ? x.max(dim) : x.min(dim);
        expect_matches(
            got, want.value, dtype, {},
            name_of(dtype) + (kind == Reduce::Max ? " max " : " min ") + std::to_string(dim));
      }
    }
  }
}

TEST(OpsReduction, IntegerSumsAreExactInt64) {
  // int32 values whose sum overflows int32: the int64 accumulator must hold it.
  Host h{{3, 50000}, std::vector<double>(150000, 2000000000.0)};
  for (int64_t i = 0; i < 150000; i += 7) h.v[i] = -2000000000.0 + static_cast<double>(i);
  Tensor x = to_tensor(h, kInt32);
  Tensor total = x.sum();
  EXPECT_EQ(total.dtype(), kInt64);
  int64_t want = 0;
  for (double v : h.v) want += static_cast<int64_t>(v);
  EXPECT_EQ(total.item<int64_t>(), want);
  std::vector<int64_t> rows = x.sum({-1}).to_vector<int64_t>();
  for (int r = 0; r < 3; ++r) {
    int64_t row = 0;
    for (int c = 0; c < 50000; ++c) row += static_cast<int64_t>(h.v[r * 50000 + c]);
    EXPECT_EQ(rows[r], row) << "row " << r;
  }
  EXPECT_EQ(ones({5, 3}, kBool).sum().item<int64_t>(), 15);
  EXPECT_THROW(ones({3}, kInt64).mean(), DTypeError);
  EXPECT_THROW(ones({3}, kBool).mean({0}), DTypeError);
}

}  // namespace
}  // namespace lazyfuse
