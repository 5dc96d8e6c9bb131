// Tests of lazyfuse's factories: zeros, ones, full and scalar_tensor with their values and
// dtypes; tensors with no elements of any shape; arange's PyTorch dtype rules; and rand and
// randn, seeded, plausible in their moments and below one in every floating dtype.
//
// Expected values come from the independent float64 reference in tests/reference/, which never
// calls lazyfuse to compute them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "lazyfuse/lazyfuse.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

// The expected values and their vocabulary (Host, ref_map, random_host, expect_matches, ...)
// come from the independent float64 reference.
using namespace reference;

Host filled(const Shape& shape, double value) {
  return Host{shape, std::vector<double>(count(shape), value)};
}

TEST(OpsFactories, ConstantsHaveTheirValuesAndDTypes) {
  expect_matches(zeros({2, 3}), filled({2, 3}, 0), kFloat32, {}, "zeros");
  expect_matches(zeros({5}, kFloat64), filled({5}, 0), kFloat64, {}, "zeros f64");
  expect_matches(ones({4}, kInt32), filled({4}, 1), kInt32, {}, "ones i32");
  expect_matches(ones({2, 2}, kBFloat16), filled({2, 2}, 1), kBFloat16, {}, "ones bf16");
  expect_matches(full({3, 2}, 2.5, kFloat16), filled({3, 2}, 2.5), kFloat16, {}, "full f16");
  expect_matches(full({1100, 3}, 7, kInt64), filled({1100, 3}, 7), kInt64, {}, "full i64");
  expect_matches(full({}, true, kBool), filled({}, 1), kBool, {}, "full bool");
  expect_matches(full({3}, -1.5, kFloat64), filled({3}, -1.5), kFloat64, {}, "full f64");
  // A value that float32 cannot hold keeps its float64 precision in a float64 tensor.
  expect_matches(full({2}, 0.1, kFloat64), filled({2}, 0.1), kFloat64, {}, "full f64 0.1");
  expect_matches(full({2}, 0.1), filled({2}, f32(0.1)), kFloat32, {}, "full f32 0.1");
  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<float>(), 3.5f);
  EXPECT_EQ(scalar_tensor(4, kInt64).item<int64_t>(), 4);
  EXPECT_EQ(zeros({0, 3}).numel(), 0);
  EXPECT_THROW(full({-1}, 1), ShapeError);
}

TEST(OpsFactories, TensorsWithNoElementsOfAnyShape) {
  // A zero-size dim anywhere: nothing to read, compute or print, fused or not, and a sum over
  // the empty dim is zero (PyTorch's rules). The evaluation fuzzer found [0, 0] read through
  // its strides as a layout to walk (a division by zero).
  for (const Shape& shape : std::vector<Shape>{{0}, {0, 0}, {3, 0, 2}, {0, 3}, {2, 0}}) {
    std::ostringstream where;
    for (int64_t size : shape) where << size << " ";
    for (bool fusion : {true, false}) {
      Tensor x = full(shape, 2.5), y = (x + 1).exp() * x;
      eval(std::vector<Tensor>{y}, EvalOptions{.fusion = fusion});
      EXPECT_EQ(y.numel(), 0) << where.str();
      EXPECT_TRUE(y.to_vector<float>().empty()) << where.str();
      EXPECT_TRUE(x.transpose(0, -1).to_vector<double>().empty()) << where.str();
      EXPECT_FALSE(y.str().empty()) << where.str();
    }
  }
  Tensor summed = zeros({3, 0, 2}).sum({1});
  EXPECT_EQ(summed.sizes(), (Shape{3, 2}));
  EXPECT_EQ(summed.to_vector<float>(), std::vector<float>(6, 0.0f));
}

TEST(OpsFactories, ArangeFollowsPyTorchDTypeRules) {
  auto host = [](std::vector<double> v) { return Host{{static_cast<int64_t>(v.size())}, v}; };
  expect_matches(arange(5), host({0, 1, 2, 3, 4}), kInt64, {}, "arange(5)");
  expect_matches(arange(0., 1., 0.25), host({0, 0.25, 0.5, 0.75}), kFloat32, {},
                 "arange(0., 1., 0.25)");
  expect_matches(arange(1, 10, 3), host({1, 4, 7}), kInt64, {}, "arange(1, 10, 3)");
  expect_matches(arange(10, 0, -3), host({10, 7, 4, 1}), kInt64, {}, "arange(10, 0, -3)");
  expect_matches(arange(2.5), host({0, 1, 2}), kFloat32, {}, "arange(2.5)");
  expect_matches(arange(0, 3, 0.5), host({0, 0.5, 1, 1.5, 2, 2.5}), kFloat32, {},
                 "arange(0, 3, 0.5)");
  expect_matches(arange(4, kFloat64), host({0, 1, 2, 3}), kFloat64, {}, "arange(4, f64)");
  expect_matches(arange(-2, 2, 1, kInt32), host({-2, -1, 0, 1}), kInt32, {}, "arange int32");
  // Past a task, exact in float32 up to 2^24.
  Host big{{40000}, std::vector<double>(40000)};
  std::iota(big.v.begin(), big.v.end(), 0.0);
  expect_matches(arange(40000), big, kInt64, {}, "arange(40000)");
  expect_matches(arange(0., 40000.), big, kFloat32, {}, "arange(0., 40000.)");
  EXPECT_THROW(arange(0, 5, 0), ShapeError);
  EXPECT_THROW(arange(5, 0, 1), ShapeError);
}

// Mean and standard deviation of a tensor's values, in double.
std::pair<double, double> moments(const std::vector<double>& v) {
  long double sum = 0, sq = 0;
  for (double x : v) sum += x;
  long double mean = sum / v.size();
  for (double x : v) sq += (x - mean) * (x - mean);
  return {static_cast<double>(mean), std::sqrt(static_cast<double>(sq / v.size()))};
}

TEST(OpsFactories, RandAndRandnAreSeededAndPlausible) {
  manual_seed(123);
  Tensor r = rand({100000});
  EXPECT_EQ(r.dtype(), kFloat32);
  std::vector<double> rv = r.to_vector<double>();
  EXPECT_TRUE(std::all_of(rv.begin(), rv.end(), [](double x) { return x >= 0 && x < 1; }));
  auto [r_mean, r_std] = moments(rv);
  EXPECT_NEAR(r_mean, 0.5, 0.01);
  EXPECT_NEAR(r_std, std::sqrt(1.0 / 12), 0.01);

  Tensor n = randn({100000});
  std::vector<double> nv = n.to_vector<double>();
  auto [n_mean, n_std] = moments(nv);
  EXPECT_NEAR(n_mean, 0, 0.02);
  EXPECT_NEAR(n_std, 1, 0.02);
  int64_t within_one =
      std::count_if(nv.begin(), nv.end(), [](double x) { return std::fabs(x) < 1; });
  EXPECT_NEAR(within_one / 100000.0, 0.6827, 0.01);

  // The same seed replays the same numbers; the next draw and another seed do not.
  manual_seed(123);
  EXPECT_EQ(rand({100000}).to_vector<double>(), rv);
  EXPECT_EQ(randn({100000}).to_vector<double>(), nv);
  EXPECT_NE(rand({100000}).to_vector<double>(), rv);
  manual_seed(124);
  EXPECT_NE(rand({100000}).to_vector<double>(), rv);

  // The same seed gives the same numbers with fusion on or off, alone or inside an expression.
  manual_seed(5);
  Tensor alone = rand({3, 5000});
  eval({alone}, EvalOptions{.fusion = false});
  manual_seed(5);
  Tensor in_expr = rand({3, 5000}) * 1 + 0;
  eval({in_expr});
  EXPECT_EQ(alone.to_vector<double>(), in_expr.to_vector<double>());

  // Other floating dtypes: plausible moments (the [0, 1) range is the next test's subject);
  // integer dtypes are refused as by PyTorch.
  for (DType dtype : {DType::Float64, DType::Float16, DType::BFloat16}) {
    manual_seed(9);
    std::vector<double> v = rand({100000}, dtype).to_vector<double>();
    EXPECT_NEAR(moments(v).first, 0.5, 0.01) << name_of(dtype);
    manual_seed(9);
    auto [mean, std] = moments(randn({100000}, dtype).to_vector<double>());
    EXPECT_NEAR(mean, 0, 0.02) << name_of(dtype);
    EXPECT_NEAR(std, 1, 0.02) << name_of(dtype);
  }
  EXPECT_THROW(rand({3}, kInt32), DTypeError);
  EXPECT_THROW(randn({3}, kBool), DTypeError);
}

TEST(OpsFactories, RandStaysBelowOneInEveryFloatingDType) {
  // PyTorch draws half-type uniforms with as many random bits as the type holds, so they never
  // round up to 1. 100k draws make a round-up near 1 (p = 2^-12 for float16, 2^-9 for bfloat16
  // per draw) all but certain to show.
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    manual_seed(9);
    std::vector<double> v = rand({100000}, dtype).to_vector<double>();
    int64_t outside = std::count_if(v.begin(), v.end(), [](double x) { return x < 0 || x >= 1; });
    EXPECT_EQ(outside, 0) << name_of(dtype) << ": values outside [0, 1)";
  }
}

}  // namespace
}  // namespace lazyfuse
