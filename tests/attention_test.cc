// nn::functional::scaled_dot_product_attention against a float64 attention written here, loop
// by loop: forward over masks, causal, GQA, scales and dropout; gradients against central
// differences; bad input as typed errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "lazyfuse/lazyfuse.h"
#include "tests/gradcheck.h"

namespace lazyfuse {
namespace {

using nn::functional::scaled_dot_product_attention;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> random_values(int64_t n, uint32_t seed, double lo = -1.5, double hi = 1.5) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

// The shapes of one case: query [B, H, L, E], key and value [B, Hkv, S, E] and [B, Hkv, S, Ev].
struct Dims {
  int64_t b, h, hkv, l, s, e, ev;
};

// Attention in float64, one query row at a time. `bias(b, h, i, j)` is added to each score
// (-inf for a key the query does not see); `keep(b, h, i, j)` scales a weight after the
// softmax (dropout's mask over 1 - p), 1 without dropout. A row that sees no key gives zeros.
template <typename Bias, typename Keep>
std::vector<double> reference(const Dims& d, const std::vector<double>& q,
                              const std::vector<double>& k, const std::vector<double>& v,
                              double scale, Bias bias, Keep keep) {
  std::vector<double> out(static_cast<size_t>(d.b * d.h * d.l * d.ev), 0.0);
  const int64_t groups = d.h / d.hkv;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.h; ++h) {
      const int64_t kh = h / groups;
      for (int64_t i = 0; i < d.l; ++i) {
        std::vector<double> scores(static_cast<size_t>(d.s));
        double top = -kInf;
        for (int64_t j = 0; j < d.s; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < d.e; ++x)
            dot +=
                q[((b * d.h + h) * d.l + i) * d.e + x] * k[((b * d.hkv + kh) * d.s + j) * d.e + x];
          scores[j] = dot * scale + bias(b, h, i, j);
          top = std::max(top, scores[j]);
        }
        if (top == -kInf) continue;
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - top));
        for (int64_t j = 0; j < d.s; ++j) {
          const double weight = scores[j] / total * keep(b, h, i, j);
          for (int64_t y = 0; y < d.ev; ++y)
            out[((b * d.h + h) * d.l + i) * d.ev + y] +=
                weight * v[((b * d.hkv + kh) * d.s + j) * d.ev + y];
        }
      }
    }
  return out;
}

auto no_bias = [](int64_t, int64_t, int64_t, int64_t) { return 0.0; };
auto keep_all = [](int64_t, int64_t, int64_t, int64_t) { return 1.0; };

struct Operands {
  Tensor q, k, v;
  std::vector<double> qs, ks, vs;  // as the tensors hold them
};
Operands operands(const Dims& d, DType dtype, uint32_t seed) {
  const TensorOptions options(dtype);
  Operands o;
  o.q = from_vector(random_values(d.b * d.h * d.l * d.e, seed), {d.b, d.h, d.l, d.e}, options);
  o.k = from_vector(random_values(d.b * d.hkv * d.s * d.e, seed + 1), {d.b, d.hkv, d.s, d.e},
                    options);
  o.v = from_vector(random_values(d.b * d.hkv * d.s * d.ev, seed + 2), {d.b, d.hkv, d.s, d.ev},
                    options);
  o.qs = o.q.to_vector<double>();
  o.ks = o.k.to_vector<double>();
  o.vs = o.v.to_vector<double>();
  return o;
}

void expect_near(const Tensor& got, const std::vector<double>& want, double tolerance) {
  const std::vector<double> values = got.to_vector<double>();
  ASSERT_EQ(values.size(), want.size());
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_NEAR(values[i], want[i], tolerance * std::max(1.0, std::fabs(want[i])))
        << "element " << i;
}

double tolerance(DType dtype) { return dtype == kFloat64 ? 1e-12 : 2e-6; }

TEST(Attention, PlainAndScaledMatchFloat64) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Dims& d :
         {Dims{2, 3, 3, 5, 7, 16, 16}, Dims{1, 2, 2, 1, 1, 8, 4}, Dims{1, 1, 1, 33, 65, 64, 32}}) {
      SCOPED_TRACE(testing::Message() << dtype << " L " << d.l << " S " << d.s << " E " << d.e);
      const Operands o = operands(d, dtype, 11);
      expect_near(scaled_dot_product_attention(o.q, o.k, o.v),
                  reference(d, o.qs, o.ks, o.vs, 1 / std::sqrt(double(d.e)), no_bias, keep_all),
                  tolerance(dtype));
      expect_near(scaled_dot_product_attention(o.q, o.k, o.v, {}, 0.0, false, 0.3),
                  reference(d, o.qs, o.ks, o.vs, 0.3, no_bias, keep_all), tolerance(dtype));
    }
  }
}

// is_causal: query i sees keys 0..i, the mask's top left corner also where L != S.
TEST(Attention, CausalMatchesFloat64) {
  for (const Dims& d :
       {Dims{2, 2, 2, 9, 9, 16, 16}, Dims{1, 2, 2, 4, 6, 8, 8}, Dims{1, 1, 1, 6, 4, 8, 8}}) {
    SCOPED_TRACE(testing::Message() << "L " << d.l << " S " << d.s);
    const Operands o = operands(d, kFloat64, 12);
    auto causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i ? 0.0 : -kInf; };
    expect_near(scaled_dot_product_attention(o.q, o.k, o.v, {}, 0.0, true),
                reference(d, o.qs, o.ks, o.vs, 1 / std::sqrt(double(d.e)), causal, keep_all),
                1e-12);
  }
}

// A bool mask [L, S] broadcast over batch and heads, with a row that sees no key (zeros, as
// PyTorch's math backend gives); an additive float mask [B, 1, L, S] broadcast over heads.
TEST(Attention, MasksMatchFloat64) {
  const Dims d{2, 3, 3, 5, 6, 8, 8};
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(testing::Message() << dtype);
    const Operands o = operands(d, dtype, 13);
    std::vector<double> seen(d.l * d.s);
    for (int64_t i = 0; i < d.l; ++i)
      for (int64_t j = 0; j < d.s; ++j) seen[i * d.s + j] = i != 2 && (i + j) % 3 != 0;
    const Tensor bool_mask = from_vector(seen, {d.l, d.s}).to(kBool);
    auto by_bool = [&](int64_t, int64_t, int64_t i, int64_t j) {
      return seen[i * d.s + j] != 0 ? 0.0 : -kInf;
    };
    const double scale = 1 / std::sqrt(double(d.e));
    const Tensor masked = scaled_dot_product_attention(o.q, o.k, o.v, bool_mask);
    expect_near(masked, reference(d, o.qs, o.ks, o.vs, scale, by_bool, keep_all), tolerance(dtype));
    for (double x : masked.narrow(2, 2, 1).to_vector<double>()) EXPECT_EQ(x, 0.0);

    const Tensor float_mask =
        from_vector(random_values(d.b * d.l * d.s, 14, -2, 2), {d.b, 1, d.l, d.s}, dtype);
    const std::vector<double> added = float_mask.to_vector<double>();
    auto by_float = [&](int64_t b, int64_t, int64_t i, int64_t j) {
      return added[(b * d.l + i) * d.s + j];
    };
    expect_near(scaled_dot_product_attention(o.q, o.k, o.v, float_mask),
                reference(d, o.qs, o.ks, o.vs, scale, by_float, keep_all), tolerance(dtype));
  }
}

// Grouped-query attention: key and value heads each shared by consecutive query heads.
TEST(Attention, GroupedQueryHeadsMatchFloat64) {
  const Dims d{2, 6, 2, 5, 7, 8, 4};
  const Operands o = operands(d, kFloat64, 15);
  expect_near(
      scaled_dot_product_attention(o.q, o.k, o.v, {}, 0.0, true, std::nullopt, true),
      reference(
          d, o.qs, o.ks, o.vs, 1 / std::sqrt(double(d.e)),
          [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i ? 0.0 : -kInf; }, keep_all),
      1e-12);
}

// Dropout draws from lazyfuse's random stream: after the same seed, a rand over the weights'
// shape draws the same mask, which the reference applies.
TEST(Attention, DropoutIsTheSeedsMask) {
  const Dims d{1, 2, 2, 4, 5, 8, 8};
  const Operands o = operands(d, kFloat64, 16);
  manual_seed(7);
  const Tensor got = scaled_dot_product_attention(o.q, o.k, o.v, {}, 0.25);
  const std::vector<double> values = got.to_vector<double>();
  manual_seed(7);
  const std::vector<double> draws = rand({d.b, d.h, d.l, d.s}, kFloat64).to_vector<double>();
  auto keep = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return draws[((b * d.h + h) * d.l + i) * d.s + j] >= 0.25 ? 1 / 0.75 : 0.0;
  };
  expect_near(got, reference(d, o.qs, o.ks, o.vs, 1 / std::sqrt(double(d.e)), no_bias, keep),
              1e-12);
  manual_seed(7);
  EXPECT_EQ(scaled_dot_product_attention(o.q, o.k, o.v, {}, 0.25).to_vector<double>(), values);
}

TEST(Attention, GradientsMatchCentralDifferences) {
  using testing_gradcheck::gradcheck;
  const Shape q{2, 4, 5, 8}, kv{2, 2, 6, 8}, same{2, 4, 6, 8};
  gradcheck("plain",
            [](const std::vector<Tensor>& in) {
              return scaled_dot_product_attention(in[0], in[1], in[2]);
            },
            {q, same, same});
  gradcheck("causal",
            [](const std::vector<Tensor>& in) {
              return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, true);
            },
            {q, same, same});
  gradcheck("grouped, causal, scaled",
            [](const std::vector<Tensor>& in) {
              return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, true, 0.5, true);
            },
            {q, kv, kv});
  gradcheck("an additive mask, itself differentiated",
            [](const std::vector<Tensor>& in) {
              return scaled_dot_product_attention(in[0], in[1], in[2], in[3]);
            },
            {q, same, same, Shape{5, 6}});
}

TEST(Attention, BadInputIsATypedErrorNamingTheShapes) {
  const Tensor q = zeros({2, 4, 5, 8}), k = zeros({2, 4, 6, 8}), v = zeros({2, 4, 6, 8});
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THROW(scaled_dot_product_attention(q, zeros({2, 4, 6, 7}), v), ShapeError);
  EXPECT_NE(message_of([&] {
              scaled_dot_product_attention(q, zeros({2, 4, 6, 7}), v);
            }).find("[2, 4, 6, 7]"),
            std::string::npos);
  EXPECT_THROW(scaled_dot_product_attention(q, k, zeros({2, 4, 5, 8})), ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(q, zeros({2, 3, 6, 8}), zeros({2, 3, 6, 8}), {}, 0.0,
                                            false, std::nullopt, true),
               ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, zeros({3, 6}).to(kBool)), ShapeError);
  EXPECT_THROW(scaled_dot_product_attention(q, k.to(kFloat64), v), DTypeError);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, zeros({5, 6}, kFloat64)), DTypeError);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, zeros({5, 6}).to(kBool), 0.0, true),
               ValueError);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {}, 1.0), ValueError);
  EXPECT_THROW(scaled_dot_product_attention(zeros({8}), k, v), ShapeError);
}

// ---- The fused form: one attention step (Note [Attention] in ir/attention.cc) ----

using nn::functional::FusedAttentionGuard;

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A fused-form case's inputs: its operands (from `seed`), the result's cotangent (`seed + 1`),
// and its mask by kind: 2 a bool mask [L, S], 3 an additive bias [B, 1, L, S], else none (1 is
// causal).
struct CaseInputs {
  Operands o;
  Tensor g, mask;
};
CaseInputs case_inputs(const Dims& d, int mask, uint32_t seed) {
  CaseInputs in{
      operands(d, kFloat64, seed),
      from_vector(random_values(d.b * d.h * d.l * d.ev, seed + 1), {d.b, d.h, d.l, d.ev}, kFloat64),
      Tensor()};
  if (mask == 2) in.mask = rand({d.l, d.s}, kFloat64) > 0.3;
  if (mask == 3) in.mask = randn({d.b, 1, d.l, d.s}, kFloat64);
  return in;
}

// The result and the gradients of q, k and v (from the cotangent g) of one case, its operands
// converted to `dtype` on `device`, fused or as the composite graph; with `dropout`, from one
// seed, so that both forms draw the same mask.
std::vector<Tensor> attention_and_gradients(const Dims& d, const Operands& o, const Tensor& mask,
                                            bool causal, const Tensor& g, DType dtype,
                                            const Device& device, bool fused, double dropout = 0) {
  const FusedAttentionGuard setting(fused);
  manual_seed(1234);
  std::vector<Tensor> in;
  for (const Tensor* t : {&o.q, &o.k, &o.v})
    in.push_back(t->to(dtype).to(device).detach().requires_grad_());
  Tensor m = mask.defined() && mask.dtype() != kBool ? mask.to(dtype) : mask;
  if (m.defined()) m = m.to(device);
  const Tensor out = scaled_dot_product_attention(in[0], in[1], in[2], m, dropout, causal,
                                                  std::nullopt, d.h != d.hkv);
  EXPECT_EQ(count_of(out.fused_ir(), "= attention "), fused ? 1 : 0);
  (out * g.to(dtype).to(device)).sum().backward();
  return {out, in[0].grad(), in[1].grad(), in[2].grad()};
}

TEST(FusedAttention, IsOneStepForwardAndOneBackward) {
  const Tensor q = randn({2, 4, 40, 16}).requires_grad_();
  const Tensor k = randn({2, 2, 70, 16}).requires_grad_();
  const Tensor v = randn({2, 2, 70, 16}).requires_grad_();
  const Tensor out =
      scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, /*enable_gqa=*/true);
  // One node (a step of one node prints as the node).
  EXPECT_EQ(count_of(out.fused_ir(), "= attention "), 1) << out.fused_ir();
  EXPECT_EQ(count_of(out.fused_ir(), "matmul"), 0) << out.fused_ir();
  (out * out).sum().backward();
  // The gradients of q, k and v: one attention step, after the forward's (with its logsumexp).
  const std::string backward = fused_ir({q.grad(), k.grad(), v.grad()});
  EXPECT_EQ(count_of(backward, "kernel attention"), 2) << backward;
  EXPECT_EQ(count_of(backward, "attention_lse"), 1) << backward;
  EXPECT_EQ(count_of(backward, "attention_grad_"), 3) << backward;
  {
    const FusedAttentionGuard composite(false);
    const Tensor unfused = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), {}, 0.0,
                                                        true, std::nullopt, true);
    EXPECT_EQ(count_of(unfused.fused_ir(), "attention"), 0);
  }
}

// Head dims 16 to 256 and lengths from 1 to past a block of queries (32) and of keys (64), odd
// ones included, each mask kind and grouped heads: the forward against float64 loops, in float32
// and the half types.
TEST(FusedAttention, MatchesFloat64OverHeadDimsLengthsAndMasks) {
  struct Case {
    Dims d;
    int mask;  // 0 none, 1 causal, 2 a bool mask, 3 an additive bias
  };
  const std::vector<Case> cases = {
      {{1, 2, 2, 1, 1, 16, 16}, 0},     {{1, 2, 1, 33, 65, 32, 16}, 1},
      {{2, 2, 2, 70, 97, 64, 64}, 2},   {{1, 4, 2, 37, 131, 128, 128}, 3},
      {{1, 2, 2, 65, 65, 256, 256}, 1}, {{1, 3, 1, 97, 33, 80, 48}, 2},
      {{1, 1, 1, 130, 7, 16, 8}, 1}};
  for (const Case& c : cases) {
    const Dims& d = c.d;
    for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
      SCOPED_TRACE(testing::Message()
                   << dtype << " L " << d.l << " S " << d.s << " E " << d.e << " mask " << c.mask);
      const Operands o = operands(d, dtype, 21);
      std::vector<double> seen(d.l * d.s), added;
      for (int64_t i = 0; i < d.l; ++i)
        for (int64_t j = 0; j < d.s; ++j) seen[i * d.s + j] = (i * 7 + j * 3) % 5 != 0 && i != 3;
      Tensor mask;
      if (c.mask == 2) mask = from_vector(seen, {d.l, d.s}).to(kBool);
      if (c.mask == 3) {
        mask = from_vector(random_values(d.h * d.l * d.s, 22, -2, 2), {d.h, d.l, d.s}, dtype);
        added = mask.to_vector<double>();
      }
      auto bias = [&](int64_t, int64_t h, int64_t i, int64_t j) {
        if (c.mask == 1) return j <= i ? 0.0 : -kInf;
        if (c.mask == 2) return seen[i * d.s + j] != 0 ? 0.0 : -kInf;
        if (c.mask == 3) return added[(h * d.l + i) * d.s + j];
        return 0.0;
      };
      const Tensor got = scaled_dot_product_attention(o.q, o.k, o.v, mask, 0.0, c.mask == 1,
                                                      std::nullopt, d.h != d.hkv);
      ASSERT_EQ(count_of(got.fused_ir(), "= attention "), 1);
      expect_near(got, reference(d, o.qs, o.ks, o.vs, 1 / std::sqrt(double(d.e)), bias, keep_all),
                  dtype == kFloat32    ? 2e-6
                  : dtype == kBFloat16 ? 1.6e-2
                                       : 2e-3);
    }
  }
}

// The gradients of q, k and v, and the forward, against the composite graph's in float64 (an
// independent path: autograd through matmuls and the softmax), with every mask kind, grouped
// heads and lengths past a block; the fused form in float64 and float32.
TEST(FusedAttention, GradientsMatchTheCompositeGraphInFloat64) {
  struct Case {
    Dims d;
    int mask;
  };
  const std::vector<Case> cases = {{{2, 2, 2, 5, 7, 16, 16}, 0},
                                   {{1, 4, 2, 70, 67, 32, 24}, 1},
                                   {{1, 2, 1, 33, 129, 16, 16}, 2},
                                   {{2, 2, 2, 40, 41, 64, 64}, 3}};
  for (const Case& c : cases) {
    const Dims& d = c.d;
    const auto [o, g, mask] = case_inputs(d, c.mask, 31);
    auto gradients = [&](DType dtype, bool fused) {
      return attention_and_gradients(d, o, mask, c.mask == 1, g, dtype, Device::cpu(), fused);
    };
    const std::vector<Tensor> want = gradients(kFloat64, false);
    for (DType dtype : {kFloat64, kFloat32}) {
      const std::vector<Tensor> got = gradients(dtype, true);
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE(testing::Message()
                     << dtype << " L " << d.l << " S " << d.s << " mask " << c.mask
                     << (i == 0 ? " out" : " grad of operand ") << (i == 0 ? 0 : i - 1));
        expect_near(got[i], want[i].to_vector<double>(), dtype == kFloat64 ? 1e-12 : 2e-5);
      }
    }
  }
}

// On the GPU (Note [Attention on the GPU]): the forward and the gradients of q, k and v of
// each dtype, over head dims 16 to 256, odd lengths past a tile, every mask kind and grouped
// heads (with lengths of several tiles, whose inner tiles take no mask), against the composite
// graph in float64 on the CPU; with dropout, against the composite graph in the case's dtype on
// the CPU, which draws the mask the GPU's kernels draw.
TEST(FusedAttention, MatchesTheCompositeGraphOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    Dims d;
    int mask;  // 0 none, 1 causal, 2 a bool mask, 3 an additive bias
    DType dtype;
    double dropout = 0;  // against the composite graph in `dtype`, which draws the same mask
  };
  const std::vector<Case> cases = {{{2, 2, 2, 5, 7, 16, 16}, 0, kFloat32},
                                   {{1, 4, 2, 70, 67, 32, 24}, 1, kFloat32},
                                   {{1, 2, 1, 33, 129, 64, 64}, 2, kBFloat16},
                                   {{2, 2, 2, 40, 41, 128, 128}, 3, kFloat16},
                                   {{1, 2, 2, 65, 65, 256, 256}, 1, kBFloat16},
                                   {{1, 3, 1, 97, 33, 80, 48}, 2, kFloat64},
                                   {{1, 1, 1, 1, 1, 16, 16}, 0, kFloat16},
                                   {{2, 4, 4, 130, 130, 64, 64}, 1, kFloat32},
                                   {{1, 2, 2, 70, 67, 64, 64}, 1, kBFloat16, 0.2},
                                   // Tiles no mask or end reaches, on tensor cores.
                                   {{2, 2, 1, 200, 150, 64, 64}, 0, kBFloat16},
                                   {{1, 2, 2, 256, 256, 64, 64}, 1, kFloat16},
                                   {{1, 2, 1, 160, 160, 128, 128}, 1, kBFloat16},
                                   {{1, 2, 2, 70, 200, 64, 64}, 1, kBFloat16},
                                   {{1, 4, 2, 33, 40, 32, 24}, 2, kFloat32, 0.3}};
  const Device gpu("cuda:0");
  for (const Case& c : cases) {
    const Dims& d = c.d;
    const auto [o, g, mask] = case_inputs(d, c.mask, 41);
    auto gradients = [&](DType dtype, const Device& device, bool fused) {
      return attention_and_gradients(d, o, mask, c.mask == 1, g, dtype, device, fused, c.dropout);
    };
    const std::vector<Tensor> want =
        gradients(c.dropout > 0 ? c.dtype : kFloat64, Device::cpu(), false);
    const std::vector<Tensor> got = gradients(c.dtype, gpu, true);
    const double tolerance = c.dtype == kFloat64   ? 1e-12
                             : c.dtype == kFloat32 ? 2e-5
                             : c.dtype == kFloat16 ? 4e-3
                                                   : 3e-2;
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(testing::Message()
                   << c.dtype << " L " << d.l << " S " << d.s << " E " << d.e << " mask " << c.mask
                   << (i == 0 ? " out" : " grad ") << (i == 0 ? 0 : i - 1));
      // Half types to a tolerance of the tensor's largest magnitude.
      const std::vector<double> expected = want[i].to_vector<double>();
      double largest = 1;
      for (double x : expected) largest = std::max(largest, std::fabs(x));
      const std::vector<double> values = got[i].cpu().to_vector<double>();
      ASSERT_EQ(values.size(), expected.size());
      for (size_t j = 0; j < values.size(); ++j)
        ASSERT_NEAR(
            values[j], expected[j],
            tolerance * (is_half(c.dtype) ? largest : std::max(1.0, std::fabs(expected[j]))))
            << "element " << j;
    }
  }
}

// The step holds no [T, S] scores: at T = S = 4096 (64 MB of float32 scores a head) the peak
// over a forward and backward is the operands, results and gradients, a few hundred KB each,
// where the composite graph's holds the scores and the weights.
TEST(FusedAttention, PeakMemoryIsLinearInTheLength) {
  const Device cpu("cpu");
  const int64_t t = 4096, d = 16;
  auto peak_of = [&](bool fused) {
    const FusedAttentionGuard setting(fused);
    Tensor q = randn({1, 1, t, d}), k = randn({1, 1, t, d}), v = randn({1, 1, t, d});
    eval({q, k, v});
    for (Tensor* x : {&q, &k, &v}) x->requires_grad_();
    reset_peak_memory_stats();
    const int64_t before = memory_stats(cpu).allocated_bytes;
    const Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, true);
    out.sum().backward();
    eval({q.grad(), k.grad(), v.grad()});
    return memory_stats(cpu).peak_bytes - before;
  };
  const int64_t operand = t * d * 4, scores = t * t * 4;
  const int64_t fused = peak_of(true);
  EXPECT_LT(fused, 16 * operand) << "fused attention held " << fused << " bytes";
  EXPECT_GT(peak_of(false), scores) << "the composite graph should hold the scores";
}

// A bias that needs its own gradient is the composite graph's: still right.
TEST(FusedAttention, WhatTheFusedFormDoesNotTakeRunsComposite) {
  const Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 6, 8}), v = randn({1, 2, 6, 8});
  const Tensor bias = randn({5, 6}).requires_grad_();
  const Tensor out = scaled_dot_product_attention(q, k, v, bias);
  EXPECT_EQ(count_of(out.fused_ir(), "= attention "), 0);
  out.sum().backward();
  EXPECT_TRUE(bias.grad().defined());
}

// Dropout inside the step drops what the composite graph's dropout drops after the same seed
// (Note [Attention]): the forward and the gradients of q, k and v against the composite graph's
// in the same dtype (whose draws take that dtype's bits), with a causal or bool mask, grouped
// heads and lengths past a block; and a second seed drops others.
TEST(FusedAttention, DropoutDropsWhatTheCompositeGraphDrops) {
  struct Case {
    Dims d;
    int mask;
    double p;
  };
  const std::vector<Case> cases = {{{2, 4, 2, 33, 70, 16, 16}, 1, 0.2},
                                   {{1, 2, 2, 5, 130, 32, 24}, 2, 0.5},
                                   {{1, 1, 1, 66, 66, 16, 8}, 0, 0.1}};
  for (const Case& c : cases) {
    const Dims& d = c.d;
    const auto [o, g, mask] = case_inputs(d, c.mask, 51);
    for (DType dtype : {kFloat64, kFloat32}) {
      auto gradients = [&](bool fused) {
        return attention_and_gradients(d, o, mask, c.mask == 1, g, dtype, Device::cpu(), fused,
                                       c.p);
      };
      const std::vector<Tensor> want = gradients(false), got = gradients(true);
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE(testing::Message()
                     << dtype << " L " << d.l << " S " << d.s << " mask " << c.mask << " p " << c.p
                     << (i == 0 ? " out" : " grad of operand ") << (i == 0 ? 0 : i - 1));
        expect_near(got[i], want[i].to_vector<double>(), dtype == kFloat64 ? 1e-12 : 2e-5);
      }
    }
  }
  // The step says it drops; another seed, another mask.
  const Tensor q = randn({1, 2, 8, 16}), k = randn({1, 2, 8, 16}), v = randn({1, 2, 8, 16});
  manual_seed(1);
  const Tensor first = scaled_dot_product_attention(q, k, v, {}, 0.5);
  EXPECT_EQ(count_of(first.fused_ir(), "dropout = 0.5"), 1) << first.fused_ir();
  manual_seed(2);
  const Tensor second = scaled_dot_product_attention(q, k, v, {}, 0.5);
  EXPECT_NE(first.to_vector<double>(), second.to_vector<double>());
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// nn::MultiheadAttention against the same attention written in float64 loops from its
// parameters: projections, heads, masks true where not attended, the heads' average weights.
TEST(Attention, MultiheadAttentionMatchesFloat64) {
  constexpr int64_t L = 4, S = 5, N = 2, E = 8, H = 2, D = E / H;
  nn::MultiheadAttention mha(E, H);
  std::vector<std::string> names;
  for (const auto& [name, p] : mha.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                             "out_proj.bias"}));
  // Biases drawn too (they start at zero), so that the test sees each used.
  mha.in_proj_bias() = from_vector(random_values(3 * E, 20), {3 * E}).requires_grad_();
  mha.out_proj().bias() = from_vector(random_values(E, 21), {E}).requires_grad_();
  const std::vector<double> w_in = mha.in_proj_weight().to_vector<double>(),
                            b_in = mha.in_proj_bias().to_vector<double>(),
                            w_out = mha.out_proj().weight().to_vector<double>(),
                            b_out = mha.out_proj().bias().to_vector<double>();
  const Tensor query = from_vector(random_values(L * N * E, 22), {L, N, E}),
               key = from_vector(random_values(S * N * E, 23), {S, N, E}),
               value = from_vector(random_values(S * N * E, 24), {S, N, E});
  const std::vector<double> qs = query.to_vector<double>(), ks = key.to_vector<double>(),
                            vs = value.to_vector<double>();
  // x [T, N, E] projected by part `part` of in_proj: [T][N][E].
  auto project = [&](const std::vector<double>& x, int64_t t_len, int64_t part) {
    std::vector<double> out(t_len * N * E);
    for (int64_t t = 0; t < t_len * N; ++t)
      for (int64_t o = 0; o < E; ++o) {
        double acc = b_in[part * E + o];
        for (int64_t i = 0; i < E; ++i) acc += w_in[(part * E + o) * E + i] * x[t * E + i];
        out[t * E + o] = acc;
      }
    return out;
  };
  const std::vector<double> pq = project(qs, L, 0), pk = project(ks, S, 1), pv = project(vs, S, 2);
  // Output [L, N, E] and averaged weights [N, L, S]; `hidden(n, i, j)` marks what is not seen.
  auto reference_mha = [&](auto hidden) {
    std::vector<double> merged(L * N * E, 0), weights(N * L * S, 0), out(L * N * E);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i) {
          std::vector<double> w(S);
          double top = -kInf, total = 0;
          for (int64_t j = 0; j < S; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d)
              dot += pq[(i * N + n) * E + h * D + d] * pk[(j * N + n) * E + h * D + d];
            w[j] = hidden(n, i, j) ? -kInf : dot / std::sqrt(double(D));
            top = std::max(top, w[j]);
          }
          for (double& x : w) total += (x = std::exp(x - top));
          for (int64_t j = 0; j < S; ++j) {
            weights[(n * L + i) * S + j] += w[j] / total / H;
            for (int64_t d = 0; d < D; ++d)
              merged[(i * N + n) * E + h * D + d] += w[j] / total * pv[(j * N + n) * E + h * D + d];
          }
        }
    for (int64_t t = 0; t < L * N; ++t)
      for (int64_t o = 0; o < E; ++o) {
        double acc = b_out[o];
        for (int64_t i = 0; i < E; ++i) acc += w_out[o * E + i] * merged[t * E + i];
        out[t * E + o] = acc;
      }
    return std::pair{out, weights};
  };
  {
    SCOPED_TRACE("no mask");
    const auto [want, want_weights] =
        reference_mha([](int64_t, int64_t, int64_t) { return false; });
    const auto [got, got_weights] = mha.forward(query, key, value);
    expect_near(got, want, 2e-6);
    expect_near(got_weights, want_weights, 2e-6);
    const auto [fused, none] = mha.forward(query, key, value, {}, /*need_weights=*/false);
    expect_near(fused, want, 2e-6);
    EXPECT_FALSE(none.defined());
  }
  {
    SCOPED_TRACE("key padding and a causal mask");
    std::vector<double> padding(N * S, 0), above(L * S, 0);
    padding[0 * S + 4] = padding[1 * S + 3] = 1;
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) above[i * S + j] = j > i;
    const Tensor key_padding = from_vector(padding, {N, S}).to(kBool),
                 causal = from_vector(above, {L, S}).to(kBool);
    const auto [want, want_weights] = reference_mha([&](int64_t n, int64_t i, int64_t j) {
      return padding[n * S + j] != 0 || above[i * S + j] != 0;
    });
    const auto [got, got_weights] = mha.forward(query, key, value, key_padding, true, causal);
    expect_near(got, want, 2e-6);
    expect_near(got_weights, want_weights, 2e-6);
    const auto [fused, none] = mha.forward(query, key, value, key_padding, false, causal);
    expect_near(fused, want, 2e-6);
  }
  EXPECT_THROW(nn::MultiheadAttention(10, 3), ShapeError);
  EXPECT_THROW(mha.forward(query, key, value, zeros({N, S + 1}).to(kBool)), ShapeError);
  EXPECT_THROW(mha.forward(query, key, value, {}, true, zeros({L, S + 1}).to(kBool)), ShapeError);
}

}  // namespace
}  // namespace lazyfuse
