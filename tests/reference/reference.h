// An independent float64 reference for the op tests in tests/ops/: expected values are computed
// here, on host vectors of doubles, and never by lazyfuse.
//
// The reference has its own broadcasting index math, its own views written as index maps (not
// strides), its own rounding to float16 and bfloat16, naive loops for matmul and long double
// sums, and PyTorch's type promotion restated rather than taken from ir/dtype.h, so a mistake
// shared by lazyfuse's kernels cannot also hide in the expected values. Inputs are drawn from
// seeded std::mt19937 engines and rounded to their dtype before they are handed to lazyfuse, so
// both sides start from exactly the same numbers.
//
// lazyfuse appears here only at the edges: its DType, Shape and ScalarKind name things;
// to_tensor hands a Host's values over (from_vector), a Layout applies the same view to the
// tensor side that its host_view applies here, and expect_matches reads a result back
// (to_vector) to compare it. None of them computes an expected value.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lazyfuse/lazyfuse.h"

namespace lazyfuse::reference {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// PyTorch's name of a dtype ("float32"), for messages.
std::string name_of(DType dtype);
// "[2, 3]", for messages.
std::string shape_text(std::span<const int64_t> shape);

// ---------------------------------------------------------------------------------------------
// The host reference: contiguous row-major doubles and the index math over them.

struct Host {
  Shape shape;
  std::vector<double> v;
};

int64_t count(const Shape& shape);
std::vector<int64_t> unravel(int64_t flat, const Shape& shape);
int64_t ravel(const std::vector<int64_t>& index, const Shape& shape);

// numpy's broadcasting: align from the right, size-1 dims stretch. The tests only pair shapes
// that broadcast.
Shape broadcast_of(const Shape& a, const Shape& b);

using Fn3 = std::function<double(double, double, double)>;

// f applied elementwise over the broadcast of `inputs` (at most three, and of `shape`, which
// lets an expand stretch a single input).
Host ref_map(const std::vector<const Host*>& inputs, const Fn3& f, Shape shape = {});
Host ref_unary(const Host& a, double (*f)(double));
Host ref_binary(const Host& a, const Host& b, double (*f)(double, double));

// Host versions of the views, written as index maps (not strides) to stay independent.
Host host_permute(const Host& h, const std::vector<int64_t>& dims);
Host host_transpose(const Host& h, int64_t d0, int64_t d1);
// `start` counts from the front: where lazyfuse is given a negative start, the host side is
// given the position it should resolve to.
Host host_narrow(const Host& h, int64_t dim, int64_t start, int64_t length);
Host host_expand(const Host& h, const Shape& shape);
Host host_reshape(const Host& h, const Shape& shape);

// ---------------------------------------------------------------------------------------------
// Reductions and matmul.

enum class Reduce { Sum, Mean, Max, Min };

struct Reduced {
  Host value;
  std::vector<double> magnitude;  // sum of |x| behind each result (mean: divided by the count)
};

// The reference reduction: long double sums, NaN-propagating max and min. `dims` empty means
// all dims; negative dims count from the end.
Reduced host_reduce(const Host& h, const std::vector<int64_t>& dims, bool keepdim, Reduce kind);

// Sums are allowed an error of the result dtype's precision times 1% of what was summed: any
// lost, doubled or misplaced element costs far more than that.
std::vector<double> sum_slack(const Reduced& r);

// Row by row over a row-major [rows, columns] matrix, in double: LayerNorm (the mean and the
// biased variance of each row, then (x - mean) / sqrt(variance + eps) * weight + bias) and
// softmax (exp(x - the row's max) over its sum).
std::vector<double> host_layer_norm_rows(const std::vector<double>& x, int64_t columns,
                                         const std::vector<double>& weight,
                                         const std::vector<double>& bias, double eps);
std::vector<double> host_softmax_rows(const std::vector<double>& x, int64_t columns);

// A unit in the last place of bfloat16 (8 significant bits) at `x`.
double bfloat16_unit(double x);
// The error of each of `got` against `want` in units in the last place of bfloat16 at `want`:
// the largest and the mean.
std::pair<double, double> bfloat16_ulp_errors(const std::vector<double>& got,
                                              const std::vector<double>& want);

// Naive loops over numpy's matmul semantics: 1-D operands gain a dim that the result drops,
// batch dims broadcast. `magnitude` gets sum_k |a||b| for each result, the scale of its error.
Host host_matmul(const Host& a, const Host& b, std::vector<double>* magnitude);

// ---------------------------------------------------------------------------------------------
// Rounding to each dtype, as a store to that dtype does.

// Round to nearest, ties to even (nearbyint's default mode), keeping `bits` significant bits;
// below 2^min_exp the spacing stays that of 2^min_exp (subnormals); past max_finite: infinity.
double round_significand(double x, int bits, int min_exp, double max_finite);

// A double stored as `dtype` and read back. Half types go through float first, as PyTorch's
// c10::Half(float) conversion of a double does.
double quantize(double x, DType dtype);

// Shorthands for quantize to float32 and to float16, for references that round after each op.
double f32(double x);
double f16(double x);

// A bool result holds only 0 and 1 (True + True is True); other dtypes are compared with
// tolerance against the unrounded reference.
Host as_result(Host h, DType dtype);

// ---------------------------------------------------------------------------------------------
// Inputs.

// Where an op's inputs are drawn: [lo, hi] for floating dtypes, [ilo, ihi] for integers.
struct Domain {
  double lo, hi;
  int64_t ilo, ihi;
  bool nonzero = false;   // keep |x| >= 0.5 (divisors)
  bool discrete = false;  // multiples of 0.5, so comparisons and max/min meet ties
};

// The default domain of most ops: floats within a few units of zero, integers in the
// thousands.
inline constexpr Domain kWide{-3, 3, -1000, 1000};

// Values of `shape` drawn from `domain` and rounded to `dtype`, so that handing them to lazyfuse
// as `dtype` loses nothing.
Host random_host(std::mt19937& rng, const Shape& shape, DType dtype, const Domain& domain);

// The same values as a lazyfuse tensor of `dtype`.
Tensor to_tensor(const Host& h, DType dtype);

// ---------------------------------------------------------------------------------------------
// Comparison.

struct Tol {
  double rtol = 0, atol = 0;
};

// Per result dtype: float64 exact to rounding, float32 within the 1-ULP SLEEF functions, half
// types within one rounding to their few bits; integers and bool exactly.
Tol tol_for(DType dtype);

// Expects `got` to have `dtype`, want's shape, and values within atol + rtol * (|want| + slack),
// slack being a per-element allowance for sums (the magnitude of what was summed). NaN must meet
// NaN and infinities must be exact. Reports the number of mismatches and the first few.
void expect_matches(const Tensor& got, const Host& want, DType dtype, Tol tol,
                    const std::string& what, const std::vector<double>& slack = {});

// ---------------------------------------------------------------------------------------------
// PyTorch's promotion, restated here rather than taken from ir/dtype.h.

// 0 for bool, 1 for integers, 2 for floating dtypes.
int category(DType dtype);

DType expect_promote(DType a, DType b);

// A Python number meets a tensor: it only lifts the category (to int64 or the default float32).
DType expect_with_scalar(DType tensor, ScalarKind kind);

enum class Rule { Promote, FloatPromote, Compare };

DType apply_rule(Rule rule, DType promoted);

// ---------------------------------------------------------------------------------------------
// Input layouts: a contiguous base, and the view applied to it on both sides. Sizes cover
// scalars, odd sizes, several blocks and several tasks, and strided or broadcast reads.

struct Layout {
  const char* name;
  Shape base;
  std::function<Tensor(const Tensor&)> view;  // null: the base itself
  std::function<Host(const Host&)> host_view;
};

const std::vector<Layout>& layouts();

struct Input {
  Tensor tensor;
  Host host;
};

Input make_input(std::mt19937& rng, const Layout& layout, DType dtype, const Domain& domain);

}  // namespace lazyfuse::reference
