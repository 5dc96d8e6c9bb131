// Differential tests of every lazyfuse op against a float64 reference computed here, on host
// vectors: elementwise ops over all dtypes, broadcasting, strided views and sizes that cross the
// CPU's block (1024) and task (16384) boundaries; PyTorch's type promotion; casts; reductions;
// matmul; views; fused against unfused evaluation; and the factories.
//
// The reference never calls lazyfuse to compute anything: it has its own broadcasting index
// math, its own rounding to float16 and bfloat16, naive loops for matmul and long double sums,
// so a mistake shared by lazyfuse's kernels cannot also hide in the expected values. Inputs are
// drawn from seeded std::mt19937 engines and rounded to their dtype before they are handed to
// lazyfuse, so both sides start from exactly the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

std::string name_of(DType dtype) { return std::string(dtype_torch_name(dtype)); }

std::string shape_text(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// ---------------------------------------------------------------------------------------------
// The host reference: contiguous row-major doubles and the index math over them.

struct Host {
  Shape shape;
  std::vector<double> v;
};

int64_t count(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

int64_t ravel(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

// numpy's broadcasting: align from the right, size-1 dims stretch. The tests only pair shapes
// that broadcast.
Shape broadcast_of(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i + a.size() < rank ? 1 : a[i + a.size() - rank];
    int64_t db = i + b.size() < rank ? 1 : b[i + b.size() - rank];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

using Fn3 = std::function<double(double, double, double)>;

// f applied elementwise over the broadcast of `inputs` (and of `shape`, which lets an expand
// stretch a single input). An odometer walks the output so large shapes stay cheap.
Host ref_map(const std::vector<const Host*>& inputs, const Fn3& f, Shape shape = {}) {
  for (const Host* h : inputs) shape = broadcast_of(shape, h->shape);
  const size_t rank = shape.size();
  // Per input, how far its flat position moves when an output dim advances (0 if broadcast).
  std::vector<std::vector<int64_t>> steps;
  for (const Host* h : inputs) {
    std::vector<int64_t> step(rank, 0);
    int64_t stride = 1;
    for (size_t k = h->shape.size(); k-- > 0;) {
      step[k + rank - h->shape.size()] = h->shape[k] == 1 ? 0 : stride;
      stride *= h->shape[k];
    }
    steps.push_back(step);
  }
  Host out{shape, std::vector<double>(count(shape))};
  std::vector<int64_t> index(rank, 0), pos(inputs.size(), 0);
  for (int64_t i = 0; i < count(shape); ++i) {
    double x[3] = {0, 0, 0};
    for (size_t k = 0; k < inputs.size(); ++k) x[k] = inputs[k]->v[pos[k]];
    out.v[i] = f(x[0], x[1], x[2]);
    for (size_t d = rank; d-- > 0;) {
      ++index[d];
      for (size_t k = 0; k < inputs.size(); ++k) pos[k] += steps[k][d];
      if (index[d] < shape[d]) break;
      for (size_t k = 0; k < inputs.size(); ++k) pos[k] -= steps[k][d] * shape[d];
      index[d] = 0;
    }
  }
  return out;
}

Host ref_unary(const Host& a, double (*f)(double)) {
  return ref_map({&a}, [f](double x, double, double) { return f(x); });
}

// Host versions of the views, written as index maps (not strides) to stay independent.
Host host_permute(const Host& h, const std::vector<int64_t>& dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(h.shape[d]);
  Host out{shape, std::vector<double>(h.v.size())};
  for (int64_t i = 0; i < count(shape); ++i) {
    std::vector<int64_t> o = unravel(i, shape), in(dims.size());
    for (size_t k = 0; k < dims.size(); ++k) in[dims[k]] = o[k];
    out.v[i] = h.v[ravel(in, h.shape)];
  }
  return out;
}

Host host_transpose(const Host& h, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(h.shape.size());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[d0], dims[d1]);
  return host_permute(h, dims);
}

Host host_narrow(const Host& h, int64_t dim, int64_t start, int64_t length) {
  Shape shape = h.shape;
  shape[dim] = length;
  Host out{shape, std::vector<double>(count(shape))};
  for (int64_t i = 0; i < count(shape); ++i) {
    std::vector<int64_t> index = unravel(i, shape);
    index[dim] += start;
    out.v[i] = h.v[ravel(index, h.shape)];
  }
  return out;
}

Host host_expand(const Host& h, const Shape& shape) {
  return ref_map(
      {&h}, [](double x, double, double) { return x; }, shape);
}

Host host_reshape(const Host& h, const Shape& shape) { return Host{shape, h.v}; }

// ---------------------------------------------------------------------------------------------
// Rounding to each dtype, as a store to that dtype does.

// Round to nearest, ties to even (nearbyint's default mode), keeping `bits` significant bits;
// below 2^min_exp the spacing stays that of 2^min_exp (subnormals); past max_finite: infinity.
double round_significand(double x, int bits, int min_exp, double max_finite) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = std::max(std::ilogb(x), min_exp);
  double ulp = std::ldexp(1.0, e - (bits - 1));
  double r = std::nearbyint(x / ulp) * ulp;
  return std::fabs(r) > max_finite ? std::copysign(kInf, x) : r;
}

// A double stored as `dtype` and read back. Half types go through float first, as PyTorch's
// c10::Half(float) conversion of a double does.
double quantize(double x, DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return x != 0 ? 1 : 0;
    case DType::Int32:
    case DType::Int64:
      return std::trunc(x);  // C++ and PyTorch float-to-int casts truncate toward zero
    case DType::Float16:
      return round_significand(static_cast<float>(x), 11, -14, 65504.0);
    case DType::BFloat16:
      return round_significand(static_cast<float>(x), 8, -126, 3.3895313892515355e38);
    case DType::Float32:
      return static_cast<float>(x);
    case DType::Float64:
      break;
  }
  return x;
}

// ---------------------------------------------------------------------------------------------
// Inputs.

// Where an op's inputs are drawn: [lo, hi] for floating dtypes, [ilo, ihi] for integers.
struct Domain {
  double lo, hi;
  int64_t ilo, ihi;
  bool nonzero = false;   // keep |x| >= 0.5 (divisors)
  bool discrete = false;  // multiples of 0.5, so comparisons and max/min meet ties
};

Host random_host(std::mt19937& rng, const Shape& shape, DType dtype, const Domain& domain) {
  Host h{shape, std::vector<double>(count(shape))};
  std::uniform_real_distribution<double> real(domain.lo, domain.hi);
  std::uniform_int_distribution<int64_t> integer(domain.ilo, domain.ihi);
  std::bernoulli_distribution coin(0.5);
  for (double& x : h.v) {
    if (dtype == DType::Bool) {
      x = coin(rng) ? 1 : 0;
    } else if (!is_floating(dtype)) {
      x = static_cast<double>(integer(rng));
      if (domain.nonzero && x == 0) x = 1;
    } else {
      x = real(rng);
      if (domain.discrete) x = std::round(x * 2) / 2;
      if (domain.nonzero && std::fabs(x) < 0.5) x = std::copysign(0.5 + std::fabs(x), x);
      x = quantize(x, dtype);
    }
  }
  return h;
}

Tensor to_tensor(const Host& h, DType dtype) { return from_vector(h.v, h.shape, dtype); }

// ---------------------------------------------------------------------------------------------
// Comparison.

struct Tol {
  double rtol = 0, atol = 0;
};

// Per result dtype: float64 exact to rounding, float32 within the 1-ULP SLEEF functions, half
// types within one rounding to their few bits; integers and bool exactly.
Tol tol_for(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return {1e-12, 1e-13};
    case DType::Float32:
      return {1e-5, 1e-6};
    case DType::Float16:
      return {1e-3, 1e-3};
    case DType::BFloat16:
      return {1e-2, 1e-2};
    default:
      return {0, 0};
  }
}

// Expects `got` to have `dtype`, want's shape, and values within atol + rtol * (|want| + slack),
// slack being a per-element allowance for sums (the magnitude of what was summed). NaN must meet
// NaN and infinities must be exact. Reports the number of mismatches and the first few.
void expect_matches(const Tensor& got, const Host& want, DType dtype, Tol tol,
                    const std::string& what, const std::vector<double>& slack = {}) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.dtype(), dtype) << "got " << name_of(got.dtype()) << ", want " << name_of(dtype);
  ASSERT_EQ(got.sizes(), want.shape)
      << "got " << shape_text(got.sizes()) << ", want " << shape_text(want.shape);
  std::vector<double> values = got.to_vector<double>();
  ASSERT_EQ(values.size(), want.v.size());
  int64_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (size_t i = 0; i < values.size(); ++i) {
    double g = values[i], w = want.v[i];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g);
    } else if (std::isinf(w)) {
      ok = g == w;
    } else {
      double allowed = tol.atol + tol.rtol * (std::fabs(w) + (slack.empty() ? 0 : slack[i]));
      ok = std::fabs(g - w) <= allowed;
    }
    if (!ok && bad++ < 5) first << "\n  [" << i << "] got " << g << ", want " << w;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << values.size() << " elements differ:" << first.str();
}

// ---------------------------------------------------------------------------------------------
// PyTorch's promotion, restated here rather than taken from ir/dtype.h.

int category(DType dtype) {
  return dtype == DType::Bool ? 0 : (dtype == DType::Int32 || dtype == DType::Int64) ? 1 : 2;
}

DType expect_promote(DType a, DType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (category(a) == 1) return DType::Int64;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;  // f32 with a half type, or float16 with bfloat16
}

// A Python number meets a tensor: it only lifts the category (to int64 or the default float32).
DType expect_with_scalar(DType tensor, ScalarKind kind) {
  int scalar = kind == ScalarKind::Bool ? 0 : kind == ScalarKind::Integral ? 1 : 2;
  if (scalar <= category(tensor)) return tensor;
  return scalar == 1 ? DType::Int64 : DType::Float32;
}

enum class Rule { Promote, FloatPromote, Compare };

DType apply_rule(Rule rule, DType promoted) {
  switch (rule) {
    case Rule::Compare:
      return DType::Bool;
    case Rule::FloatPromote:
      return is_floating(promoted) ? promoted : DType::Float32;
    case Rule::Promote:
      break;
  }
  return promoted;
}

// ---------------------------------------------------------------------------------------------
// Input layouts: a contiguous base, and the view applied to it on both sides. Sizes cover
// scalars, odd sizes, several blocks and several tasks, and strided or broadcast reads.

struct Layout {
  const char* name;
  Shape base;
  std::function<Tensor(const Tensor&)> view;  // null: the base itself
  std::function<Host(const Host&)> host_view;
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"scalar", {}, nullptr, nullptr},
      {"1d7", {7}, nullptr, nullptr},
      {"2d3x5", {3, 5}, nullptr, nullptr},
      {"3d2x3x4", {2, 3, 4}, nullptr, nullptr},
      {"1d40000", {40000}, nullptr, nullptr},
      {"transpose29x37",
       {29, 37},
       [](const Tensor& t) { return t.t(); },
       [](const Host& h) { return host_transpose(h, 0, 1); }},
      {"permute3x4x5",
       {3, 4, 5},
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       },
       [](const Host& h) {
         return host_permute(h, {2, 0, 1});
       }},
      {"narrow6x50",
       {6, 50},
       [](const Tensor& t) { return t.narrow(1, 3, 40).narrow(0, -5, 4); },
       [](const Host& h) { return host_narrow(host_narrow(h, 1, 3, 40), 0, 1, 4); }},
      {"expand3x1",
       {3, 1},
       [](const Tensor& t) {
         return t.expand({3, 1100});
       },
       [](const Host& h) {
         return host_expand(h, {3, 1100});
       }},
      {"transpose300x70",
       {300, 70},
       [](const Tensor& t) { return t.transpose(0, -1); },
       [](const Host& h) { return host_transpose(h, 0, 1); }},
  };
  return all;
}

struct Input {
  Tensor tensor;
  Host host;
};

Input make_input(std::mt19937& rng, const Layout& layout, DType dtype, const Domain& domain) {
  Host base = random_host(rng, layout.base, dtype, domain);
  Tensor t = to_tensor(base, dtype);
  if (!layout.view) return {t, base};
  return {layout.view(t), layout.host_view(base)};
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops.

struct UnaryOp {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*ref)(double);
  Domain domain;
  bool to_float;  // integers and bool give float32 (exp, log, ...)
  bool bool_ok;   // PyTorch rejects -x, abs and relu on bool
};

// Methods, free functions and operators are mixed so that each spelling is exercised.
const UnaryOp kUnaryOps[] = {
    {"neg",
     [](const Tensor& t) { return -t; },
     [](double x) { return -x; },
     {-3, 3, -1000, 1000},
     false,
     false},
    {"abs",
     [](const Tensor& t) { return abs(t); },
     [](double x) { return std::fabs(x); },
     {-3, 3, -1000, 1000},
     false,
     false},
    {"exp",
     [](const Tensor& t) { return exp(t); },
     [](double x) { return std::exp(x); },
     {-5, 5, -5, 5},
     true,
     true},
    {"log",
     [](const Tensor& t) { return t.log(); },
     [](double x) { return std::log(x); },
     {0.05, 20, 1, 20},
     true,
     true},
    {"sqrt",
     [](const Tensor& t) { return sqrt(t); },
     [](double x) { return std::sqrt(x); },
     {0, 50, 0, 50},
     true,
     true},
    {"rsqrt",
     [](const Tensor& t) { return t.rsqrt(); },
     [](double x) { return 1 / std::sqrt(x); },
     {0.05, 50, 1, 50},
     true,
     true},
    {"sin",
     [](const Tensor& t) { return sin(t); },
     [](double x) { return std::sin(x); },
     {-10, 10, -10, 10},
     true,
     true},
    {"cos",
     [](const Tensor& t) { return t.cos(); },
     [](double x) { return std::cos(x); },
     {-10, 10, -10, 10},
     true,
     true},
    {"tanh",
     [](const Tensor& t) { return tanh(t); },
     [](double x) { return std::tanh(x); },
     {-5, 5, -5, 5},
     true,
     true},
    {"sigmoid",
     [](const Tensor& t) { return t.sigmoid(); },
     [](double x) { return 1 / (1 + std::exp(-x)); },
     {-8, 8, -8, 8},
     true,
     true},
    {"relu",
     [](const Tensor& t) { return relu(t); },
     [](double x) { return x < 0 ? 0.0 : x; },
     {-3, 3, -1000, 1000},
     false,
     false},
};

TEST(OpsElementwise, UnaryOpsMatchReferenceOnAllDTypesAndLayouts) {
  std::mt19937 rng(1);
  for (const UnaryOp& op : kUnaryOps) {
    for (DType dtype : kAllDTypes) {
      for (const Layout& layout : layouts()) {
        std::string what = std::string(op.name) + " " + name_of(dtype) + " " + layout.name;
        Input in = make_input(rng, layout, dtype, op.domain);
        if (dtype == DType::Bool && !op.bool_ok) {
          EXPECT_THROW(op.op(in.tensor), DTypeError) << what;
          continue;
        }
        DType out = op.to_float && !is_floating(dtype) ? DType::Float32 : dtype;
        expect_matches(op.op(in.tensor), ref_unary(in.host, op.ref), out, tol_for(out), what);
      }
    }
  }
}

struct BinaryOp {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  Tensor (*tensor_scalar)(const Tensor&, Scalar);  // null where there is no such form
  Tensor (*scalar_tensor)(Scalar, const Tensor&);
  double (*ref)(double, double);
  Rule rule;
  bool bool_ok;
  Domain a, b;
};

constexpr Domain kWide{-3, 3, -1000, 1000};
constexpr Domain kTies{-2, 2, -3, 3, false, true};

const BinaryOp kBinaryOps[] = {
    {"add", [](const Tensor& a, const Tensor& b) { return a + b; },
     [](const Tensor& a, Scalar s) { return a + s; },
     [](Scalar s, const Tensor& b) { return s + b; }, [](double a, double b) { return a + b; },
     Rule::Promote, true, kWide, kWide},
    {"sub", [](const Tensor& a, const Tensor& b) { return a - b; },
     [](const Tensor& a, Scalar s) { return a - s; },
     [](Scalar s, const Tensor& b) { return s - b; }, [](double a, double b) { return a - b; },
     Rule::Promote, false, kWide, kWide},
    {"mul", [](const Tensor& a, const Tensor& b) { return a * b; },
     [](const Tensor& a, Scalar s) { return a * s; },
     [](Scalar s, const Tensor& b) { return s * b; }, [](double a, double b) { return a * b; },
     Rule::Promote, true, kWide, kWide},
    {"div",
     [](const Tensor& a, const Tensor& b) { return a / b; },
     [](const Tensor& a, Scalar s) { return a / s; },
     [](Scalar s, const Tensor& b) { return s / b; },
     [](double a, double b) { return a / b; },
     Rule::FloatPromote,
     true,
     kWide,
     {-4, 4, -9, 9, true}},
    {"pow",
     [](const Tensor& a, const Tensor& b) { return pow(a, b); },
     [](const Tensor& a, Scalar s) { return a.pow(s); },
     nullptr,
     [](double a, double b) { return std::pow(a, b); },
     Rule::Promote,
     false,
     {0.1, 4, -4, 4},
     {-2, 3, 0, 5}},
    {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
     [](const Tensor& a, Scalar s) { return a.clamp_min(s); }, nullptr,
     [](double a, double b) { return std::max(a, b); }, Rule::Promote, true, kTies, kTies},
    {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
     [](const Tensor& a, Scalar s) { return a.clamp_max(s); }, nullptr,
     [](double a, double b) { return std::min(a, b); }, Rule::Promote, true, kTies, kTies},
    {"eq", [](const Tensor& a, const Tensor& b) { return a == b; },
     [](const Tensor& a, Scalar s) { return a == s; }, nullptr,
     [](double a, double b) { return a == b ? 1.0 : 0.0; }, Rule::Compare, true, kTies, kTies},
    {"ne", [](const Tensor& a, const Tensor& b) { return a != b; },
     [](const Tensor& a, Scalar s) { return a != s; }, nullptr,
     [](double a, double b) { return a != b ? 1.0 : 0.0; }, Rule::Compare, true, kTies, kTies},
    {"lt", [](const Tensor& a, const Tensor& b) { return a < b; },
     [](const Tensor& a, Scalar s) { return a < s; }, nullptr,
     [](double a, double b) { return a < b ? 1.0 : 0.0; }, Rule::Compare, true, kTies, kTies},
    {"le", [](const Tensor& a, const Tensor& b) { return a <= b; },
     [](const Tensor& a, Scalar s) { return a <= s; }, nullptr,
     [](double a, double b) { return a <= b ? 1.0 : 0.0; }, Rule::Compare, true, kTies, kTies},
    {"gt", [](const Tensor& a, const Tensor& b) { return a > b; },
     [](const Tensor& a, Scalar s) { return a > s; }, nullptr,
     [](double a, double b) { return a > b ? 1.0 : 0.0; }, Rule::Compare, true, kTies, kTies},
    {"ge", [](const Tensor& a, const Tensor& b) { return a >= b; },
     [](const Tensor& a, Scalar s) { return a >= s; }, nullptr,
     [](double a, double b) { return a >= b ? 1.0 : 0.0; }, Rule::Compare, true, kTies, kTies},
};

Host ref_binary(const Host& a, const Host& b, double (*f)(double, double)) {
  return ref_map({&a, &b}, [f](double x, double y, double) { return f(x, y); });
}

// A bool result holds only 0 and 1 (True + True is True); other dtypes are compared with
// tolerance against the unrounded reference.
Host as_result(Host h, DType dtype) {
  if (dtype == DType::Bool)
    for (double& x : h.v) x = quantize(x, dtype);
  return h;
}

TEST(OpsElementwise, BinaryOpsBroadcastOnAllDTypes) {
  // Pairs that broadcast each way, including both operands stretched, and sizes past a task
  // (41107 elements: two full tasks of 16384 and a ragged last block; contiguous sizes that
  // large are the unary test's).
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{}, {}},
      {{7}, {7}},
      {{3, 1}, {1, 4}},
      {{5, 4}, {4}},
      {{}, {2, 3}},
      {{2, 3}, {}},
      {{2, 1, 4}, {3, 1}},
      {{1037}, {1037}},
      {{37, 1111}, {1111}},
      {{37, 1}, {1, 1111}},
  };
  std::mt19937 rng(2);
  for (const BinaryOp& op : kBinaryOps) {
    for (DType dtype : kAllDTypes) {
      for (const auto& [sa, sb] : shapes) {
        std::string what = std::string(op.name) + " " + name_of(dtype) + " " + shape_text(sa) +
                           " " + shape_text(sb);
        Host a = random_host(rng, sa, dtype, op.a), b = random_host(rng, sb, dtype, op.b);
        Tensor ta = to_tensor(a, dtype), tb = to_tensor(b, dtype);
        if (dtype == DType::Bool && !op.bool_ok) {
          EXPECT_THROW(op.op(ta, tb), DTypeError) << what;
          continue;
        }
        DType out = apply_rule(op.rule, dtype);
        expect_matches(op.op(ta, tb), as_result(ref_binary(a, b, op.ref), out), out, tol_for(out),
                       what);
      }
    }
  }
}

TEST(OpsElementwise, BinaryOpsOnStridedViews) {
  // Every layout as the left operand against a contiguous right operand of the same shape, and
  // the other way round: kernels must read views through their strides.
  std::mt19937 rng(3);
  for (const BinaryOp& op : kBinaryOps) {
    for (DType dtype : {DType::Float32, DType::Int32, DType::Float16}) {
      for (const Layout& layout : layouts()) {
        if (!layout.view) continue;  // contiguous operands are the previous test's
        std::string what = std::string(op.name) + " " + name_of(dtype) + " " + layout.name;
        Input a = make_input(rng, layout, dtype, op.a);
        Host b = random_host(rng, a.host.shape, dtype, op.b);
        Tensor tb = to_tensor(b, dtype);
        DType out = apply_rule(op.rule, dtype);
        expect_matches(op.op(a.tensor, tb), as_result(ref_binary(a.host, b, op.ref), out), out,
                       tol_for(out), what + " view-left");
        Input c = make_input(rng, layout, dtype, op.b);
        Host d = random_host(rng, c.host.shape, dtype, op.a);
        expect_matches(op.op(to_tensor(d, dtype), c.tensor),
                       as_result(ref_binary(d, c.host, op.ref), out), out, tol_for(out),
                       what + " view-right");
      }
    }
  }
}

TEST(OpsElementwise, MixedDTypesPromoteAsPyTorch) {
  // Small exact values (multiples of 0.5, integers in [-4, 4]) so that every conversion to the
  // promoted dtype is exact and only the op's own rounding remains.
  const Domain small{-4, 4, -4, 4, false, true};
  const Domain divisor{-4, 4, -4, 4, true, true};
  std::mt19937 rng(4);
  for (const BinaryOp& op : kBinaryOps) {
    if (std::string(op.name) == "pow") continue;  // tested with its own domains below
    for (DType da : kAllDTypes) {
      for (DType db : kAllDTypes) {
        std::string what = std::string(op.name) + " " + name_of(da) + " with " + name_of(db);
        Host a = random_host(rng, {3, 4}, da, small);
        Host b = random_host(rng, {4}, db, std::string(op.name) == "div" ? divisor : small);
        Tensor ta = to_tensor(a, da), tb = to_tensor(b, db);
        if (!op.bool_ok && (da == DType::Bool || db == DType::Bool)) {
          EXPECT_THROW(op.op(ta, tb), DTypeError) << what;
          continue;
        }
        DType out = apply_rule(op.rule, expect_promote(da, db));
        expect_matches(op.op(ta, tb), as_result(ref_binary(a, b, op.ref), out), out, tol_for(out),
                       what);
      }
    }
  }
  // pow: positive bases, small exponents, every pair of non-bool dtypes.
  for (DType da : kAllDTypes) {
    for (DType db : kAllDTypes) {
      if (da == DType::Bool || db == DType::Bool) continue;
      std::string what = "pow " + name_of(da) + " with " + name_of(db);
      Host a = random_host(rng, {2, 5}, da, {0.5, 3, 1, 3, false, true});
      Host b = random_host(rng, {5}, db, {0, 3, 0, 3, false, true});
      DType out = expect_promote(da, db);
      expect_matches(pow(to_tensor(a, da), to_tensor(b, db)),
                     ref_binary(a, b, [](double x, double y) { return std::pow(x, y); }), out,
                     tol_for(out), what);
    }
  }
}

TEST(OpsElementwise, PromotionSpotChecks) {
  // The cases PyTorch users meet most, written out literally.
  Tensor i32 = ones({2}, kInt32), i64 = ones({2}, kInt64), f16 = ones({2}, kFloat16);
  Tensor f32 = ones({2}, kFloat32), bf16 = ones({2}, kBFloat16), b = ones({2}, kBool);
  EXPECT_EQ((i32 + 2.5).dtype(), kFloat32);
  EXPECT_EQ((i32 + 2).dtype(), kInt32);
  EXPECT_EQ((i32 / i32).dtype(), kFloat32);
  EXPECT_EQ((i64 / 2).dtype(), kFloat32);
  EXPECT_EQ((f16 + f32).dtype(), kFloat32);
  EXPECT_EQ((f16 + bf16).dtype(), kFloat32);
  EXPECT_EQ((f16 + 2.5).dtype(), kFloat16);
  EXPECT_EQ((b + b).dtype(), kBool);
  EXPECT_EQ((b + 1).dtype(), kInt64);
  EXPECT_EQ((b * 1.5).dtype(), kFloat32);
  EXPECT_EQ((i32 + i64).dtype(), kInt64);
  EXPECT_EQ((i32 + f16).dtype(), kFloat16);
  EXPECT_EQ((i32 < f32).dtype(), kBool);
  EXPECT_EQ((f16 == 1).dtype(), kBool);
  EXPECT_EQ(i32.exp().dtype(), kFloat32);
  EXPECT_EQ(b.sqrt().dtype(), kFloat32);
  EXPECT_EQ(i32.pow(2).dtype(), kInt32);
  EXPECT_EQ(i32.pow(0.5).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kFloat64) * 2.5).dtype(), kFloat64);
  // Values of the headline case: int32 + 2.5 computes in float.
  std::vector<double> v = (from_vector({1, -3}, {2}, kInt32) + 2.5).to_vector<double>();
  EXPECT_EQ(v, (std::vector<double>{3.5, -0.5}));
  std::vector<double> q =
      (from_vector({7, -7}, {2}, kInt32) / from_vector({2, 2}, {2}, kInt32)).to_vector<double>();
  EXPECT_EQ(q, (std::vector<double>{3.5, -3.5}));  // true division, never truncation
}

TEST(OpsElementwise, ScalarOperandsOnBothSides) {
  struct ScalarCase {
    Scalar scalar;
    double value;
  };
  const ScalarCase scalars[] = {
      {Scalar(3), 3}, {Scalar(2.5), 2.5}, {Scalar(-1.25), -1.25}, {Scalar(true), 1}};
  std::mt19937 rng(5);
  for (const BinaryOp& op : kBinaryOps) {
    for (DType dtype : kAllDTypes) {
      for (const ScalarCase& s : scalars) {
        for (const Shape& shape : {Shape{}, Shape{5, 3}, Shape{1100}}) {
          std::string what = std::string(op.name) + " " + name_of(dtype) + " " + shape_text(shape) +
                             " scalar " + std::to_string(s.value);
          bool bool_operand = dtype == DType::Bool;
          if (!op.bool_ok && s.scalar.kind() == ScalarKind::Bool && !bool_operand) continue;
          // Fractional powers of negative integers are NaN; keep the pow bases positive there.
          Domain a_domain = op.a;
          if (std::string(op.name) == "pow") a_domain = {0.1, 4, 1, 4};
          DType out = apply_rule(op.rule, expect_with_scalar(dtype, s.scalar.kind()));
          Host a = random_host(rng, shape, dtype, a_domain);
          Host scalar_host{{}, {s.value}};
          if (op.tensor_scalar) {
            Tensor t = to_tensor(a, dtype);
            if (bool_operand && !op.bool_ok) {
              EXPECT_THROW(op.tensor_scalar(t, s.scalar), DTypeError) << what;
            } else {
              expect_matches(op.tensor_scalar(t, s.scalar),
                             as_result(ref_binary(a, scalar_host, op.ref), out), out, tol_for(out),
                             what + " tensor-scalar");
            }
          }
          if (op.scalar_tensor) {
            Host b = random_host(rng, shape, dtype, op.b);
            Tensor t = to_tensor(b, dtype);
            if (bool_operand && !op.bool_ok) {
              EXPECT_THROW(op.scalar_tensor(s.scalar, t), DTypeError) << what;
            } else {
              expect_matches(op.scalar_tensor(s.scalar, t),
                             as_result(ref_binary(scalar_host, b, op.ref), out), out, tol_for(out),
                             what + " scalar-tensor");
            }
          }
        }
      }
    }
  }
}

TEST(OpsElementwise, ComparisonsGiveBool) {
  Tensor a = from_vector({1, 2, 3, 4}, {4}, kFloat32);
  Tensor b = from_vector({4, 2, 1, 4}, {4}, kInt64);
  EXPECT_EQ((a == b).to_vector<bool>(), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ((a != b).to_vector<bool>(), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ((a < b).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ((a <= b).to_vector<bool>(), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ((a > b).to_vector<bool>(), (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ((a >= b).to_vector<bool>(), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ((a >= 3).dtype(), kBool);
  // Mixed widths compare in the promoted dtype: 0.1 in float64 is not 0.1f.
  Tensor f64 = from_vector({0.1}, {1}, kFloat64);
  Tensor f32 = from_vector({0.1}, {1}, kFloat32);
  EXPECT_FALSE((f64 == f32).item<bool>());
  EXPECT_FALSE((f64 == f32.to(kFloat64)).item<bool>());
  EXPECT_TRUE((f32.to(kFloat64) == f32).item<bool>());
}

TEST(OpsElementwise, ClampOnAllDTypes) {
  std::mt19937 rng(6);
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : {Shape{}, Shape{13}, Shape{3, 1500}}) {
      std::string what = "clamp " + name_of(dtype) + " " + shape_text(shape);
      Host a = random_host(rng, shape, dtype, {-2, 2, -5, 5});
      Tensor t = to_tensor(a, dtype);
      if (dtype == DType::Bool) {
        EXPECT_THROW(t.clamp(0, 1), DTypeError) << what;
        continue;
      }
      if (!is_floating(dtype)) {
        // Integer bounds keep the integer dtype; float bounds lift it to float32.
        expect_matches(clamp(t, -2, 3),
                       ref_unary(a, [](double x) { return std::clamp(x, -2., 3.); }), dtype,
                       tol_for(dtype), what + " int bounds");
        expect_matches(t.clamp(-0.5, 2.5),
                       ref_unary(a, [](double x) { return std::clamp(x, -0.5, 2.5); }),
                       DType::Float32, tol_for(DType::Float32), what + " float bounds");
        continue;
      }
      expect_matches(t.clamp(-0.5, 0.75),
                     ref_unary(a, [](double x) { return std::clamp(x, -0.5, 0.75); }), dtype,
                     tol_for(dtype), what);
      expect_matches(t.clamp_min(0.25), ref_unary(a, [](double x) { return std::max(x, 0.25); }),
                     dtype, tol_for(dtype), what + " clamp_min");
      expect_matches(t.clamp_max(-0.25), ref_unary(a, [](double x) { return std::min(x, -0.25); }),
                     dtype, tol_for(dtype), what + " clamp_max");
    }
  }
}

TEST(OpsElementwise, WhereSelectsBroadcastsAndPromotes) {
  std::mt19937 rng(7);
  auto select = [](double c, double a, double b) { return c != 0 ? a : b; };
  for (const auto& [sc, sa, sb] :
       std::vector<std::tuple<Shape, Shape, Shape>>{{{3, 1}, {1, 4}, {3, 4}},
                                                    {{}, {5}, {5}},
                                                    {{40000}, {40000}, {1}},
                                                    {{2, 1, 7}, {3, 1}, {7}}}) {
    for (DType da : kAllDTypes) {
      for (DType db : {DType::Float32, DType::Int32, DType::Float16, DType::Bool}) {
        std::string what = "where " + shape_text(sc) + " " + name_of(da) + "/" + name_of(db);
        Host c = random_host(rng, sc, DType::Bool, kWide);
        Host a = random_host(rng, sa, da, kWide), b = random_host(rng, sb, db, kWide);
        DType out = expect_promote(da, db);
        expect_matches(where(to_tensor(c, kBool), to_tensor(a, da), to_tensor(b, db)),
                       ref_map({&c, &a, &b}, select), out, tol_for(out), what);
      }
    }
  }
  // Scalar branches: the result dtype follows the scalars (PyTorch's torch.where).
  Host c = random_host(rng, {2, 9}, DType::Bool, kWide);
  Tensor cond = to_tensor(c, kBool);
  Host one{{}, {1}}, zero{{}, {0}}, half{{}, {1.5}}, neg{{}, {-2.5}};
  expect_matches(where(cond, 1, 0), ref_map({&c, &one, &zero}, select), kInt64, {}, "where 1 0");
  expect_matches(where(cond, 1.5, 0), ref_map({&c, &half, &zero}, select), kFloat32, {},
                 "where 1.5 0");
  expect_matches(where(cond, true, false), ref_map({&c, &one, &zero}, select), kBool, {},
                 "where true false");
  Host a = random_host(rng, {9}, kInt32, kWide);
  expect_matches(where(cond, to_tensor(a, kInt32), -2.5), ref_map({&c, &a, &neg}, select), kFloat32,
                 tol_for(kFloat32), "where i32 tensor, float scalar");
  expect_matches(where(cond, to_tensor(a, kInt32), 3),
                 ref_map({&c, &a, &one}, [](double k, double x, double) { return k ? x : 3.0; }),
                 kInt32, {}, "where i32 tensor, int scalar");
  // A strided condition and strided branches.
  Host big = random_host(rng, {300, 70}, kFloat32, kWide);
  Tensor tbig = to_tensor(big, kFloat32).t();
  Host tbig_host = host_transpose(big, 0, 1);
  expect_matches(where(tbig > 0, tbig, tbig * 2),
                 ref_unary(tbig_host, [](double x) { return x > 0 ? x : x * 2; }), kFloat32,
                 tol_for(kFloat32), "where strided");
  EXPECT_THROW(where(ones({3}), ones({3}), ones({3})), DTypeError);
}

TEST(OpsElementwise, NanPropagatesThroughMaxMinClampRelu) {
  // 19 elements: the AVX2 float loop, its padded tail and the scalar double path all see NaN.
  std::vector<double> values(19);
  for (int i = 0; i < 19; ++i) values[i] = i % 3 == 0 ? kNan : i - 9.5;
  Host a{{19}, values};
  Host b{{19}, std::vector<double>(19, 0.5)};
  b.v[4] = kNan;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    std::string what = name_of(dtype);
    Tensor ta = to_tensor(a, dtype), tb = to_tensor(b, dtype);
    // PyTorch: maximum and minimum return NaN if either side is NaN.
    auto nan_max = [](double x, double y, double) {
      return std::isnan(x) || std::isnan(y) ? kNan : std::max(x, y);
    };
    auto nan_min = [](double x, double y, double) {
      return std::isnan(x) || std::isnan(y) ? kNan : std::min(x, y);
    };
    expect_matches(maximum(ta, tb), ref_map({&a, &b}, nan_max), dtype, {}, what + " maximum");
    expect_matches(maximum(tb, ta), ref_map({&b, &a}, nan_max), dtype, {}, what + " maximum b,a");
    expect_matches(minimum(ta, tb), ref_map({&a, &b}, nan_min), dtype, {}, what + " minimum");
    expect_matches(minimum(tb, ta), ref_map({&b, &a}, nan_min), dtype, {}, what + " minimum b,a");
    expect_matches(
        ta.clamp(-1, 1),
        ref_unary(a, [](double x) { return std::isnan(x) ? kNan : std::clamp(x, -1.0, 1.0); }),
        dtype, {}, what + " clamp");
    expect_matches(ta.relu(), ref_unary(a, [](double x) { return std::isnan(x) || x > 0 ? x : 0; }),
                   dtype, {}, what + " relu");
    expect_matches(ta + 1, ref_unary(a, [](double x) { return x + 1; }), dtype, {}, what + " add");
  }
}

TEST(OpsElementwise, CastsBetweenAllDTypes) {
  std::mt19937 rng(8);
  // Values every dtype holds (|x| <= 100 fits int32 and float16), with fractions and negative
  // fractions that show truncation toward zero, and zeros for bool.
  const std::vector<double> specials = {0, -0.0, 0.5, -0.5, 1.75, -1.75, 2.5, -99.5, 100, 3};
  for (DType from : kAllDTypes) {
    Host h = random_host(rng, {1037}, from, {-100, 100, -100, 100});
    for (double s : specials) h.v.push_back(quantize(s, from));
    h.shape = {static_cast<int64_t>(h.v.size())};
    Tensor x = to_tensor(h, from);
    for (DType to : kAllDTypes) {
      std::string what = "cast " + name_of(from) + " -> " + name_of(to);
      Tensor y = x.to(to);
      if (from == to) {
        EXPECT_TRUE(y.is_same(x)) << what;
      }
      Host want = ref_map({&h}, [to](double v, double, double) { return quantize(v, to); });
      expect_matches(y, want, to, {}, what);
      // Casting a strided view converts the values it reads.
      expect_matches(x.narrow(0, 3, 600).to(to), host_narrow(want, 0, 3, 600), to, {},
                     what + " narrow");
    }
  }
  // float64 values that need rounding: to nearest even, with float16 overflow to infinity and
  // subnormals at the bottom of each range.
  Host wide = random_host(rng, {2000}, kFloat64, {-1000, 1000, 0, 0});
  for (double s : {70000.0, -65519.0, 65520.0, 1e-6, -3e-7, 1e-40, 1e39, 0.1, 1.0 / 3})
    wide.v.push_back(s);
  wide.shape = {static_cast<int64_t>(wide.v.size())};
  Tensor x = to_tensor(wide, kFloat64);
  for (DType to : {DType::Float32, DType::Float16, DType::BFloat16}) {
    expect_matches(x.to(to),
                   ref_map({&wide}, [to](double v, double, double) { return quantize(v, to); }), to,
                   {}, "rounding f64 -> " + name_of(to));
  }
}

// Floats a cast cannot hold in an integer type: values past the range become the type's
// extremes and NaN becomes 0, on every device (C++ leaves them undefined; x86 gives the
// minimum for all of them). Alone and inside a fused kernel.
TEST(OpsElementwise, FloatToIntegerCastsSaturate) {
  const std::vector<double> values = {kNan, kInf, -kInf, 3e9,   -3e9,  1e19,       -1e19,
                                      2.5,  -2.5, 1e10,  -1e10, 65504, 2147483520, -2147483648};
  for (DType from : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    Tensor x = from_vector(values, {static_cast<int64_t>(values.size())}, from);
    const std::vector<double> stored = x.to_vector<double>();
    for (DType to : {DType::Int32, DType::Int64}) {
      const double limit = to == DType::Int32 ? 2147483648.0 : 9223372036854775808.0;
      const int64_t lowest = to == DType::Int32 ? std::numeric_limits<int32_t>::min()
                                                : std::numeric_limits<int64_t>::min();
      const int64_t highest = to == DType::Int32 ? std::numeric_limits<int32_t>::max()
                                                 : std::numeric_limits<int64_t>::max();
      std::vector<int64_t> want;
      for (double v : stored)
        want.push_back(std::isnan(v) ? 0
                       : v <= -limit ? lowest
                       : v >= limit  ? highest
                                     : static_cast<int64_t>(std::trunc(v)));
      const std::string what = "cast " + name_of(from) + " -> " + name_of(to);
      EXPECT_EQ(x.to(to).to_vector<int64_t>(), want) << what;
      // In a fused kernel, after an op: x * 1 is x, NaN and infinities included.
      EXPECT_EQ((x * 1).to(to).to_vector<int64_t>(), want) << what << " fused";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions.

enum class Reduce { Sum, Mean, Max, Min };

struct Reduced {
  Host value;
  std::vector<double> magnitude;  // sum of |x| behind each result (mean: divided by the count)
};

// The reference reduction: long double sums, NaN-propagating max and min. `dims` empty means
// all dims; negative dims count from the end.
Reduced host_reduce(const Host& h, const std::vector<int64_t>& dims, bool keepdim, Reduce kind) {
  const int64_t rank = static_cast<int64_t>(h.shape.size());
  std::vector<bool> reduced(rank, dims.empty());
  for (int64_t d : dims) reduced[d < 0 ? d + rank : d] = true;
  Shape out_shape;
  std::vector<int64_t> out_step(rank, 0);
  int64_t stride = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (!reduced[d]) {
      out_step[d] = stride;
      stride *= h.shape[d];
    }
  }
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced[d])
      out_shape.push_back(h.shape[d]);
    else if (keepdim)
      out_shape.push_back(1);
  }
  const int64_t n_out = count(out_shape);
  const int64_t per_out = n_out ? count(h.shape) / n_out : 0;
  std::vector<long double> acc(n_out, kind == Reduce::Max ? -kInf : kind == Reduce::Min ? kInf : 0);
  std::vector<long double> magnitude(n_out, 0);
  std::vector<int64_t> index(rank, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < count(h.shape); ++i) {
    long double x = h.v[i];
    magnitude[o] += std::fabs(x);
    if (kind == Reduce::Sum || kind == Reduce::Mean) {
      acc[o] += x;
    } else if (std::isnan(x) || std::isnan(acc[o])) {
      acc[o] = kNan;
    } else {
      acc[o] = kind == Reduce::Max ? std::max(acc[o], x) : std::min(acc[o], x);
    }
    for (int64_t d = rank - 1; d >= 0; --d) {
      ++index[d];
      o += out_step[d];
      if (index[d] < h.shape[d]) break;
      o -= out_step[d] * h.shape[d];
      index[d] = 0;
    }
  }
  Reduced r{{out_shape, std::vector<double>(n_out)}, std::vector<double>(n_out)};
  for (int64_t k = 0; k < n_out; ++k) {
    long double scale = kind == Reduce::Mean ? per_out : 1;
    r.value.v[k] = static_cast<double>(acc[k] / scale);
    r.magnitude[k] = static_cast<double>(magnitude[k] / scale);
  }
  return r;
}

// Sums are allowed an error of the result dtype's precision times 1% of what was summed: any
// lost, doubled or misplaced element costs far more than that.
std::vector<double> sum_slack(const Reduced& r) {
  std::vector<double> slack = r.magnitude;
  for (double& s : slack) s *= 1e-2;
  return slack;
}

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

// ---------------------------------------------------------------------------------------------
// Matmul.

// Naive loops over numpy's matmul semantics: 1-D operands gain a dim that the result drops,
// batch dims broadcast. `magnitude` gets sum_k |a||b| for each result, the scale of its error.
Host host_matmul(const Host& a, const Host& b, std::vector<double>* magnitude) {
  Shape as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t n = as[as.size() - 2], k = as.back(), m = bs.back();
  const Shape batch_a(as.begin(), as.end() - 2), batch_b(bs.begin(), bs.end() - 2);
  const Shape batch = broadcast_of(batch_a, batch_b);
  Shape out_shape = batch;
  if (a.shape.size() >= 2) out_shape.push_back(n);
  if (b.shape.size() >= 2) out_shape.push_back(m);
  // The matrix of an operand that a batch index reads (size-1 batch dims repeat).
  auto matrix_of = [&](const Shape& own, const std::vector<int64_t>& index) {
    int64_t flat = 0;
    for (size_t d = 0; d < own.size(); ++d)
      flat = flat * own[d] + (own[d] == 1 ? 0 : index[d + batch.size() - own.size()]);
    return flat;
  };
  Host out{out_shape, std::vector<double>(count(batch) * n * m)};
  magnitude->assign(out.v.size(), 0);
  for (int64_t bi = 0; bi < count(batch); ++bi) {
    std::vector<int64_t> index = unravel(bi, batch);
    const double* pa = a.v.data() + matrix_of(batch_a, index) * n * k;
    const double* pb = b.v.data() + matrix_of(batch_b, index) * k * m;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        long double acc = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          long double p = static_cast<long double>(pa[i * k + kk]) * pb[kk * m + j];
          acc += p;
          mag += std::fabs(p);
        }
        out.v[(bi * n + i) * m + j] = static_cast<double>(acc);
        (*magnitude)[(bi * n + i) * m + j] = static_cast<double>(mag);
      }
    }
  }
  return out;
}

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

// ---------------------------------------------------------------------------------------------
// Views.

// Distinct values 0.5, 1.5, ... so that any misplaced element shows.
Host iota_host(const Shape& shape) {
  Host h{shape, std::vector<double>(count(shape))};
  for (size_t i = 0; i < h.v.size(); ++i) h.v[i] = static_cast<double>(i) + 0.5;
  return h;
}

TEST(OpsViews, ShapesAndValues) {
  const Host h = iota_host({2, 3, 4});
  const Tensor x = to_tensor(h, kFloat32);
  struct ViewCase {
    const char* name;
    Tensor got;
    Host want;
  };
  const Host col = iota_host({3, 1});
  const Tensor tcol = to_tensor(col, kFloat32);
  const std::vector<ViewCase> cases = {
      {"reshape 4,-1", x.reshape({4, -1}), host_reshape(h, {4, 6})},
      {"reshape -1", x.reshape({-1}), host_reshape(h, {24})},
      {"reshape -1,2,3", x.reshape({-1, 2, 3}), host_reshape(h, {4, 2, 3})},
      {"view 6,4", x.view({6, 4}), host_reshape(h, {6, 4})},
      {"view 2,-1", x.view({2, -1}), host_reshape(h, {2, 12})},
      {"transpose 0,2", x.transpose(0, 2), host_transpose(h, 0, 2)},
      {"transpose -1,-2", x.transpose(-1, -2), host_transpose(h, 1, 2)},
      {"permute 1,2,0", x.permute({1, 2, 0}), host_permute(h, {1, 2, 0})},
      {"permute -1,0,1", x.permute({-1, 0, 1}), host_permute(h, {2, 0, 1})},
      {"unsqueeze 0", x.unsqueeze(0), host_reshape(h, {1, 2, 3, 4})},
      {"unsqueeze -1", x.unsqueeze(-1), host_reshape(h, {2, 3, 4, 1})},
      {"unsqueeze 2", x.unsqueeze(2), host_reshape(h, {2, 3, 1, 4})},
      {"squeeze", x.unsqueeze(0).unsqueeze(2).squeeze(), h},
      {"squeeze 2", x.unsqueeze(2).squeeze(2), h},
      {"squeeze non-1 dim", x.squeeze(1), h},
      {"expand new dims", tcol.expand({2, 3, 4}), host_expand(col, {2, 3, 4})},
      {"expand -1", tcol.expand({-1, 5}), host_expand(col, {3, 5})},
      {"narrow 1,1,2", x.narrow(1, 1, 2), host_narrow(h, 1, 1, 2)},
      {"narrow 2,-3,2", x.narrow(2, -3, 2), host_narrow(h, 2, 1, 2)},
      {"narrow 0,1,1", x.narrow(0, 1, 1), host_narrow(h, 0, 1, 1)},
      {"t 2-D", x.reshape({6, 4}).t(), host_transpose(host_reshape(h, {6, 4}), 0, 1)},
      {"t 1-D", x.reshape({-1}).t(), host_reshape(h, {24})},
      {"expand scalar", scalar_tensor(3.5).expand({2, 3}),
       Host{{2, 3}, std::vector<double>(6, 3.5)}},
  };
  for (const ViewCase& c : cases) expect_matches(c.got, c.want, kFloat32, {}, c.name);
}

TEST(OpsViews, CopiesWhenNoViewExists) {
  const Host h = iota_host({2, 3, 4});
  const Tensor x = to_tensor(h, kFloat32);
  const Tensor xt = x.transpose(0, 2);  // [4, 3, 2], strides [1, 4, 12]
  EXPECT_FALSE(xt.is_contiguous());
  EXPECT_TRUE(x.is_contiguous());
  // reshape of a transposed tensor must copy, and read it in the transposed order.
  expect_matches(xt.reshape({-1}), host_reshape(host_transpose(h, 0, 2), {24}), kFloat32, {},
                 "reshape of transposed");
  expect_matches(xt.reshape({6, 4}), host_reshape(host_transpose(h, 0, 2), {6, 4}), kFloat32, {},
                 "reshape of transposed to 2-D");
  EXPECT_FALSE(xt.reshape({-1}).shares_storage_with(x));
  EXPECT_TRUE(x.reshape({-1}).shares_storage_with(x));
  EXPECT_TRUE(xt.shares_storage_with(x));
  // view cannot copy: PyTorch raises, and so must lazyfuse.
  EXPECT_THROW(xt.view({24}), ShapeError);
  EXPECT_THROW(x.reshape({6, 4}).t().view({24}), ShapeError);
  EXPECT_THROW(x.transpose(0, 1).view({3, 8}), ShapeError);
  EXPECT_THROW(x.narrow(2, 0, 3).view({18}), ShapeError);
  // Views of a non-contiguous tensor that do exist: splitting its contiguous last dim, and
  // keeping the shape.
  expect_matches(x.transpose(0, 1).view({3, 2, 2, 2}),
                 host_reshape(host_transpose(h, 0, 1), {3, 2, 2, 2}), kFloat32, {},
                 "view splitting a dim of a transposed tensor");
  expect_matches(xt.view({4, 3, 2}), host_transpose(h, 0, 2), kFloat32, {}, "view same shape");
  expect_matches(xt.unsqueeze(1).squeeze(1), host_transpose(h, 0, 2), kFloat32, {},
                 "unsqueeze/squeeze of transposed");
  // Whole rows of a narrowed tensor stay contiguous, so this view exists.
  expect_matches(x.narrow(0, 1, 1).view({12}), host_reshape(host_narrow(h, 0, 1, 1), {12}),
                 kFloat32, {}, "view of narrowed rows");
  // Reshape of an expanded tensor copies the repeated values.
  const Host col = iota_host({3, 1});
  expect_matches(to_tensor(col, kFloat32).expand({3, 4}).reshape({12}),
                 host_reshape(host_expand(col, {3, 4}), {12}), kFloat32, {}, "reshape of expand");
  // Chains of views, and views of pending values.
  Host chain = host_expand(
      host_reshape(host_narrow(host_transpose(h, 0, 1), 2, 1, 2), {3, 1, 2, 2}), {3, 5, 2, 2});
  expect_matches(x.transpose(0, 1).narrow(2, 1, 2).unsqueeze(1).expand({3, 5, 2, 2}), chain,
                 kFloat32, {}, "chain of views");
  Host pending =
      host_narrow(host_transpose(ref_unary(h, [](double v) { return v + 1; }), 0, 2), 1, 1, 2);
  expect_matches((x + 1).transpose(0, 2).narrow(1, 1, 2), pending, kFloat32, {},
                 "views of a pending value");
  // Bad views are ShapeErrors.
  EXPECT_THROW(x.reshape({5, -1}), ShapeError);
  EXPECT_THROW(x.narrow(1, 2, 5), ShapeError);
  EXPECT_THROW(x.expand({2, 5, 4}), ShapeError);
  EXPECT_THROW(x.permute({0, 0, 1}), ShapeError);
  EXPECT_THROW(x.transpose(0, 3), ShapeError);
}

TEST(OpsViews, ViewsKeepTheirDTypeOnEveryDType) {
  std::mt19937 rng(13);
  for (DType dtype : kAllDTypes) {
    Host h = random_host(rng, {4, 5, 6}, dtype, kWide);
    Tensor x = to_tensor(h, dtype);
    std::string what = name_of(dtype);
    expect_matches(x.permute({2, 0, 1}).reshape({6, -1}),
                   host_reshape(host_permute(h, {2, 0, 1}), {6, 20}), dtype, {}, what + " permute");
    expect_matches(x.narrow(1, 2, 3).unsqueeze(0).expand({2, 4, 3, 6}),
                   host_expand(host_reshape(host_narrow(h, 1, 2, 3), {1, 4, 3, 6}), {2, 4, 3, 6}),
                   dtype, {}, what + " narrow/expand");
  }
}

// ---------------------------------------------------------------------------------------------
// Fused against unfused evaluation.

// Builds the expression twice from the same inputs, evaluates one copy with fusion off and one
// with it on, and expects the same bits, and fewer kernels when fused. Returns the fused one.
Tensor expect_fusion_invariant(const std::function<Tensor()>& build, const std::string& what) {
  SCOPED_TRACE(what);
  Tensor unfused = build();
  reset_eval_stats();
  eval({unfused}, EvalOptions{.fusion = false});
  int64_t unfused_kernels = eval_stats().kernels;
  Tensor fused = build();
  reset_eval_stats();
  eval({fused}, EvalOptions{.fusion = true});
  int64_t fused_kernels = eval_stats().kernels;
  EXPECT_LT(fused_kernels, unfused_kernels);
  EXPECT_EQ(fused.dtype(), unfused.dtype());
  EXPECT_EQ(fused.sizes(), unfused.sizes());
  std::vector<double> a = unfused.to_vector<double>(), b = fused.to_vector<double>();
  EXPECT_EQ(a.size(), b.size());
  int64_t differ = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0 && differ++ < 3)
      ADD_FAILURE() << "element " << i << ": unfused " << a[i] << ", fused " << b[i];
  }
  EXPECT_EQ(differ, 0) << "elements that differ";
  return fused;
}

double f32(double x) { return static_cast<float>(x); }
double f16(double x) { return quantize(x, DType::Float16); }

TEST(OpsElementwise, FusedAndUnfusedGiveIdenticalBits) {
  std::mt19937 rng(14);
  // float32, broadcasting, a transposed operand, and a chain of transcendental ops.
  Host xb = random_host(rng, {1111, 37}, kFloat32, kWide);
  Host y = random_host(rng, {1111}, kFloat32, kWide);
  Tensor txb = to_tensor(xb, kFloat32), ty = to_tensor(y, kFloat32);
  Host x = host_transpose(xb, 0, 1);
  Tensor got = expect_fusion_invariant(
      [&] {
        Tensor xt = txb.t();
        return (xt * ty + 1.5).sigmoid() * exp(-ty.abs()) - tanh(xt) / (ty.abs() + 1);
      },
      "f32 chain");
  expect_matches(got,
                 ref_map({&x, &y},
                         [](double a, double b, double) {
                           return 1 / (1 + std::exp(-(a * b + 1.5))) * std::exp(-std::fabs(b)) -
                                  std::tanh(a) / (std::fabs(b) + 1);
                         }),
                 kFloat32, tol_for(kFloat32), "f32 chain vs reference");

  // float16: every op rounds to half, fused or not. (x + 1) - x at 2048 must be 0 in half.
  Host h = random_host(rng, {40000}, kFloat16, {-4, 4, 0, 0});
  h.v[0] = 2048;
  Tensor th = to_tensor(h, kFloat16);
  got = expect_fusion_invariant(
      [&] { return ((th + 1) - th) + ((th + 0.5) * th).sin() + th.relu().sqrt(); }, "f16 chain");
  expect_matches(got,
                 ref_unary(h,
                           [](double v) {
                             double a = f16(f16(v + 1) - v);
                             double b = f16(std::sin(f16(f16(v + 0.5) * v)));
                             double c = f16(std::sqrt(v > 0 ? v : 0));
                             return f16(f16(a + b) + c);
                           }),
                 kFloat16, {2e-3, 2e-3}, "f16 chain vs reference");
  Tensor t2048 = full({3}, 2048, kFloat16);
  got = expect_fusion_invariant([&] { return (t2048 + 1) - t2048; }, "f16 2049");
  EXPECT_EQ(got.to_vector<double>(), (std::vector<double>{0, 0, 0}))
      << "2048 + 1 must round to 2048 in float16 before the subtraction";

  // Casts inside a fused kernel: the cast's rounding must not leak into other users of x.
  Host c = random_host(rng, {3000}, kFloat32, {-10, 10, 0, 0});
  Tensor tc = to_tensor(c, kFloat32);
  got = expect_fusion_invariant([&] { return tc.to(kFloat16).to(kFloat32) + tc; }, "cast chain");
  expect_matches(got, ref_unary(c, [](double v) { return f32(f16(v) + v); }), kFloat32, {},
                 "cast chain vs reference");
  got = expect_fusion_invariant([&] { return tc.to(kBFloat16) * 1 + tc.to(kFloat16); },
                                "two casts of one input");
  expect_matches(got,
                 ref_unary(c, [](double v) { return f32(quantize(v, DType::BFloat16) + f16(v)); }),
                 kFloat32, {}, "two casts vs reference");
  got =
      expect_fusion_invariant([&] { return tc.to(kInt32) * 2 + (tc > 0).to(kInt64); }, "int casts");
  expect_matches(got, ref_unary(c, [](double v) { return std::trunc(v) * 2 + (v > 0); }), kInt64,
                 {}, "int casts vs reference");

  // Integers, a comparison and where.
  Host a = random_host(rng, {5, 1200}, kInt32, kWide);
  Host b = random_host(rng, {1200}, kInt64, kWide);
  Tensor ta = to_tensor(a, kInt32), tb = to_tensor(b, kInt64);
  got = expect_fusion_invariant(
      [&] { return where(ta > tb, (ta * tb + 3 - ta).abs().to(kFloat64).sqrt(), tb.to(kFloat64)); },
      "int chain with where");
  expect_matches(
      got,
      ref_map({&a, &b}, [](double p, double q,
                           double) { return p > q ? std::sqrt(std::fabs(p * q + 3 - p)) : q; }),
      kFloat64, tol_for(kFloat64), "int chain vs reference");

  // Generators in the chain: the same seed gives the same numbers fused or not.
  got = expect_fusion_invariant(
      [&] {
        // Separate statements: the order of draws sets each one's Philox offset, and the
        // operands of one expression are evaluated in an unspecified order.
        manual_seed(77);
        Tensor u = rand({4000});
        Tensor g = randn({4000});
        return arange(0., 4000.) * 0.5 + u * 2 - g;
      },
      "generators");
  manual_seed(77);
  Tensor r = rand({4000});
  Tensor n = randn({4000});
  std::vector<double> rv = r.to_vector<double>(), nv = n.to_vector<double>();
  Host want{{4000}, std::vector<double>(4000)};
  for (int i = 0; i < 4000; ++i) want.v[i] = f32(f32(f32(i * 0.5) + f32(rv[i] * 2)) - nv[i]);
  expect_matches(got, want, kFloat32, {}, "generators vs separately drawn");

  // A reduction after a fused producer.
  got = expect_fusion_invariant([&] { return (txb * 2 + 1).exp().sum({0}); }, "reduction");
  Reduced want_sum = host_reduce(ref_unary(xb, [](double v) { return std::exp(v * 2 + 1); }), {0},
                                 false, Reduce::Sum);
  expect_matches(got, want_sum.value, kFloat32, tol_for(kFloat32), "reduction vs reference",
                 sum_slack(want_sum));
}

// ---------------------------------------------------------------------------------------------
// Factories.

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

namespace lazyfuse {
namespace {

// Note [Lane-independent math] in codegen/cpu_math.h: each element's result must not depend
// on its neighbours in a vector. A huge neighbour once moved SLEEF's sin onto its slow argument
// reduction for all eight lanes, changing the small lanes' last bit (found by lazyfuse fuzz as
// a fused/unfused mismatch).
TEST(OpsElementwise, EachElementsResultIgnoresItsNeighbours) {
  // -4.81352711 and 4.73783541 are values whose SLEEF sin differed by an ulp depending on a
  // neighbouring lane of 1e30.
  const std::vector<double> values = {-4.81352711, 1e30, 4.73783541, -2.5, 3.1,  1e-3,
                                      -7e20,       0.2,  5.0,        1.5,  -0.9, 4e10};
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor all = from_vector(values, {static_cast<int64_t>(values.size())}, dtype);
    std::vector<std::vector<double>> together = {
        all.sin().to_vector<double>(), all.cos().to_vector<double>(), all.exp().to_vector<double>(),
        all.tanh().to_vector<double>(), all.abs().log().to_vector<double>()};
    for (size_t i = 0; i < values.size(); ++i) {
      Tensor alone = from_vector({values[i]}, {1}, dtype);
      std::vector<double> separately = {alone.sin().item<double>(), alone.cos().item<double>(),
                                        alone.exp().item<double>(), alone.tanh().item<double>(),
                                        alone.abs().log().item<double>()};
      for (size_t f = 0; f < separately.size(); ++f) {
        EXPECT_TRUE(together[f][i] == separately[f] ||
                    (std::isnan(together[f][i]) && std::isnan(separately[f])))
            << "function " << f << ", element " << i << " (" << values[i] << ") in "
            << dtype_torch_name(dtype);
      }
    }
  }
}

}  // namespace
}  // namespace lazyfuse
