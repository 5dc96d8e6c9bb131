// Attention written by hand (Note [Attention written by hand] in frontend/attention_pattern.cc):
// each spelling becomes one attention node, and its result and the gradients of q, k and v
// equal those of the same code run as written (fused attention off), in float64, and in
// float32 to float32's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t B = 2, H = 3, T = 37, S = 37, E = 16;

// Attention written as its matmuls and softmax, as written.
class FusedAttentionOff : public nn::functional::FusedAttentionGuard {
 public:
  FusedAttentionOff() : FusedAttentionGuard(false) {}
};

// A hand-written attention from q [B, H, T, E], k [B, H, S, E], v [B, H, S, E].
using Spelling = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)>;

// Query positions [T, 1] and key positions [1, S].
Tensor rows() { return arange(T).unsqueeze(1); }
Tensor columns() { return arange(S).unsqueeze(0); }

struct Run {
  std::string fused_ir;
  std::vector<std::vector<double>> values;  // the result, then the gradients of q, k, v
};
Run run(const Spelling& spelling, DType dtype) {
  manual_seed(5);
  std::vector<Tensor> in = {randn({B, H, T, E}, kFloat64), randn({B, H, S, E}, kFloat64),
                            randn({B, H, S, E}, kFloat64)};
  const Tensor g = randn({B, H, T, E}, kFloat64).to(dtype);
  for (Tensor& t : in) t = t.to(dtype).detach().requires_grad_();
  const Tensor out = spelling(in[0], in[1], in[2]);
  Run r;
  r.fused_ir = out.fused_ir();
  (out * g).sum().backward();
  r.values = {out.to_vector<double>(), in[0].grad().to_vector<double>(),
              in[1].grad().to_vector<double>(), in[2].grad().to_vector<double>()};
  return r;
}

// The result and gradients of `got` within `dtype`'s tolerance of `want`'s.
void expect_near(const Run& got, const Run& want, DType dtype) {
  const double tolerance = dtype == kFloat64 ? 1e-12 : 2e-5;
  ASSERT_EQ(got.values.size(), want.values.size());
  for (size_t i = 0; i < want.values.size(); ++i)
    for (size_t j = 0; j < want.values[i].size(); ++j)
      ASSERT_NEAR(got.values[i][j], want.values[i][j],
                  tolerance * std::max(1.0, std::fabs(want.values[i][j])))
          << dtype << (i == 0 ? " result" : " gradient of operand ") << i << ", element " << j;
}

// The spelling is one attention node, and matches itself run as written.
void expect_fused_and_equal(const std::string& name, const Spelling& spelling) {
  SCOPED_TRACE(name);
  Run want;
  {
    const FusedAttentionOff off;
    want = run(spelling, kFloat64);
    EXPECT_EQ(want.fused_ir.find("attention"), std::string::npos);
  }
  for (DType dtype : {kFloat64, kFloat32}) {
    const Run got = run(spelling, dtype);
    EXPECT_NE(got.fused_ir.find("= attention "), std::string::npos) << got.fused_ir;
    EXPECT_EQ(got.fused_ir.find("matmul"), std::string::npos) << got.fused_ir;
    expect_near(got, want, dtype);
  }
}

TEST(AttentionPattern, EachSpellingIsOneAttentionNodeWithTheSameValues) {
  const double scale = 1 / std::sqrt(double(E));
  expect_fused_and_equal("softmax of scaled scores, a causal where",
                         [&](auto& q, auto& k, auto& v) {
                           const Tensor scores = q.matmul(k.transpose(-2, -1)) * scale;
                           return softmax(where(rows() >= columns(), scores, -kInf), -1).matmul(v);
                         });
  expect_fused_and_equal(
      "masked_fill of the future, scores divided", [&](auto& q, auto& k, auto& v) {
        const Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(E));
        return softmax(scores.masked_fill(columns() > rows(), -kInf), -1).matmul(v);
      });
  expect_fused_and_equal("max, sub, exp, sum, div; a padding mask", [&](auto& q, auto& k, auto& v) {
    const Tensor padding = arange(S).reshape({1, 1, 1, S}) >= 30;  // keys 30.. are padding
    const Tensor scores = (q.matmul(k.transpose(-2, -1)) * scale).masked_fill(padding, -kInf);
    const Tensor e = (scores - scores.amax({-1}, true)).exp();
    return (e / e.sum({-1}, true)).matmul(v);
  });
  expect_fused_and_equal("an added relative-position bias", [&](auto& q, auto& k, auto& v) {
    const Tensor bias = (rows() - columns()).to(q.dtype()).abs() * -0.1;  // ALiBi-like
    return softmax(q.matmul(k.transpose(-2, -1)) * scale + bias, -1).matmul(v);
  });
  expect_fused_and_equal("a tanh soft-cap, then causal", [&](auto& q, auto& k, auto& v) {
    const Tensor capped = (q.matmul(k.transpose(-2, -1)) * scale / 2.0).tanh() * 2.0;
    return softmax(where(rows() >= columns(), capped, -kInf), -1).matmul(v);
  });
  expect_fused_and_equal("exp over its sum, no maximum", [&](auto& q, auto& k, auto& v) {
    const Tensor e = (q.matmul(k.transpose(-2, -1)) * scale).exp();
    return (e / e.sum({-1}, true)).matmul(v);
  });
  expect_fused_and_equal(
      "scaled_dot_product_attention's own composite", [&](auto& q, auto& k, auto& v) {
        return nn::functional::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
      });
}

// On the GPU the same spelling is the same node, run by the GPU's kernels.
TEST(AttentionPattern, OnTheGpuToo) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  manual_seed(4);
  const Tensor q = randn({B, H, T, E}, kFloat64), k = randn({B, H, S, E}, kFloat64),
               v = randn({B, H, S, E}, kFloat64);
  auto spelled = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    const Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(E));
    const Device device = q.device();
    const Tensor future = arange(S, TensorOptions(kInt64).device(device)).unsqueeze(0) >
                          arange(T, TensorOptions(kInt64).device(device)).unsqueeze(1);
    return softmax(scores.masked_fill(future, -kInf), -1).matmul(v);
  };
  std::vector<double> want;
  {
    const FusedAttentionOff off;
    want = spelled(q, k, v).to_vector<double>();
  }
  const Device gpu("cuda:0");
  const Tensor got =
      spelled(q.to(kFloat32).to(gpu), k.to(kFloat32).to(gpu), v.to(kFloat32).to(gpu));
  EXPECT_NE(got.fused_ir().find("= attention "), std::string::npos) << got.fused_ir();
  const std::vector<double> values = got.cpu().to_vector<double>();
  ASSERT_EQ(values.size(), want.size());
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_NEAR(values[i], want[i], 2e-5 * std::max(1.0, std::fabs(want[i]))) << i;
}

// Scores that are also returned are computed apart; the product is still one attention node.
// Dropout written after the softmax (nn::functional::dropout) joins the node, which takes the
// rand's draw: the same probabilities dropped as the written-out form drops, in each dtype (whose
// draws take that dtype's bits), forward and gradients; causal, and a masked fill.
TEST(AttentionPattern, DropoutAfterTheSoftmaxJoinsTheNodeWithItsDraws) {
  const Spelling dropped = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    const Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(E));
    const Tensor masked = scores.masked_fill(columns() > rows(), -kInf);
    return nn::functional::dropout(softmax(masked, -1), 0.3).matmul(v);
  };
  for (DType dtype : {kFloat64, kFloat32}) {
    lazyfuse::Run want;
    {
      const FusedAttentionOff off;
      want = run(dropped, dtype);
      EXPECT_EQ(want.fused_ir.find("attention"), std::string::npos);
    }
    const lazyfuse::Run got = run(dropped, dtype);
    EXPECT_NE(got.fused_ir.find("= attention "), std::string::npos) << got.fused_ir;
    EXPECT_NE(got.fused_ir.find("dropout = 0.3"), std::string::npos) << got.fused_ir;
    EXPECT_EQ(got.fused_ir.find("= rand "), std::string::npos) << got.fused_ir;
    expect_near(got, want, dtype);
  }
}

TEST(AttentionPattern, WeightsUsedElsewhereAreStillRight) {
  manual_seed(3);
  const Tensor q = randn({1, 2, 9, 8}, kFloat64), k = randn({1, 2, 9, 8}, kFloat64),
               v = randn({1, 2, 9, 8}, kFloat64);
  const Tensor weights = softmax(q.matmul(k.transpose(-2, -1)), -1);
  const Tensor out = weights.matmul(v);
  EXPECT_NE(out.fused_ir().find("= attention "), std::string::npos);
  const std::vector<double> got = out.to_vector<double>();
  std::vector<double> want;
  {
    const FusedAttentionOff off;  // the product as written, of the weights computed
    want = matmul(weights, v).to_vector<double>();
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12);
}

// What the node does not compute exactly as written stays a product: a fill other than
// -infinity (a fully masked row would differ), a bias that needs its own gradient.
TEST(AttentionPattern, WhatItDoesNotTakeStaysAProduct) {
  const Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 5, 8}), v = randn({1, 2, 5, 8});
  const Tensor scores = q.matmul(k.transpose(-2, -1));
  EXPECT_EQ(
      softmax(scores.masked_fill(columns().narrow(1, 0, 5) > rows().narrow(0, 0, 5), -1e9), -1)
          .matmul(v)
          .fused_ir()
          .find("attention"),
      std::string::npos);
  const Tensor bias = randn({5, 5}).requires_grad_();
  EXPECT_EQ(softmax(scores + bias, -1).matmul(v).fused_ir().find("attention"), std::string::npos);
  EXPECT_EQ(softmax(scores, 0).matmul(v).fused_ir().find("attention"), std::string::npos);
  EXPECT_EQ(softmax(scores + bias.detach().to(kBool), -1).matmul(v).fused_ir().find("attention"),
            std::string::npos)
      << "a bias of another dtype than the scores'";
}

// Where the node would not give the gradients the code as written gives, it is not made: a
// detached denominator or numerator, scores that retain their gradient, a leaf in the chain.
TEST(AttentionPattern, WhatWouldChangeAGradientStaysAProduct) {
  const Tensor q = randn({1, 2, 5, 8}).requires_grad_(), k = randn({1, 2, 5, 8}),
               v = randn({1, 2, 5, 8});
  auto fused = [](const Tensor& out) {
    return out.fused_ir().find("= attention ") != std::string::npos;
  };
  const Tensor scores = q.matmul(k.transpose(-2, -1));
  const Tensor e = (scores - scores.amax({-1}, true)).exp();
  EXPECT_TRUE(fused((e / e.sum({-1}, true)).matmul(v)));
  EXPECT_FALSE(fused((e / e.sum({-1}, true).detach()).matmul(v)));
  EXPECT_FALSE(fused((e.detach() / e.sum({-1}, true)).matmul(v)));
  Tensor kept = q.matmul(k.transpose(-2, -1));
  kept.retain_grad();
  EXPECT_FALSE(fused(softmax(kept, -1).matmul(v)));
  const Tensor leaf = q.matmul(k.transpose(-2, -1)).detach().requires_grad_();
  EXPECT_FALSE(fused(softmax(leaf * 0.5, -1).matmul(v)));
}

// A gradient of fused attention's gradients is a GradError, not a silent zero.
TEST(AttentionPattern, ASecondDerivativeIsAGradError) {
  const Tensor q = randn({1, 1, 4, 8}).requires_grad_(), k = randn({1, 1, 4, 8}),
               v = randn({1, 1, 4, 8});
  const Tensor out = nn::functional::scaled_dot_product_attention(q, k, v);
  const std::vector<Tensor> dq = grad({out.sum()}, {q}, {}, std::nullopt, /*create_graph=*/true);
  EXPECT_THROW(dq[0].sum().backward(), GradError);
}

}  // namespace
}  // namespace lazyfuse
