// nn: Linear and Sequential as LibTorch has them: parameter shapes and PyTorch's initial
// bounds, the printed repr, a forward pass checked against an independent double-precision
// computation, moving a module, indexing a Sequential, and bad input shapes.
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

using ::testing::HasSubstr;

// x W^T + b in double, from the parameters' values: the reference the forward pass must match.
std::vector<double> linear_reference(const std::vector<double>& x, int64_t rows,
                                     nn::Linear& layer) {
  const int64_t in = layer.in_features(), out = layer.out_features();
  std::vector<double> w = layer.weight().to_vector<double>();
  std::vector<double> b =
      layer.bias().defined() ? layer.bias().to_vector<double>() : std::vector<double>(out, 0.0);
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  // float32 parameters and products: a few ulps of the magnitudes involved.
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i]))) << "element " << i;
}

TEST(Nn, LinearParameterShapesAndInitialBounds) {
  manual_seed(0);
  nn::Linear layer(3, 1);
  std::vector<Tensor> parameters = layer.parameters();
  ASSERT_EQ(parameters.size(), 2u);
  // Registration order: weight, then bias, as PyTorch's named_parameters.
  EXPECT_TRUE(parameters[0].is_same(layer.weight()));
  EXPECT_TRUE(parameters[1].is_same(layer.bias()));
  EXPECT_EQ(layer.weight().sizes(), Shape({1, 3}));
  EXPECT_EQ(layer.bias().sizes(), Shape({1}));
  EXPECT_EQ(layer.weight().dtype(), kFloat32);
  // Parameters hold values, not pending graphs.
  EXPECT_TRUE(layer.weight().is_computed());
  EXPECT_TRUE(layer.bias().is_computed());
  const double bound = 1 / std::sqrt(3.0);
  for (const Tensor& p : parameters) {
    for (double v : p.to_vector<double>()) {
      EXPECT_GE(v, -bound);
      EXPECT_LE(v, bound);
    }
  }
}

TEST(Nn, LinearInitialValuesSpreadOverTheBound) {
  // Many draws: uniform in +-1/sqrt(in) should come near both ends and not all be equal.
  manual_seed(1);
  nn::Linear layer(16, 64);
  const double bound = 1 / std::sqrt(16.0);
  std::vector<double> w = layer.weight().to_vector<double>();
  ASSERT_EQ(w.size(), 64u * 16u);
  double lo = w[0], hi = w[0];
  for (double v : w) {
    EXPECT_GE(v, -bound);
    EXPECT_LE(v, bound);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LT(lo, -0.9 * bound);
  EXPECT_GT(hi, 0.9 * bound);
  // The seed decides the values.
  manual_seed(1);
  nn::Linear again(16, 64);
  EXPECT_EQ(again.weight().to_vector<float>(), layer.weight().to_vector<float>());
}

TEST(Nn, PrintsLikePyTorch) {
  nn::Sequential net(nn::Linear(3, 1));
  std::ostringstream os;
  os << net;
  EXPECT_EQ(os.str(),
            "Sequential(\n"
            "  (0): Linear(in_features=3, out_features=1, bias=True)\n"
            ")");
  EXPECT_EQ(nn::Linear(4, 2, false).repr(), "Linear(in_features=4, out_features=2, bias=False)");
  EXPECT_EQ(nn::Sequential().repr(), "Sequential()");
  // Nested modules indent under their index, as PyTorch's _addindent.
  nn::Sequential outer(nn::Linear(2, 3), nn::Sequential(nn::Linear(3, 1)));
  EXPECT_EQ(outer.repr(),
            "Sequential(\n"
            "  (0): Linear(in_features=2, out_features=3, bias=True)\n"
            "  (1): Sequential(\n"
            "    (0): Linear(in_features=3, out_features=1, bias=True)\n"
            "  )\n"
            ")");
}

TEST(Nn, LinearWithoutBias) {
  nn::Linear layer(4, 2, false);
  EXPECT_FALSE(layer.bias().defined());
  ASSERT_EQ(layer.parameters().size(), 1u);
  EXPECT_TRUE(layer.parameters()[0].is_same(layer.weight()));
  EXPECT_EQ(layer.weight().sizes(), Shape({2, 4}));
  const std::vector<double> x = {1, -2, 0.5, 3};
  Tensor out = layer(from_vector(x, {1, 4}));
  EXPECT_EQ(out.sizes(), Shape({1, 2}));
  expect_near_all(out.to_vector<double>(), linear_reference(x, 1, layer));
}

TEST(Nn, ForwardMatchesAnIndependentComputation) {
  manual_seed(7);
  nn::Linear layer(3, 1);
  const std::vector<double> x = {1, 2, 3};
  Tensor out = layer.forward(tensor({{1., 2., 3.}}));
  EXPECT_EQ(out.sizes(), Shape({1, 1}));
  expect_near_all(out.to_vector<double>(), linear_reference(x, 1, layer));
  // A 1-D input is one sample: matmul drops the batch dim, as in PyTorch.
  Tensor single = layer(tensor({1., 2., 3.}));
  EXPECT_EQ(single.sizes(), Shape({1}));
  expect_near_all(single.to_vector<double>(), linear_reference(x, 1, layer));
}

TEST(Nn, ForwardOnABatch) {
  manual_seed(3);
  nn::Sequential net(nn::Linear(3, 4), nn::Linear(4, 2));
  std::vector<double> x;
  for (int i = 0; i < 15; ++i) x.push_back(0.25 * i - 1.5);
  Tensor batch = from_vector(x, {5, 3});
  Tensor out = net(batch);
  EXPECT_EQ(out.sizes(), Shape({5, 2}));
  EXPECT_FALSE(out.is_computed());
  // Layer by layer, in double.
  std::vector<double> hidden = linear_reference(x, 5, *net.at<nn::Linear>(0));
  std::vector<double> want = linear_reference(hidden, 5, *net.at<nn::Linear>(1));
  expect_near_all(out.to_vector<double>(), want);
}

TEST(Nn, ModuleToCpuKeepsParameters) {
  manual_seed(0);
  nn::Sequential net(nn::Linear(3, 1));
  std::vector<Tensor> before = net.parameters();
  ASSERT_EQ(before.size(), 2u);  // the Linear's weight and bias, reached through the Sequential
  std::vector<std::vector<float>> values;
  for (const Tensor& p : before) values.push_back(p.to_vector<float>());
  net.to(Device("cpu"));
  std::vector<Tensor> after = net.parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    // Already there: the very same tensors, still computed, same values.
    EXPECT_TRUE(after[i].is_same(before[i])) << "parameter " << i;
    EXPECT_TRUE(after[i].is_computed());
    EXPECT_EQ(after[i].device(), Device::cpu());
    EXPECT_EQ(after[i].to_vector<float>(), values[i]);
  }
}

TEST(Nn, CopiedModuleOwnsItsParameters) {
  // Sequential copies or moves the modules it is given: each copy's parameters must be its own
  // members, never the original's (which may be gone).
  nn::Linear original(3, 2);
  nn::Linear copy = original;
  copy.weight() = zeros({2, 3});
  ASSERT_EQ(copy.parameters().size(), 2u);
  EXPECT_TRUE(copy.parameters()[0].is_same(copy.weight()));
  EXPECT_TRUE(original.parameters()[0].is_same(original.weight()));
  EXPECT_FALSE(original.parameters()[0].is_same(copy.weight()));

  nn::Sequential net(nn::Linear(3, 2), nn::Linear(2, 1));
  std::vector<Tensor> parameters = net.parameters();
  ASSERT_EQ(parameters.size(), 4u);
  EXPECT_TRUE(parameters[0].is_same(net.at<nn::Linear>(0)->weight()));
  EXPECT_TRUE(parameters[3].is_same(net.at<nn::Linear>(1)->bias()));
  EXPECT_EQ(parameters[2].sizes(), Shape({1, 2}));
}

TEST(Nn, ModuleToAMissingGpuThrows) {
  nn::Linear layer(3, 1);
  Tensor weight = layer.weight();
  // One past the last GPU: missing on every machine.
  EXPECT_THROW(layer.to(Device(DeviceType::CUDA, cuda::device_count())), DeviceIndexError);
  // The failed move leaves the parameters on the CPU.
  EXPECT_TRUE(layer.weight().is_same(weight));
  EXPECT_EQ(layer.bias().device(), Device::cpu());
}

TEST(Nn, SequentialIndexing) {
  nn::Sequential net(nn::Linear(3, 2), nn::Linear(2, 1, false));
  ASSERT_EQ(net.size(), 2u);
  std::shared_ptr<nn::Module> first = net[0];
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->repr(), "Linear(in_features=3, out_features=2, bias=True)");
  std::shared_ptr<nn::Linear> linear = net.at<nn::Linear>(0);
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear.get(), first.get());  // the module itself, not a copy
  EXPECT_EQ(linear->in_features(), 3);
  EXPECT_EQ(linear->out_features(), 2);
  EXPECT_EQ(net.at<nn::Linear>(1)->out_features(), 1);
  // Parameters reached through the index are the network's own.
  std::vector<Tensor> parameters = net.parameters();
  ASSERT_EQ(parameters.size(), 3u);
  EXPECT_TRUE(parameters[0].is_same(linear->weight()));
  EXPECT_TRUE(parameters[1].is_same(linear->bias()));
  EXPECT_TRUE(parameters[2].is_same(net.at<nn::Linear>(1)->weight()));
  // A wrong type gives null, a wrong index an error.
  EXPECT_EQ(net.at<nn::Sequential>(0), nullptr);
  EXPECT_THROW(net[2], Error);
}

TEST(Nn, InputWithWrongLastDimThrowsShapeError) {
  nn::Linear layer(3, 1);
  try {
    layer(zeros({5, 4}));
    ADD_FAILURE() << "no error for an input of width 4";
  } catch (const ShapeError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("Linear(in_features=3)"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("[5, 4]"));
  }
  EXPECT_THROW(layer(scalar_tensor(1.0)), ShapeError);
  nn::Sequential net(nn::Linear(3, 4), nn::Linear(5, 1));
  // The mismatch between layers is caught as well.
  EXPECT_THROW(net(zeros({2, 3})), ShapeError);
}

}  // namespace
}  // namespace lazyfuse
