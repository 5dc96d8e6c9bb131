// The API's edges as a LibTorch user meets them: printing dtypes, shapes and options; type
// promotion with 0-d tensors; nested initializer lists; dims given as one or many.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <cmath>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

// Printed from outside namespace lazyfuse, as a user's code prints them: each operator is found
// by argument-dependent lookup.
namespace {
std::string printed_outside(const lazyfuse::Tensor& t, const lazyfuse::TensorOptions& options) {
  std::ostringstream out;
  out << t.dtype() << " " << t.sizes() << " " << t.strides() << " " << options;
  return out.str();
}
}  // namespace

TEST(Printing, DtypeShapeAndOptionsPrintAsPyTorchDoes) {
  namespace lf = lazyfuse;
  EXPECT_EQ(printed_outside(lf::zeros({2, 3}, lf::kFloat64), lf::TensorOptions(lf::kInt32)),
            "torch.float64 torch.Size([2, 3]) torch.Size([3, 1]) TensorOptions(dtype=torch.int32, "
            "device=cpu (default), requires_grad=false (default))");
  EXPECT_EQ(printed_outside(lf::scalar_tensor(1.5),
                            lf::TensorOptions().device(lf::Device("cuda:1")).requires_grad(true)),
            "torch.float32 torch.Size([]) torch.Size([]) TensorOptions(dtype=torch.float32 "
            "(default), device=cuda:1, requires_grad=true)");
  std::ostringstream bfloat;
  bfloat << lf::kBFloat16 << " " << lf::kBool << " " << lf::kInt64;
  EXPECT_EQ(bfloat.str(), "torch.bfloat16 torch.bool torch.int64");
}

namespace lazyfuse {
namespace {

DType dtype_named(const std::string& name) {
  for (DType d : {kBool, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64})
    if (std::string(dtype_torch_name(d)) == "torch." + name) return d;
  ADD_FAILURE() << "unknown dtype " << name;
  return kFloat32;
}

Tensor operand(DType dtype, int rank) { return rank == 0 ? zeros({}, dtype) : zeros({2}, dtype); }

// Every line of PyTorch's table (tests/fixtures/promotion/result_type.txt, written by
// scripts/make-promotion-table.py from torch.result_type): the result of +, of where and of a
// comparison's operands, through lazyfuse's ops, in either order.
TEST(Promotion, MatchesTorchResultType) {
  std::ifstream table(std::string(LAZYFUSE_SOURCE_DIR) +
                      "/tests/fixtures/promotion/result_type.txt");
  ASSERT_TRUE(table) << "the table is missing";
  std::string line;
  int checked = 0;
  while (std::getline(table, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string a, b, want;
    int rank_a = 0, rank_b = 0;
    fields >> a >> rank_a >> b;
    const Tensor x = operand(dtype_named(a), rank_a);
    if (b.rfind("scalar:", 0) == 0) {
      fields >> want;
      const std::string kind = b.substr(7);
      const Scalar scalar = kind == "bool" ? Scalar(true) : kind == "int" ? Scalar(2) : Scalar(2.5);
      // Bool has no +: the promotion is the same through where.
      const Tensor sum =
          x.dtype() == kBool || kind == "bool" ? where(x == x, x, scalar) : x + scalar;
      EXPECT_EQ(sum.dtype(), dtype_named(want)) << line;
      if (x.dtype() != kBool && kind != "bool")
        EXPECT_EQ((scalar * x).dtype(), dtype_named(want)) << line << " (scalar first)";
      ++checked;
      continue;
    }
    fields >> rank_b >> want;
    const Tensor y = operand(dtype_named(b), rank_b);
    const DType expected = dtype_named(want);
    const bool arithmetic = x.dtype() != kBool || y.dtype() != kBool;
    if (arithmetic && x.dtype() != kBool && y.dtype() != kBool) {
      EXPECT_EQ((x + y).dtype(), expected) << line;
      EXPECT_EQ((y * x).dtype(), expected) << line << " (swapped)";
    }
    EXPECT_EQ(where(operand(kBool, 1), x, y).dtype(), expected) << line << " (where)";
    ++checked;
  }
  EXPECT_EQ(checked, 7 * 2 * (7 * 2 + 3));
}

// The comparison runs in the promoted dtype, where a 0-d float64 is first rounded to float32:
// 1 + 2^-30 as float64 is 1 in float32, so a float32 1 equals it, as in PyTorch.
TEST(Promotion, ComparisonsRoundAZeroDimOperandToTheResultType) {
  const Tensor one = ones({2});
  const Tensor near_one = scalar_tensor(1.0 + std::ldexp(1.0, -30), kFloat64);
  EXPECT_EQ((one == near_one).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ((one * near_one).dtype(), kFloat32);
  // With dims, the float64 operand wins: the comparison is in float64.
  EXPECT_EQ((one == near_one.reshape({1})).to_vector<bool>(), (std::vector<bool>{false, false}));
}

TEST(Promotion, GradientsOfAZeroDimOperandKeepItsDtype) {
  const Tensor x = ones({3}).requires_grad_();
  const Tensor scale = scalar_tensor(2.0, TensorOptions(kFloat64).requires_grad(true));
  const Tensor y = x * scale;
  EXPECT_EQ(y.dtype(), kFloat32);
  y.sum().backward();
  EXPECT_EQ(scale.grad().dtype(), kFloat64);
  EXPECT_EQ(scale.grad().item<double>(), 3.0);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(Api, TensorTakesEveryNestingOfBracedLists) {
  const Tensor column = tensor({{2.0}, {-3.4}});
  EXPECT_EQ(column.sizes(), (Shape{2, 1}));
  EXPECT_EQ(column.to_vector<float>(), (std::vector<float>{2.0f, -3.4f}));
  EXPECT_EQ(tensor(3.5).sizes(), Shape{});
  EXPECT_EQ(tensor(3.5).item<float>(), 3.5f);
  EXPECT_EQ(tensor({1.5}).sizes(), (Shape{1}));
  EXPECT_EQ(tensor({1, 2, 3}, kInt64).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
  const Tensor four = tensor({{{{1, 2}}, {{3, 4}}}});
  EXPECT_EQ(four.sizes(), (Shape{1, 2, 1, 2}));
  EXPECT_EQ(four.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(tensor({}).sizes(), (Shape{0}));
  EXPECT_EQ(tensor({{}, {}}).sizes(), (Shape{2, 0}));
  try {
    tensor({{1, 2}, {3}});
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(
        std::string(e.what()).find("expected a list of length 2 at dim 1, got a list of length 1"),
        std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("api_test.cc"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tensor({{1, 2}, 3}), ShapeError);
}

TEST(Api, ReductionsTakeOneDimOrSeveral) {
  const Tensor x = arange(24, kFloat64).reshape({2, 3, 4});
  EXPECT_EQ(x.sum(1).sizes(), (Shape{2, 4}));
  EXPECT_EQ(x.sum({0, 2}).to_vector<double>(), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(x.mean(-1, true).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(x.max({1, 2}).to_vector<double>(), (std::vector<double>{11, 23}));
  EXPECT_EQ(x.min(2).sizes(), (Shape{2, 3}));
  EXPECT_EQ(x.amax(0).sizes(), (Shape{3, 4}));
  EXPECT_EQ(x.amin({0, 1}).to_vector<double>(), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(amax(x, 2, true).sizes(), (Shape{2, 3, 1}));
  const std::vector<int64_t> dims = {0, 1};
  EXPECT_EQ(x.sum(dims).sizes(), (Shape{4}));
  EXPECT_EQ(x.amax().item<double>(), 23);
}

TEST(Api, ItemOfAnyDtypeAsAScalar) {
  EXPECT_TRUE(tensor({2.5}, kFloat16).item().is_floating_point());
  EXPECT_EQ(tensor({2.5}, kBFloat16).item().to<double>(), 2.5);
  const Scalar big = full({1, 1}, int64_t{1} << 53 | 1, kInt64).item();
  EXPECT_TRUE(big.is_integral());
  EXPECT_EQ(big.to<int64_t>(), (int64_t{1} << 53) + 1) << "integers exactly, not through double";
  EXPECT_TRUE(ones({}, kBool).item().is_boolean());
  EXPECT_EQ(full({}, 7, kInt32).item().to<int>(), 7);
  try {
    ones({2}).item();
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("a Tensor with 2 elements cannot be converted to Scalar"),
              std::string::npos)
        << e.what();
  }
}

TEST(Api, ScalarsOnEitherSideOfComparisonsAndPow) {
  const Tensor x = tensor({1, 2, 3});
  EXPECT_EQ((2 == x).to_vector<bool>(), (std::vector<bool>{false, true, false}));
  EXPECT_EQ((2 != x).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ((2 < x).to_vector<bool>(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ((2 <= x).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ((2 > x).to_vector<bool>(), (std::vector<bool>{true, false, false}));
  EXPECT_EQ((2.5 >= x).to_vector<bool>(), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(pow(2, x).to_vector<float>(), (std::vector<float>{2, 4, 8}));
  EXPECT_EQ(pow(2, tensor({1, 2}, kInt32)).dtype(), kInt32);
  EXPECT_EQ(where(x > 1, 0.5, x).to_vector<float>(), (std::vector<float>{1, 0.5, 0.5}));
}

}  // namespace
}  // namespace lazyfuse
