// Differential tests of lazyfuse's matmul: dot, matrix-vector, matrix-matrix and batched
// products with broadcast batch dims, transposed operands, sizes large enough for BLAS to
// block, operands that are pending expressions, and the operands PyTorch rejects.
//
// Expected values come from the naive long double loops of the independent float64 reference
// in tests/reference/, which never calls lazyfuse to compute them.
#include <gtest/gtest.h>

#include <functional>
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

// Float operands that are views: gemm reads a row-major matrix with a leading dimension past
// its columns, a column-major one (a transpose) as transposed, batches through their strides
// (0 where broadcast), and copies only a matrix that is neither. Each against the float64 loops
// over the same views taken on the host.
TEST(OpsMatmul, ReadsEveryOperandLayout) {
  struct View {
    std::string name;
    std::function<Tensor(const Tensor&)> on_tensor;
    std::function<Host(const Host&)> on_host;
  };
  auto narrow_cols = [](int64_t length) {
    return View{"narrowed columns", [=](const Tensor& t) { return t.narrow(-1, 1, length); },
                [=](const Host& h) {
                  return host_narrow(h, static_cast<int64_t>(h.shape.size()) - 1, 1, length);
                }};
  };
  auto transposed = [](View inner) {
    return View{inner.name + ", transposed",
                [=](const Tensor& t) { return inner.on_tensor(t).transpose(-1, -2); },
                [=](const Host& h) {
                  const Host v = inner.on_host(h);
                  const int64_t r = static_cast<int64_t>(v.shape.size());
                  return host_transpose(v, r - 2, r - 1);
                }};
  };
  const View dense{"dense", [](const Tensor& t) { return t; }, [](const Host& h) { return h; }};
  struct Case {
    Shape a_base, b_base;
    View a, b;
  };
  // A [.., n, k] from a_base through a, B [.., k, m] from b_base through b.
  const std::vector<Case> cases = {
      {{3, 0}, {0, 4}, dense, dense},                                // k = 0: zeros
      {{6, 9}, {7, 5}, narrow_cols(7), dense},                       // lda 9 for 7 columns
      {{6, 9}, {5, 8}, narrow_cols(7), transposed(narrow_cols(7))},  // B^T with ld 8
      {{7, 6}, {5, 7}, transposed(dense), transposed(dense)},        // both column-major
      {{3, 7, 6}, {7, 5}, transposed(dense), dense},                 // batched transposes
      {{1, 6}, {4, 5, 6}, dense, transposed(dense)},                 // n = 1; batched B^T
      // Stacked A matrices over one B: one product of all their rows (Note [Batched products
      // on the CPU]), also with a leading dimension past the columns.
      {{4, 6, 7}, {5, 7}, dense, transposed(dense)},
      {{3, 6, 9}, {7, 5}, narrow_cols(7), dense},
      // Batches that are not stacked rows, and many small products: a product per batch,
      // spread over the threads.
      {{6, 3, 7},
       {7, 5},
       View{"batches interleaved", [](const Tensor& t) { return t.transpose(0, 1); },
            [](const Host& h) { return host_transpose(h, 0, 1); }},
       dense},
      {{16, 9, 8}, {16, 8, 5}, dense, dense},
      {{6, 5},
       {3, 5, 4},
       View{"expanded over a batch",
            [](const Tensor& t) {
              return t.unsqueeze(0).expand({3, 6, 5});
            },
            [](const Host& h) {
              return host_expand(host_reshape(h, {1, 6, 5}), {3, 6, 5});
            }},
       dense},
      {{5, 4, 2},
       {4, 3},
       View{"every other element (neither layout: copied)",
            [](const Tensor& t) {
              return t.narrow(2, 0, 1).reshape({5, 4});
            },
            [](const Host& h) {
              return host_reshape(host_narrow(h, 2, 0, 1), {5, 4});
            }},
       dense},
  };
  std::mt19937 rng(5);
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const Case& c : cases) {
      const Host a_base = random_host(rng, c.a_base, dtype, {-1, 1, -20, 20});
      const Host b_base = random_host(rng, c.b_base, dtype, {-1, 1, -20, 20});
      const Tensor a = c.a.on_tensor(to_tensor(a_base, dtype));
      const Tensor b = c.b.on_tensor(to_tensor(b_base, dtype));
      std::vector<double> magnitude;
      const Host want = host_matmul(c.a.on_host(a_base), c.b.on_host(b_base), &magnitude);
      expect_matches(matmul(a, b), want, dtype, tol_for(dtype),
                     "matmul " + name_of(dtype) + " of " + c.a.name + " by " + c.b.name, magnitude);
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
