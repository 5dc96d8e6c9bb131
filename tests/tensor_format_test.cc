// Tests for format_tensor. Every expected string was printed by PyTorch 2.11 (str(t) on the same
// values), so these pin lazyfuse's printing to PyTorch's byte for byte.
#include "lazyfuse/frontend/tensor_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// float64 values, taken as they are.
FormatInput f64(Shape shape, std::vector<double> values) {
  FormatInput in;
  in.shape = std::move(shape);
  in.values = std::move(values);
  in.is_floating = true;
  return in;
}

// float32 values: each literal is rounded to float first, as torch.tensor([...]) does.
FormatInput f32(Shape shape, std::vector<double> values) {
  for (double& value : values) value = static_cast<float>(value);
  return f64(std::move(shape), std::move(values));
}

// float32 tensor whose element i is fn(i), computed in float like the matching torch expression.
FormatInput f32_from(Shape shape, const std::function<float(int64_t)>& fn) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  std::vector<double> values;
  for (int64_t i = 0; i < numel; ++i) values.push_back(fn(i));
  return f64(std::move(shape), std::move(values));
}

FormatInput i64(Shape shape, std::vector<int64_t> values) {
  FormatInput in;
  in.shape = std::move(shape);
  in.int_values = std::move(values);
  return in;
}

// torch.arange(numel).reshape(shape)
FormatInput arange_i64(Shape shape) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  std::vector<int64_t> values;
  for (int64_t i = 0; i < numel; ++i) values.push_back(i);
  return i64(std::move(shape), std::move(values));
}

FormatInput bools(Shape shape, std::vector<double> values) {
  FormatInput in;
  in.shape = std::move(shape);
  in.values = std::move(values);
  in.is_bool = true;
  return in;
}

FormatInput with_suffixes(FormatInput in, std::string device, std::string dtype) {
  in.device_suffix = std::move(device);
  in.dtype_suffix = std::move(dtype);
  return in;
}

TEST(TensorFormat, FloatVector) {
  EXPECT_EQ(format_tensor(f32({3}, {1., 2., 3.})), "tensor([1., 2., 3.])");
  EXPECT_EQ(format_tensor(f32({3}, {20.0855, 109.1963, 445.2395})),
            "tensor([ 20.0855, 109.1963, 445.2395])");
  EXPECT_EQ(format_tensor(f32({1}, {123.456})), "tensor([123.4560])");
}

TEST(TensorFormat, IntegerValuedFloatsPrintWithTrailingDot) {
  EXPECT_EQ(format_tensor(f32({3}, {-3., 10., 200.})), "tensor([ -3.,  10., 200.])");
  // 1e8 itself is not above the sci threshold.
  EXPECT_EQ(format_tensor(f32({1}, {100000000.})), "tensor([100000000.])");
}

TEST(TensorFormat, NegativeNumbersAlignRight) {
  EXPECT_EQ(format_tensor(f32({2}, {-1.5, 2.0})), "tensor([-1.5000,  2.0000])");
}

TEST(TensorFormat, Integers) {
  EXPECT_EQ(format_tensor(i64({3}, {1, 2, 3})), "tensor([1, 2, 3])");
  EXPECT_EQ(format_tensor(i64({3}, {-100, 5, 42})), "tensor([-100,    5,   42])");
}

TEST(TensorFormat, Bools) {
  EXPECT_EQ(format_tensor(bools({2}, {1, 0})), "tensor([ True, False])");
  EXPECT_EQ(format_tensor(bools({2, 2}, {1, 1, 0, 1})),
            "tensor([[ True,  True],\n"
            "        [False,  True]])");
}

TEST(TensorFormat, BoolsMayComeAsIntValues) {
  FormatInput in;
  in.shape = {2};
  in.int_values = {1, 0};
  in.is_bool = true;
  EXPECT_EQ(format_tensor(in), "tensor([ True, False])");
}

TEST(TensorFormat, Scalars) {
  EXPECT_EQ(format_tensor(f32({}, {3.5})), "tensor(3.5000)");
  EXPECT_EQ(format_tensor(f32({}, {3.})), "tensor(3.)");
  EXPECT_EQ(format_tensor(i64({}, {3})), "tensor(3)");
  EXPECT_EQ(format_tensor(f32({}, {1e-5})), "tensor(1.0000e-05)");
  EXPECT_EQ(format_tensor(bools({}, {1})), "tensor(True)");
  EXPECT_EQ(format_tensor(f32({}, {kNan})), "tensor(nan)");
}

TEST(TensorFormat, Empty) {
  EXPECT_EQ(format_tensor(f32({0}, {})), "tensor([])");
  EXPECT_EQ(format_tensor(f32({0, 3}, {})), "tensor([], size=(0, 3))");
  // PyTorch shows the dtype of any empty non-float tensor; the caller passes it.
  EXPECT_EQ(format_tensor(with_suffixes(i64({0}, {}), "", "dtype=torch.int64")),
            "tensor([], dtype=torch.int64)");
  // The size suffix goes between device and dtype.
  EXPECT_EQ(format_tensor(with_suffixes(f32({2, 0, 4}, {}), "device='cuda:0'", "")),
            "tensor([], device='cuda:0', size=(2, 0, 4))");
}

TEST(TensorFormat, MatrixRowsAlignUnderFirstBracket) {
  EXPECT_EQ(format_tensor(f32({2, 3}, {0.4963, 0.7682, 0.0885, 0.1320, 0.3074, 0.6341})),
            "tensor([[0.4963, 0.7682, 0.0885],\n"
            "        [0.1320, 0.3074, 0.6341]])");
}

TEST(TensorFormat, ThreeDimsHaveBlankLineBetweenMatrices) {
  EXPECT_EQ(format_tensor(f32_from({2, 2, 3}, [](int64_t i) { return i * 0.5f; })),
            "tensor([[[0.0000, 0.5000, 1.0000],\n"
            "         [1.5000, 2.0000, 2.5000]],\n"
            "\n"
            "        [[3.0000, 3.5000, 4.0000],\n"
            "         [4.5000, 5.0000, 5.5000]]])");
  EXPECT_EQ(format_tensor(arange_i64({2, 3, 4})),
            "tensor([[[ 0,  1,  2,  3],\n"
            "         [ 4,  5,  6,  7],\n"
            "         [ 8,  9, 10, 11]],\n"
            "\n"
            "        [[12, 13, 14, 15],\n"
            "         [16, 17, 18, 19],\n"
            "         [20, 21, 22, 23]]])");
}

TEST(TensorFormat, FourDimsHaveTwoBlankLines) {
  EXPECT_EQ(format_tensor(arange_i64({2, 2, 2, 2})),
            "tensor([[[[ 0,  1],\n"
            "          [ 2,  3]],\n"
            "\n"
            "         [[ 4,  5],\n"
            "          [ 6,  7]]],\n"
            "\n"
            "\n"
            "        [[[ 8,  9],\n"
            "          [10, 11]],\n"
            "\n"
            "         [[12, 13],\n"
            "          [14, 15]]]])");
}

TEST(TensorFormat, SciModeForTinyValues) {
  EXPECT_EQ(format_tensor(f32({2}, {1e-5, 1.0})), "tensor([1.0000e-05, 1.0000e+00])");
  // Zeros do not count towards the choice but are printed in the chosen notation.
  EXPECT_EQ(format_tensor(f32({2}, {0., 1e-5})), "tensor([0.0000e+00, 1.0000e-05])");
}

TEST(TensorFormat, SciModeForWideRange) {
  EXPECT_EQ(format_tensor(f32({2}, {1e7, 1.})), "tensor([1.0000e+07, 1.0000e+00])");
  EXPECT_EQ(format_tensor(f32({1}, {123456789.})), "tensor([1.2346e+08])");
  EXPECT_EQ(format_tensor(f32({2}, {1.5e10, 2.5})), "tensor([1.5000e+10, 2.5000e+00])");
  EXPECT_EQ(format_tensor(f32({3}, {0.12345, 2.5, 0.00015})),
            "tensor([1.2345e-01, 2.5000e+00, 1.5000e-04])");
}

TEST(TensorFormat, NonFiniteValues) {
  // Non-finite values take no part in the int-mode check or the width.
  EXPECT_EQ(format_tensor(f32({3}, {kNan, kInf, 1.})), "tensor([nan, inf, 1.])");
  EXPECT_EQ(format_tensor(f32({3}, {kNan, -kInf, 1.5})), "tensor([   nan,   -inf, 1.5000])");
  EXPECT_EQ(format_tensor(f32({2}, {kNan, kNan})), "tensor([nan, nan])");
  // A negative NaN still prints as "nan", as in Python.
  EXPECT_EQ(format_tensor(f32({2}, {-kNan, kNan})), "tensor([nan, nan])");
  EXPECT_EQ(format_tensor(f32({4}, {kNan, 1e-5, -1.0, kInf})),
            "tensor([        nan,  1.0000e-05, -1.0000e+00,         inf])");
}

TEST(TensorFormat, NegativeZero) {
  EXPECT_EQ(format_tensor(f32({2}, {0., -0.})), "tensor([0., -0.])");
  EXPECT_EQ(format_tensor(f32({2}, {-0., 1.5})), "tensor([-0.0000, 1.5000])");
}

TEST(TensorFormat, SummarisesLongVectors) {
  EXPECT_EQ(format_tensor(arange_i64({2000})),
            "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  // Only 0, 1, 2, 1997, 1998, 1999 are seen by the formatter: integral, but a range over 1000.
  EXPECT_EQ(format_tensor(f32_from({2000}, [](int64_t i) { return static_cast<float>(i); })),
            "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
            "        1.9990e+03])");
  // The 1e-6 and the 0.5 are shown; the formatter sees only shown values, so sci mode.
  EXPECT_EQ(format_tensor(f32_from({1002},
                                   [](int64_t i) {
                                     if (i == 0) return 1e-6f;
                                     return i == 1001 ? 0.5f : 1.0f;
                                   })),
            "tensor([1.0000e-06, 1.0000e+00, 1.0000e+00,  ..., 1.0000e+00, 1.0000e+00,\n"
            "        5.0000e-01])");
}

TEST(TensorFormat, SummarisesMatrices) {
  EXPECT_EQ(format_tensor(arange_i64({100, 100})),
            "tensor([[   0,    1,    2,  ...,   97,   98,   99],\n"
            "        [ 100,  101,  102,  ...,  197,  198,  199],\n"
            "        [ 200,  201,  202,  ...,  297,  298,  299],\n"
            "        ...,\n"
            "        [9700, 9701, 9702,  ..., 9797, 9798, 9799],\n"
            "        [9800, 9801, 9802,  ..., 9897, 9898, 9899],\n"
            "        [9900, 9901, 9902,  ..., 9997, 9998, 9999]])");
  EXPECT_EQ(
      format_tensor(f32_from({40, 50}, [](int64_t i) { return static_cast<float>(i) / 7.0f; })),
      "tensor([[0.0000e+00, 1.4286e-01, 2.8571e-01,  ..., 6.7143e+00, 6.8571e+00,\n"
      "         7.0000e+00],\n"
      "        [7.1429e+00, 7.2857e+00, 7.4286e+00,  ..., 1.3857e+01, 1.4000e+01,\n"
      "         1.4143e+01],\n"
      "        [1.4286e+01, 1.4429e+01, 1.4571e+01,  ..., 2.1000e+01, 2.1143e+01,\n"
      "         2.1286e+01],\n"
      "        ...,\n"
      "        [2.6429e+02, 2.6443e+02, 2.6457e+02,  ..., 2.7100e+02, 2.7114e+02,\n"
      "         2.7129e+02],\n"
      "        [2.7143e+02, 2.7157e+02, 2.7171e+02,  ..., 2.7814e+02, 2.7829e+02,\n"
      "         2.7843e+02],\n"
      "        [2.7857e+02, 2.7871e+02, 2.7886e+02,  ..., 2.8529e+02, 2.8543e+02,\n"
      "         2.8557e+02]])");
  // Rows of 4 are not cut; only the long dim is.
  EXPECT_EQ(format_tensor(f32_from({251, 4}, [](int64_t i) { return i * 0.5f; })),
            "tensor([[0.0000e+00, 5.0000e-01, 1.0000e+00, 1.5000e+00],\n"
            "        [2.0000e+00, 2.5000e+00, 3.0000e+00, 3.5000e+00],\n"
            "        [4.0000e+00, 4.5000e+00, 5.0000e+00, 5.5000e+00],\n"
            "        ...,\n"
            "        [4.9600e+02, 4.9650e+02, 4.9700e+02, 4.9750e+02],\n"
            "        [4.9800e+02, 4.9850e+02, 4.9900e+02, 4.9950e+02],\n"
            "        [5.0000e+02, 5.0050e+02, 5.0100e+02, 5.0150e+02]])");
}

TEST(TensorFormat, SummarisesThreeDims) {
  EXPECT_EQ(format_tensor(arange_i64({8, 8, 20})),
            "tensor([[[   0,    1,    2,  ...,   17,   18,   19],\n"
            "         [  20,   21,   22,  ...,   37,   38,   39],\n"
            "         [  40,   41,   42,  ...,   57,   58,   59],\n"
            "         ...,\n"
            "         [ 100,  101,  102,  ...,  117,  118,  119],\n"
            "         [ 120,  121,  122,  ...,  137,  138,  139],\n"
            "         [ 140,  141,  142,  ...,  157,  158,  159]],\n"
            "\n"
            "        [[ 160,  161,  162,  ...,  177,  178,  179],\n"
            "         [ 180,  181,  182,  ...,  197,  198,  199],\n"
            "         [ 200,  201,  202,  ...,  217,  218,  219],\n"
            "         ...,\n"
            "         [ 260,  261,  262,  ...,  277,  278,  279],\n"
            "         [ 280,  281,  282,  ...,  297,  298,  299],\n"
            "         [ 300,  301,  302,  ...,  317,  318,  319]],\n"
            "\n"
            "        [[ 320,  321,  322,  ...,  337,  338,  339],\n"
            "         [ 340,  341,  342,  ...,  357,  358,  359],\n"
            "         [ 360,  361,  362,  ...,  377,  378,  379],\n"
            "         ...,\n"
            "         [ 420,  421,  422,  ...,  437,  438,  439],\n"
            "         [ 440,  441,  442,  ...,  457,  458,  459],\n"
            "         [ 460,  461,  462,  ...,  477,  478,  479]],\n"
            "\n"
            "        ...,\n"
            "\n"
            "        [[ 800,  801,  802,  ...,  817,  818,  819],\n"
            "         [ 820,  821,  822,  ...,  837,  838,  839],\n"
            "         [ 840,  841,  842,  ...,  857,  858,  859],\n"
            "         ...,\n"
            "         [ 900,  901,  902,  ...,  917,  918,  919],\n"
            "         [ 920,  921,  922,  ...,  937,  938,  939],\n"
            "         [ 940,  941,  942,  ...,  957,  958,  959]],\n"
            "\n"
            "        [[ 960,  961,  962,  ...,  977,  978,  979],\n"
            "         [ 980,  981,  982,  ...,  997,  998,  999],\n"
            "         [1000, 1001, 1002,  ..., 1017, 1018, 1019],\n"
            "         ...,\n"
            "         [1060, 1061, 1062,  ..., 1077, 1078, 1079],\n"
            "         [1080, 1081, 1082,  ..., 1097, 1098, 1099],\n"
            "         [1100, 1101, 1102,  ..., 1117, 1118, 1119]],\n"
            "\n"
            "        [[1120, 1121, 1122,  ..., 1137, 1138, 1139],\n"
            "         [1140, 1141, 1142,  ..., 1157, 1158, 1159],\n"
            "         [1160, 1161, 1162,  ..., 1177, 1178, 1179],\n"
            "         ...,\n"
            "         [1220, 1221, 1222,  ..., 1237, 1238, 1239],\n"
            "         [1240, 1241, 1242,  ..., 1257, 1258, 1259],\n"
            "         [1260, 1261, 1262,  ..., 1277, 1278, 1279]]])");
}

TEST(TensorFormat, WrapsLongRows) {
  EXPECT_EQ(format_tensor(f32_from({30}, [](int64_t i) { return i * 1.5f; })),
            "tensor([ 0.0000,  1.5000,  3.0000,  4.5000,  6.0000,  7.5000,  9.0000, 10.5000,\n"
            "        12.0000, 13.5000, 15.0000, 16.5000, 18.0000, 19.5000, 21.0000, 22.5000,\n"
            "        24.0000, 25.5000, 27.0000, 28.5000, 30.0000, 31.5000, 33.0000, 34.5000,\n"
            "        36.0000, 37.5000, 39.0000, 40.5000, 42.0000, 43.5000])");
  EXPECT_EQ(format_tensor(arange_i64({30})),
            "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
            "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
  EXPECT_EQ(
      format_tensor(f32_from({2, 20}, [](int64_t i) { return static_cast<float>(i) / 3.0f; })),
      "tensor([[ 0.0000,  0.3333,  0.6667,  1.0000,  1.3333,  1.6667,  2.0000,  2.3333,\n"
      "          2.6667,  3.0000,  3.3333,  3.6667,  4.0000,  4.3333,  4.6667,  5.0000,\n"
      "          5.3333,  5.6667,  6.0000,  6.3333],\n"
      "        [ 6.6667,  7.0000,  7.3333,  7.6667,  8.0000,  8.3333,  8.6667,  9.0000,\n"
      "          9.3333,  9.6667, 10.0000, 10.3333, 10.6667, 11.0000, 11.3333, 11.6667,\n"
      "         12.0000, 12.3333, 12.6667, 13.0000]])");
}

TEST(TensorFormat, Suffixes) {
  EXPECT_EQ(format_tensor(with_suffixes(f64({2}, {1., 2.}), "", "dtype=torch.float64")),
            "tensor([1., 2.], dtype=torch.float64)");
  EXPECT_EQ(format_tensor(with_suffixes(i64({2}, {1, 2}), "device='cuda:0'", "dtype=torch.int32")),
            "tensor([1, 2], device='cuda:0', dtype=torch.int32)");
  EXPECT_EQ(
      format_tensor(with_suffixes(f32({3}, {20.0855, 109.1963, 445.2395}), "device='cuda:0'", "")),
      "tensor([ 20.0855, 109.1963, 445.2395], device='cuda:0')");
}

TEST(TensorFormat, SuffixThatOverflowsTheLineGoesOnItsOwnLine) {
  std::vector<double> values;
  for (int i = 0; i < 8; ++i) values.push_back(i * 1.1);
  EXPECT_EQ(format_tensor(with_suffixes(f64({8}, values), "", "dtype=torch.float64")),
            "tensor([0.0000, 1.1000, 2.2000, 3.3000, 4.4000, 5.5000, 6.6000, 7.7000],\n"
            "       dtype=torch.float64)");
  values.clear();
  for (int i = 0; i < 20; ++i) values.push_back(i * 1.1);
  // On a multi-line tensor only the last line's length counts.
  EXPECT_EQ(format_tensor(with_suffixes(f64({2, 10}, values), "", "dtype=torch.float64")),
            "tensor([[ 0.0000,  1.1000,  2.2000,  3.3000,  4.4000,  5.5000,  6.6000,  7.7000,\n"
            "          8.8000,  9.9000],\n"
            "        [11.0000, 12.1000, 13.2000, 14.3000, 15.4000, 16.5000, 17.6000, 18.7000,\n"
            "         19.8000, 20.9000]], dtype=torch.float64)");
}

TEST(TensorFormat, HalfPrecisionValuesWidenedByTheCaller) {
  // torch.tensor([0.1, 0.2, 3.0], dtype=...).double().tolist()
  EXPECT_EQ(format_tensor(with_suffixes(f64({3}, {0.0999755859375, 0.199951171875, 3.0}), "",
                                        "dtype=torch.float16")),
            "tensor([0.1000, 0.2000, 3.0000], dtype=torch.float16)");
  EXPECT_EQ(format_tensor(with_suffixes(f64({3}, {0.10009765625, 0.2001953125, 3.0}), "",
                                        "dtype=torch.bfloat16")),
            "tensor([0.1001, 0.2002, 3.0000], dtype=torch.bfloat16)");
}

TEST(TensorFormat, RejectsValueCountThatDoesNotMatchShape) {
  EXPECT_THROW(format_tensor(f32({2, 2}, {1., 2., 3.})), ShapeError);
  EXPECT_THROW(format_tensor(i64({3}, {})), ShapeError);
  FormatInput ints_in_wrong_vector;
  ints_in_wrong_vector.shape = {2};
  ints_in_wrong_vector.values = {1., 2.};
  EXPECT_THROW(format_tensor(ints_in_wrong_vector), ShapeError);
  EXPECT_THROW(format_tensor(f32({-1}, {})), ShapeError);
}

}  // namespace
}  // namespace lazyfuse
