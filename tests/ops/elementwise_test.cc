// Differential tests of lazyfuse's elementwise ops: every unary and binary op over all dtypes,
// broadcasting, strided views and sizes that cross the CPU's block (1024) and task (16384)
// boundaries; scalar operands on either side; PyTorch's type promotion; comparisons, clamp,
// where and NaN propagation; casts between all dtypes; and lane-independent vector math.
//
// Expected values come from the independent float64 reference in tests/reference/, which never
// calls lazyfuse to compute them, so a mistake shared by lazyfuse's kernels cannot also hide in
// the expected values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lazyfuse/lazyfuse.h"
#include "tests/reference/reference.h"

namespace lazyfuse {
namespace {

// The expected values and their vocabulary (Host, ref_map, random_host, expect_matches, ...)
// come from the independent float64 reference.
using namespace reference;

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

// Multiples of 0.5 in a narrow range, so that comparisons and maximum/minimum meet ties.
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

// Note [Lane-independent math] in codegen/cpu/cpu_math.h: each element's result must not depend
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
