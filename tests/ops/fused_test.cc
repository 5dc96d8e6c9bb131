// Fused against unfused evaluation: the same expressions, evaluated with fusion off and on, must
// give identical bits (and fewer kernels when fused) across float32 chains with broadcasting and
// transposed operands, float16 rounding after every op, casts inside a kernel, integer chains
// with where, seeded generators, and a reduction after a fused producer.
//
// Beyond agreeing with each other, the results are checked against the independent float64
// reference in tests/reference/, which never calls lazyfuse to compute expected values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// A LayerNorm and a softmax in bfloat16, rounding half values only at stores (the default):
// the mean, the centred values and the exponential sums stay float32 between the reduction
// step's parts as inside the GPU's row kernel, so every result lands within about half a unit in
// the last place of float64's, correctly rounded; rounding after every op (the mean to 8 bits)
// costs LayerNorm several units.
TEST(OpsReduction, HalfNormsRoundOnlyWhereStored) {
  constexpr int64_t kRows = 37, kColumns = 1000;
  std::mt19937 rng(23);
  const Host x = random_host(rng, {kRows, kColumns}, kBFloat16, {-2, 3, 0, 0});
  const Host w = random_host(rng, {kColumns}, kBFloat16, {0.5, 1.5, 0, 0});
  const Host b = random_host(rng, {kColumns}, kBFloat16, {-1, 1, 0, 0});
  const std::vector<double> norm = host_layer_norm_rows(x.v, kColumns, w.v, b.v, 1e-5),
                            soft = host_softmax_rows(x.v, kColumns);
  auto units = [](const Tensor& t, const std::vector<double>& want) {
    return bfloat16_ulp_errors(t.to_vector<double>(), want);
  };
  const Tensor tx = to_tensor(x, kBFloat16), tw = to_tensor(w, kBFloat16),
               tb = to_tensor(b, kBFloat16);
  auto layer_norm = [&] { return nn::functional::layer_norm(tx, {kColumns}, tw, tb, 1e-5); };
  {
    HalfRoundingGuard at_stores(HalfRounding::AtStores);
    const auto [largest, mean] = units(layer_norm(), norm);
    EXPECT_LE(largest, 1.0) << "layer_norm";
    EXPECT_LE(mean, 0.3) << "layer_norm";
    const auto [soft_largest, soft_mean] = units(softmax(tx, 1), soft);
    EXPECT_LE(soft_largest, 1.0) << "softmax";
    EXPECT_LE(soft_mean, 0.3) << "softmax";
  }
  HalfRoundingGuard each_op(HalfRounding::EachOp);
  EXPECT_GT(units(layer_norm(), norm).second, 1.0) << "the mean rounded to bfloat16";
}

// Rounding at stores (Note [Half precision in fused kernels] in ir/half_rounding.h; the default): a
// fused half-type chain keeps float32 between its ops and rounds where it stores, closer to
// float64 than rounding after every op; a cast, a comparison or a promotion reads a half value
// as its dtype holds it.
TEST(OpsElementwise, HalfChainsKeepFloat32UntilStored) {
  if (std::getenv("LAZYFUSE_HALF_ROUNDING") == nullptr) {
    EXPECT_EQ(half_rounding(), HalfRounding::AtStores) << "the default";
  }
  HalfRoundingGuard rounding_at_stores(HalfRounding::AtStores);
  std::mt19937 rng(15);
  Host h = random_host(rng, {40000}, kFloat16, {-4, 4, 0, 0});
  h.v[0] = 2048;
  Tensor th = to_tensor(h, kFloat16);
  auto chain = [&] { return ((th + 1) - th) + ((th + 0.5) * th).sin() + th.relu().sqrt(); };
  // float64 throughout, one rounding at the end.
  const Host once = ref_unary(h, [](double v) {
    return f16((v + 1 - v) + std::sin((v + 0.5) * v) + std::sqrt(v > 0 ? v : 0));
  });
  auto worst_error = [&](const Tensor& t) {
    const std::vector<double> got = t.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(got[i] - once.v[i]) / std::max(1.0, std::fabs(once.v[i])));
    return worst;
  };
  Tensor at_stores = chain();
  eval(at_stores);
  EXPECT_EQ(at_stores.to_vector<double>()[0], f16(1 + std::sin(2048.5 * 2048) + std::sqrt(2048.0)))
      << "2048 + 1 - 2048 is 1 in float32";
  // Within a float16 rounding of the result and float32's of the sine's argument (up to 18).
  expect_matches(at_stores, once, kFloat16, {1e-3, 1e-3}, "f16 chain rounded once");
  double each_op_error = 0;
  {
    HalfRoundingGuard each_op(HalfRounding::EachOp);
    Tensor rounded_each_op = chain();
    eval(rounded_each_op);
    each_op_error = worst_error(rounded_each_op);
  }
  EXPECT_LT(worst_error(at_stores), each_op_error / 4);

  // A cast reads the half value as stored: fused and unfused agree, and equal the rounding of
  // each op in float64.
  Host c = random_host(rng, {3000}, kFloat32, {-10, 10, 0, 0});
  Tensor tc = to_tensor(c, kFloat32);
  auto cast_chain = [&] { return (tc.to(kBFloat16) * 3).to(kFloat32) + tc; };
  Tensor fused = cast_chain(), unfused = cast_chain();
  eval(fused);
  eval({unfused}, EvalOptions{.fusion = false});
  EXPECT_EQ(fused.to_vector<double>(), unfused.to_vector<double>());
  expect_matches(
      fused,
      ref_unary(c,
                [](double v) {
                  return f32(quantize(quantize(v, DType::BFloat16) * 3, DType::BFloat16) + v);
                }),
      kFloat32, {}, "cast of a bfloat16 product");

  // A comparison reads a half value as stored: a product compared in the same kernel with its
  // own cast (which rounds) is equal to it everywhere.
  Tensor tripled = th * 3;
  Tensor same = tripled == tripled.to(kFloat32);
  eval(same);
  const std::vector<double> equal = same.to_vector<double>();
  EXPECT_EQ(std::count(equal.begin(), equal.end(), 1.0), static_cast<int64_t>(equal.size()));

  // argmax compares each value with the rounded maximum, and so finds the first position of
  // the maximum of the stored products.
  Tensor a = to_tensor(random_host(rng, {64, 300}, kBFloat16, {-3, 3, 0, 0}), kBFloat16);
  Tensor b = to_tensor(random_host(rng, {64, 300}, kBFloat16, {-3, 3, 0, 0}), kBFloat16);
  Tensor products = a * b;
  Tensor fused_argmax = argmax(products, 1);
  eval(fused_argmax);
  eval(products);  // stored, so rounded
  const std::vector<double> stored = products.to_vector<double>();
  std::vector<int64_t> want(64);
  for (int64_t r = 0; r < 64; ++r)
    want[static_cast<size_t>(r)] =
        std::max_element(stored.begin() + r * 300, stored.begin() + (r + 1) * 300) -
        (stored.begin() + r * 300);
  EXPECT_EQ(fused_argmax.to_vector<int64_t>(), want);
}

TEST(OpsElementwise, FusedAndUnfusedGiveIdenticalBits) {
  // Half types round after every op here, as PyTorch eager does: fused gives unfused's bits.
  HalfRoundingGuard each_op(HalfRounding::EachOp);
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

// The CPU runs an elementwise program a block of kCpuBlock elements at a time, over tasks of
// 16384 elements: its constants are computed once per task in registers no other value takes, and
// an op whose result is stored as computed writes into the result where the block is whole vectors
// (a last block of 7 is not), past the caches where the result is large. Sizes that end in a
// partial block, values stored and read again, and a result written into the buffer of the value
// it replaces (an in-place update) all keep fused and unfused equal and both right.
TEST(OpsElementwise, ConstantsAndStoresHoldOverBlocksAndTasks) {
  std::mt19937 rng(31);
  const int64_t n = 3 * 16 * 1024 + 1000 + 7;
  Host x = random_host(rng, {n}, kFloat32, {-2, 2, 0, 0});
  Tensor tx = to_tensor(x, kFloat32);
  auto f32 = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  // Six constants, more registers than the chain needs at once, a stored value read again.
  auto build = [&] {
    Tensor a = tx * 3 + 1;
    return ((a * 0.5 - 0.25).exp() + a * 2 - 7) * 1.5;
  };
  Tensor got = expect_fusion_invariant(build, "constants over blocks");
  Host want{{n}, std::vector<double>(n)};
  for (int64_t i = 0; i < n; ++i) {
    const double a = f32(f32(x.v[i] * 3) + 1);
    const double e = f32(std::exp(f32(f32(a * 0.5) - 0.25)));
    want.v[i] = f32(f32(f32(e + f32(a * 2)) - 7) * 1.5);
  }
  expect_matches(got, want, kFloat32, tol_for(kFloat32), "constants over blocks vs reference");

  // Two outputs of one program, one of them read by the other.
  Tensor a = tx * 3 + 1, b = (a * a).exp();
  eval({a, b});
  Host want_a{{n}, std::vector<double>(n)}, want_b{{n}, std::vector<double>(n)};
  for (int64_t i = 0; i < n; ++i) {
    want_a.v[i] = f32(f32(x.v[i] * 3) + 1);
    want_b.v[i] = f32(std::exp(f32(want_a.v[i] * want_a.v[i])));
  }
  expect_matches(a, want_a, kFloat32, {}, "stored and read again");
  expect_matches(b, want_b, kFloat32, tol_for(kFloat32), "its reader");

  // An in-place update, evaluated twice so that the second writes into its own buffer.
  Tensor p = to_tensor(x, kFloat32), g = to_tensor(x, kFloat32);
  Host want_p = x;
  for (int step = 0; step < 2; ++step) {
    p.mul_(0.5).add_(g * 0.25 + 1);
    reset_eval_stats();
    eval(p);
    if (step == 1) EXPECT_EQ(eval_stats().in_place_outputs, 1);
    for (int64_t i = 0; i < n; ++i)
      want_p.v[i] = f32(f32(want_p.v[i] * 0.5) + f32(f32(x.v[i] * 0.25) + 1));
  }
  expect_matches(p, want_p, kFloat32, {}, "in place");

  // A result past worth_streaming (codegen/cpu/cpu_program.h) is written with non-temporal stores,
  // except its last, partial block; one of its two outputs is also read again by the other.
  const int64_t large = (int64_t{1} << 22) + 7;
  Host xl = random_host(rng, {large}, kFloat32, {-2, 2, 0, 0});
  Tensor txl = to_tensor(xl, kFloat32);
  Tensor streamed = expect_fusion_invariant([&] { return (txl * 3 + 1).exp() * 0.5; }, "streamed");
  Tensor al = txl * 3 + 1, bl = al * 0.5 + al;
  eval({al, bl});
  Host want_l{{large}, std::vector<double>(large)}, want_al = want_l, want_bl = want_l;
  for (int64_t i = 0; i < large; ++i) {
    want_al.v[i] = f32(f32(xl.v[i] * 3) + 1);
    want_l.v[i] = f32(f32(std::exp(want_al.v[i])) * 0.5);
    want_bl.v[i] = f32(f32(want_al.v[i] * 0.5) + want_al.v[i]);
  }
  expect_matches(streamed, want_l, kFloat32, tol_for(kFloat32), "streamed vs reference");
  expect_matches(al, want_al, kFloat32, {}, "streamed and read again");
  expect_matches(bl, want_bl, kFloat32, {}, "its reader, streamed");
}

// A CPU reduction combines each block of 2^15 elements of a row in 16 accumulators by position
// (element j into accumulator j % 16), then those in a fixed tree: its bits depend on the values
// alone, not on whether they come as one contiguous run, as strided runs of 13 (a narrowed
// view read in place), or as a fused producer's blocks.
TEST(OpsReduction, CpuSumsDependOnTheValuesNotTheirLayout) {
  std::mt19937 rng(32);
  Host base = random_host(rng, {5000, 20}, kFloat32, {-1, 1, 0, 0});
  // Values whose sum in float64 depends on its order: exp gives them every bit of mantissa.
  for (double& v : base.v) v = std::exp(v);
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(name_of(dtype));
    Tensor wide = to_tensor(base, kFloat64).to(dtype);
    eval(wide);
    Tensor strided = wide.narrow(1, 3, 13);  // runs of 13, contiguous within each
    Tensor contiguous = strided.contiguous();
    eval(contiguous);
    std::vector<Tensor> sums = {strided.sum(), contiguous.sum(), (contiguous * 1).sum(),
                                strided.max(), contiguous.max(), (contiguous + 0).max()};
    // Unfused, the reductions of the view read it through its strides.
    eval({sums[0], sums[3]}, EvalOptions{.fusion = false});
    eval(sums);
    for (int k : {1, 2}) {
      EXPECT_EQ(sums[0].item<double>(), sums[k].item<double>()) << "sum " << k;
      EXPECT_EQ(sums[3].item<double>(), sums[3 + k].item<double>()) << "max " << k;
    }
    Reduced want = host_reduce(host_narrow(base, 1, 3, 13), {}, false, Reduce::Sum);
    expect_matches(sums[0], want.value, dtype, tol_for(dtype), "sum vs reference", sum_slack(want));
  }
}

// The CPU runs a row step (softmax, LayerNorm) a block of rows at a time, every part of the
// step on one block before the next (Note [Row blocks] in runtime/cpu/cpu_backend.cc): the same
// bits as one kernel per op, and right, with a last block of fewer rows, rows of 1000 (16 rows a
// block) and of 33 (496 rows a block).
TEST(OpsReduction, RowStepsInBlocksOfRows) {
  std::mt19937 rng(33);
  for (auto [rows, columns] : {std::pair<int64_t, int64_t>{70, 1000}, {1500, 33}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(columns));
    Host x = random_host(rng, {rows, columns}, kFloat32, {-4, 4, 0, 0});
    Tensor tx = to_tensor(x, kFloat32);
    Tensor got = expect_fusion_invariant([&] { return softmax(tx, 1); }, "softmax");
    expect_matches(got, Host{{rows, columns}, host_softmax_rows(x.v, columns)}, kFloat32,
                   tol_for(kFloat32), "softmax vs reference");
    got = expect_fusion_invariant(
        [&] {
          Tensor mean = tx.mean({1}, true), centred = tx - mean;
          return centred * ((centred * centred).mean({1}, true) + 1e-5).rsqrt() * 2 + 1;
        },
        "layer norm");
    std::vector<double> want = host_layer_norm_rows(x.v, columns, std::vector<double>(columns, 2),
                                                    std::vector<double>(columns, 1), 1e-5);
    expect_matches(got, Host{{rows, columns}, want}, kFloat32, tol_for(kFloat32),
                   "layer norm vs reference");
  }
}

}  // namespace
}  // namespace lazyfuse
