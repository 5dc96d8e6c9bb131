// Differential tests of lazyfuse's matmul: dot, matrix-vector, matrix-matrix and batched
// products with broadcast batch dims, transposed operands, sizes large enough for BLAS to
// block, operands that are pending expressions, and the operands PyTorch rejects.
//
// Expected values come from the naive long double loops of the independent float64 reference
// in tests/reference/, which never calls lazyfuse to compute them.
#include <gtest/gtest.h>

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

TEST(OpsMatmul, MatchesNaiveLoops) {
  struct MatmulCase {
    Shape a, b;
    bool transpose_a = false, transpose_b = false;  // the base is built transposed, then .t()
  };
  const std::vector<MatmulCase> cases = {
      {{5}, {5}},                    // dot
      {{3, 4}, {4}},                 // matrix-vector
      {{4}, {4, 3}},                 // vector-matrix
      {{3, 4}, {4, 5}},              // matrix-matrix
      {{2, 3, 4}, {4, 5}},           // batched by a
      {{3, 4}, {2, 4, 5}},           // batched by b
      {{2, 1, 3, 4}, {5, 4, 6}},     // batch dims broadcast both ways: [2, 5, 3, 6]
      {{2, 3, 4}, {4}},              // batched matrix-vector
      {{4}, {2, 4, 3}},              // vector-batched matrix
      {{4, 3}, {5, 4}, true, true},  // transposed operands: [3, 4] x [4, 5]
      {{7, 6}, {7, 9}, true, false},
      {{64, 300}, {70, 300}, false, true},  // large enough for BLAS to block
  };
  std::mt19937 rng(11);
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Float16}) {
    for (const MatmulCase& c : cases) {
      std::string what = "matmul " + name_of(dtype) + " " + shape_text(c.a) +
                         (c.transpose_a ? "^T" : "") + " x " + shape_text(c.b) +
                         (c.transpose_b ? "^T" : "");
      Host a = random_host(rng, c.a, dtype, {-1, 1, -20, 20});
      Host b = random_host(rng, c.b, dtype, {-1, 1, -20, 20});
      Tensor ta = to_tensor(a, dtype), tb = to_tensor(b, dtype);
      if (c.transpose_a) {
        ta = ta.t();
        a = host_transpose(a, 0, 1);
      }
      if (c.transpose_b) {
        tb = tb.t();
        b = host_transpose(b, 0, 1);
      }
      std::vector<double> magnitude;
      Host want = host_matmul(a, b, &magnitude);
      expect_matches(matmul(ta, tb), want, dtype, tol_for(dtype), what, magnitude);
      expect_matches(ta.matmul(tb), want, dtype, tol_for(dtype), what + " (method)", magnitude);
    }
  }
}

TEST(OpsMatmul, OperandsOfPendingExpressionsAndBadOperands) {
  std::mt19937 rng(12);
  Host a = random_host(rng, {6, 5}, kFloat64, kWide);
  Host b = random_host(rng, {5, 4}, kFloat64, kWide);
  Host a2 = ref_unary(a, [](double v) { return v * v - 1; });
  std::vector<double> magnitude;
  Host want = host_matmul(a2, b, &magnitude);
  Tensor ta = to_tensor(a, kFloat64);
  expect_matches(matmul(ta * ta - 1, to_tensor(b, kFloat64)), want, kFloat64, tol_for(kFloat64),
                 "pending operand", magnitude);
  // PyTorch requires one dtype for both operands and rejects bool.
  EXPECT_THROW(matmul(ones({2, 2}, kFloat32), ones({2, 2}, kFloat64)), DTypeError);
  EXPECT_THROW(matmul(ones({2, 2}, kBool), ones({2, 2}, kBool)), DTypeError);
  EXPECT_THROW(matmul(ones({2, 3}), ones({2, 3})), ShapeError);
  EXPECT_THROW(matmul(ones({2, 3, 4}), ones({3, 4, 5})), ShapeError);
}

}  // namespace
}  // namespace lazyfuse
