// Reductions over leading dims with work after them (a softmax over dim 0, a batch norm's
// statistics and normalization): one column step, whose results are compared with float64
// references computed here, on the CPU and (where there is one) the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/env.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

#define SKIP_IF_FUSION_OFF_BY_ENV() \
  if (!env_config().fusion) GTEST_SKIP() << "LAZYFUSE_FUSION=0 is set"

std::vector<double> random_values(int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

// The element (r, c) of a [rows, columns] matrix at (c, r) of its [columns, rows] transpose.
std::vector<double> transposed(const std::vector<double>& x, int64_t rows, int64_t columns) {
  std::vector<double> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c) t[c * rows + r] = x[r * columns + c];
  return t;
}

// softmax(x, 0) of a [rows, columns] matrix: the rows' softmax of its transpose.
std::vector<double> softmax_over_columns(const std::vector<double>& x, int64_t rows,
                                         int64_t columns) {
  return transposed(reference::host_softmax_rows(transposed(x, rows, columns), rows), columns,
                    rows);
}

// (x - mean) / sqrt(var + eps) over dim 0, the variance biased (a batch norm in training).
std::vector<double> normalized_columns(const std::vector<double>& x, int64_t rows, int64_t columns,
                                       double eps) {
  std::vector<double> out(x.size());
  for (int64_t c = 0; c < columns; ++c) {
    double mean = 0, var = 0;
    for (int64_t r = 0; r < rows; ++r) mean += x[r * columns + c] / rows;
    for (int64_t r = 0; r < rows; ++r)
      var += (x[r * columns + c] - mean) * (x[r * columns + c] - mean) / rows;
    for (int64_t r = 0; r < rows; ++r)
      out[r * columns + c] = (x[r * columns + c] - mean) / std::sqrt(var + eps);
  }
  return out;
}

Tensor normalize_columns(const Tensor& x, double eps) {
  const Tensor centred = x - x.mean({0}, true);
  return centred * ((centred * centred).mean({0}, true) + eps).rsqrt();
}

Schedule schedule_of(const Tensor& t) {
  const std::vector<LazyRef> values = {t.value()};
  return run_pipeline(build_graph(values).graph, PipelineOptions{});
}

int64_t kernels_to_eval(const Tensor& t) {
  reset_eval_stats();
  eval({t});
  EXPECT_EQ(eval_stats().evaluations, 1);
  return eval_stats().kernels;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                 double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << "element " << i;
}

// The shapes of the tests: a column tile (32 columns) whole and not, columns longer and shorter
// than a block's eight slices walk at once.
struct Case {
  int64_t rows, columns;
};
constexpr Case kCases[] = {{1000, 256}, {777, 45}, {5, 100}};

TEST(ColumnStep, SoftmaxOverTheLeadingDimIsOneKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.columns);
    const std::vector<double> values = random_values(c.rows * c.columns, -6, 6, 5);
    const Tensor x = from_vector(values, {c.rows, c.columns});
    const std::vector<double> x32 = x.to_vector<double>();
    const Tensor soft = softmax(x, 0);
    const Schedule schedule = schedule_of(soft);
    ASSERT_EQ(schedule.steps.size(), 1u) << print_schedule(schedule);
    EXPECT_EQ(schedule.steps[0].kind, StepKind::Column);
    EXPECT_EQ(kernels_to_eval(soft), 1);
    expect_near(soft.to_vector<double>(), softmax_over_columns(x32, c.rows, c.columns), 1e-5, 0);
    const Tensor logs = log_softmax(x, 0);
    EXPECT_EQ(kernels_to_eval(logs), 1);
    std::vector<double> want_logs = softmax_over_columns(x32, c.rows, c.columns);
    for (double& v : want_logs) v = std::log(v);
    expect_near(logs.to_vector<double>(), want_logs, 1e-5, 1e-5);
  }
}

// A batch norm's mean and variance over the batch and the normalization after them: the
// statistics' rsqrt is a value per column, computed between the passes.
TEST(ColumnStep, BatchStatisticsAndTheNormalizationAreOneKernel) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.columns);
    const Tensor x = from_vector(random_values(c.rows * c.columns, -2, 5, 6), {c.rows, c.columns});
    const Tensor y = normalize_columns(x, 1e-5);
    EXPECT_EQ(kernels_to_eval(y), 1);
    expect_near(y.to_vector<double>(),
                normalized_columns(x.to_vector<double>(), c.rows, c.columns, 1e-5), 1e-4, 1e-4);
  }
}

// Over more than the leading dim, and over the leading dim of a 3-D tensor: the kept dims are
// the columns, whatever their rank.
TEST(ColumnStep, ColumnsOfAnyRank) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  const std::vector<double> values = random_values(6 * 50 * 4 * 16, -3, 3, 7);
  const Tensor x = from_vector(values, {6, 50, 4, 16});
  const std::vector<double> x32 = x.to_vector<double>();
  const Tensor over_two = softmax(x.reshape({300, 4, 16}), 0);
  EXPECT_EQ(kernels_to_eval(over_two), 1);
  expect_near(over_two.to_vector<double>(), softmax_over_columns(x32, 300, 64), 1e-5, 0);
  const Tensor e = (x - x.amax({0, 1}, true)).exp();
  const Tensor over_leading_two = e / e.sum({0, 1}, true);
  EXPECT_EQ(kernels_to_eval(over_leading_two), 1);
  expect_near(over_leading_two.to_vector<double>(), softmax_over_columns(x32, 300, 64), 1e-5, 0);
}

// Columns longer than FusionOptions::max_column, or fewer than a warp's lanes, stay the column
// reductions and elementwise kernels they were: a block's walk of such columns would be too
// long, or leave most lanes idle. Long: the max, the exponentials stored with their column sum,
// the sum's reciprocal, the product; few: the exponentials a kernel of their own too.
TEST(ColumnStep, LongOrFewColumnsStayApart) {
  SKIP_IF_FUSION_OFF_BY_ENV();
  struct Apart {
    Case shape;
    int64_t kernels;
  };
  for (const Apart& c : {Apart{{FusionOptions{}.max_column + 1, 64}, 4}, Apart{{100, 8}, 5}}) {
    const int64_t rows = c.shape.rows, columns = c.shape.columns;
    SCOPED_TRACE(testing::Message() << rows << " x " << columns);
    const Tensor x = from_vector(random_values(rows * columns, -6, 6, 8), {rows, columns});
    const Tensor soft = softmax(x, 0);
    EXPECT_EQ(kernels_to_eval(soft), c.kernels);
    expect_near(soft.to_vector<double>(),
                softmax_over_columns(x.to_vector<double>(), rows, columns), 1e-5, 0);
  }
}

// The fused IR names the step and its members' roles, and reads back to the same schedule.
TEST(ColumnStep, FusedIrShowsTheStepAndReadsBack) {
  const std::string text = R"(graph @main(%0: f32[64,48] @cpu) {
  %1 = mean %0 {dims = [0], keepdim = true} : f32[1,48] @cpu
  %2 = sub %0, %1 : f32[64,48] @cpu
  %3 = mul %2, %2 : f32[64,48] @cpu
  %4 = mean %3 {dims = [0], keepdim = true} : f32[1,48] @cpu
  %5 = const {value = 1e-05} : f32[] @cpu
  %6 = add %4, %5 : f32[1,48] @cpu
  %7 = rsqrt %6 : f32[1,48] @cpu
  %8 = mul %2, %7 : f32[64,48] @cpu
  return %8
}
)";
  PipelineOptions options;
  options.only = std::vector<std::string>{"fusion"};
  const std::string fused = print_schedule(run_pipeline(parse_graph(text), options));
  EXPECT_NE(fused.find("kernel column"), std::string::npos) << fused;
  EXPECT_NE(fused.find("%7 = rsqrt %6 : f32[1,48] @cpu  // row value"), std::string::npos) << fused;
  EXPECT_NE(fused.find("%8 = mul %2, %7 : f32[64,48] @cpu  // epilogue"), std::string::npos)
      << fused;
  EXPECT_EQ(print_schedule(run_pipeline(parse_graph(fused), options)), fused);
}

TEST(ColumnStep, MatchesFloat64OnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  SKIP_IF_FUSION_OFF_BY_ENV();
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(testing::Message() << dtype << " " << c.rows << " x " << c.columns);
      const Tensor x =
          from_vector(random_values(c.rows * c.columns, -6, 6, 9), {c.rows, c.columns}).to(dtype);
      const std::vector<double> xs = x.to_vector<double>();
      const Tensor gx = x.to("cuda");
      const Tensor soft = softmax(gx, 0), norm = normalize_columns(gx, 1e-5);
      EXPECT_EQ(kernels_to_eval(soft), 1);
      EXPECT_EQ(kernels_to_eval(norm), 1);
      // float32 to its rounding of the sums; bfloat16 to a unit in its last place (2^-8 of a
      // value), from float32 sums.
      const double rtol = dtype == kFloat32 ? 1e-5 : 1.0 / 128;
      expect_near(soft.to_vector<double>(), softmax_over_columns(xs, c.rows, c.columns), rtol, 0);
      expect_near(norm.to_vector<double>(), normalized_columns(xs, c.rows, c.columns, 1e-5),
                  dtype == kFloat32 ? 1e-4 : 1.0 / 64, dtype == kFloat32 ? 1e-4 : 1.0 / 64);
    }
  }
}

}  // namespace
}  // namespace lazyfuse
