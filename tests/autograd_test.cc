// Gradients of every differentiable op against float64 central differences (a gradcheck), on
// the CPU and, where one exists, the GPU; and autograd's API, its errors and in-place updates.
//
// The reference is numerical: d/dx_j sum(f(x) * v) by central differences of the forward pass
// in float64, for a random cotangent v. The forward ops themselves are checked against the
// independent float64 reference in tests/ops/, so the analytic gradients here are checked
// against something the gradient code never touches.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "lazyfuse/lazyfuse.h"
#include "tests/gradcheck.h"

namespace lazyfuse {
namespace {

using namespace testing_gradcheck;

struct Case {
  std::string name;
  Fn f;
  std::vector<Shape> shapes;
  Domain domain = {};
};

// How an attention's K^T is spelled.
enum KSpelling {
  kTransposeDims,
  kTransposeNegative,
  kPermuteLastTwo,
  kContiguousFirst,
  kPermuteFromRows
};
const std::vector<Shape> kAttentionShapes = {{2, 4, 6}, {6, 6}, {6, 6}, {6, 6}};

// x [B, T, C] and the query, key and value weights [C, C]: a causal attention's output,
// [B, T, C], heads split and merged by reshapes and transposes.
Tensor attention(const std::vector<Tensor>& x, KSpelling spelling) {
  const int64_t B = 2, T = 4, H = 2, hd = 3, C = H * hd;
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, hd}).transpose(1, 2); };
  const Tensor q = heads(matmul(x[0], x[1])), v = heads(matmul(x[0], x[3]));
  const Tensor k_rows = matmul(x[0], x[2]);
  Tensor k_t;
  switch (spelling) {
    case kTransposeDims:
      k_t = heads(k_rows).transpose(2, 3);
      break;
    case kTransposeNegative:
      k_t = heads(k_rows).transpose(-2, -1);
      break;
    case kPermuteLastTwo:
      k_t = heads(k_rows).permute({0, 1, 3, 2});
      break;
    case kContiguousFirst:
      k_t = heads(k_rows).contiguous().transpose(2, 3);
      break;
    case kPermuteFromRows:
      k_t = k_rows.reshape({B, T, H, hd}).permute({0, 2, 3, 1});
      break;
  }
  const Tensor positions = arange(T, TensorOptions(kInt64).device(x[0].device()));
  const Tensor future = positions.reshape({1, T}) > positions.reshape({T, 1});
  const Tensor scores = where(future, -1e9, q.matmul(k_t) * (1.0 / std::sqrt(double(hd))));
  return softmax(scores, -1).matmul(v).transpose(1, 2).contiguous().reshape({B, T, C});
}

std::vector<Case> cases() {
  const Domain positive{0.3, 2.0};
  const Domain away_from_zero{-2, 2, 0.2};
  return {
      // Elementwise, unary.
      {"neg", [](auto& x) { return -x[0]; }, {{2, 3}}},
      {"abs", [](auto& x) { return x[0].abs(); }, {{2, 3}}, away_from_zero},
      {"exp", [](auto& x) { return x[0].exp(); }, {{2, 3}}},
      {"log", [](auto& x) { return x[0].log(); }, {{2, 3}}, positive},
      {"sqrt", [](auto& x) { return x[0].sqrt(); }, {{2, 3}}, positive},
      {"rsqrt", [](auto& x) { return x[0].rsqrt(); }, {{2, 3}}, positive},
      {"sin", [](auto& x) { return x[0].sin(); }, {{2, 3}}},
      {"cos", [](auto& x) { return x[0].cos(); }, {{2, 3}}},
      {"tanh", [](auto& x) { return x[0].tanh(); }, {{2, 3}}},
      {"sigmoid", [](auto& x) { return x[0].sigmoid(); }, {{2, 3}}},
      {"relu", [](auto& x) { return x[0].relu(); }, {{2, 3}}, away_from_zero},
      {"clamp", [](auto& x) { return x[0].clamp(-0.5, 0.7); }, {{3, 4}}},
      {"clamp_min", [](auto& x) { return x[0].clamp_min(0.1); }, {{3, 4}}},
      {"clamp_max", [](auto& x) { return x[0].clamp_max(0.1); }, {{3, 4}}},
      {"pow scalar", [](auto& x) { return x[0].pow(3); }, {{2, 3}}},
      {"pow fractional", [](auto& x) { return x[0].pow(2.5); }, {{2, 3}}, positive},
      {"cast", [](auto& x) { return x[0].to(kFloat64) * 2; }, {{4}}},
      // Elementwise, binary and ternary, broadcasting.
      {"add", [](auto& x) { return x[0] + x[1]; }, {{2, 3}, {3}}},
      {"sub", [](auto& x) { return x[0] - x[1]; }, {{2, 1}, {1, 3}}},
      {"mul", [](auto& x) { return x[0] * x[1]; }, {{2, 3}, {2, 1}}},
      {"div", [](auto& x) { return x[0] / x[1]; }, {{2, 3}, {3}}, away_from_zero},
      {"scalar ops", [](auto& x) { return 2 - x[0] / 3 + 1.5 * x[0]; }, {{5}}},
      {"pow tensor", [](auto& x) { return x[0].pow(x[1]); }, {{2, 3}, {3}}, positive},
      {"maximum", [](auto& x) { return maximum(x[0], x[1]); }, {{2, 3}, {2, 3}}},
      {"minimum", [](auto& x) { return minimum(x[0], x[1]); }, {{2, 3}, {3}}},
      {"clamp tensors", [](auto& x) { return x[0].clamp(x[1], x[1] + 1.0); }, {{3, 4}, {4}}},
      {"where", [](auto& x) { return where(x[0] > 0, x[0] * 2, x[1].exp()); }, {{2, 3}, {3}}},
      // Reductions.
      {"sum", [](auto& x) { return x[0].sum(); }, {{2, 3}}},
      {"sum dim", [](auto& x) { return x[0].sum({1}); }, {{2, 3, 2}}},
      {"sum dims keepdim",
       [](auto& x) {
         return x[0].sum({0, 2}, true);
       },
       {{2, 3, 2}}},
      {"mean", [](auto& x) { return x[0].mean(); }, {{2, 3}}},
      {"mean keepdim", [](auto& x) { return x[0].mean({-1}, true); }, {{2, 3}}},
      {"max", [](auto& x) { return x[0].max(); }, {{2, 3}}},
      {"max dim", [](auto& x) { return x[0].max(1); }, {{3, 4}}},
      {"min dim keepdim", [](auto& x) { return x[0].min(0, true); }, {{3, 4}}},
      // Matmul, with 1-d operands and batch broadcasting as PyTorch defines them.
      {"matmul", [](auto& x) { return matmul(x[0], x[1]); }, {{3, 4}, {4, 2}}},
      {"matmul vector-matrix", [](auto& x) { return matmul(x[0], x[1]); }, {{4}, {4, 2}}},
      {"matmul matrix-vector", [](auto& x) { return matmul(x[0], x[1]); }, {{3, 4}, {4}}},
      {"matmul dot", [](auto& x) { return matmul(x[0], x[1]); }, {{4}, {4}}},
      {"matmul batched", [](auto& x) { return matmul(x[0], x[1]); }, {{2, 3, 4}, {2, 4, 2}}},
      {"matmul broadcast", [](auto& x) { return matmul(x[0], x[1]); }, {{2, 1, 3, 4}, {3, 4, 2}}},
      {"matmul transposed", [](auto& x) { return matmul(x[0].t(), x[1]); }, {{4, 3}, {4, 2}}},
      // Views.
      {"reshape",
       [](auto& x) {
         return x[0].reshape({3, 2}) * x[1];
       },
       {{2, 3}, {2}}},
      {"view -1", [](auto& x) { return x[0].view({-1}).exp(); }, {{2, 3}}},
      {"permute",
       [](auto& x) {
         return x[0].permute({2, 0, 1}) * x[1];
       },
       {{2, 3, 4}, {4, 1, 3}}},
      {"transpose", [](auto& x) { return x[0].transpose(0, 1).sin(); }, {{2, 3}}},
      {"unsqueeze squeeze", [](auto& x) { return x[0].unsqueeze(1).squeeze() * 2; }, {{3}}},
      {"expand",
       [](auto& x) {
         return x[0].expand({2, 3, 4}) * x[1];
       },
       {{3, 1}, {2, 3, 4}}},
      {"contiguous of transposed", [](auto& x) { return x[0].t().contiguous().exp(); }, {{2, 3}}},
      // narrow's gradient is g between zeros (a cat); more narrow and index ops in
      // tests/ops/index_test.cc.
      {"narrow", [](auto& x) { return x[0].narrow(1, 1, 2) * x[1]; }, {{3, 4}, {2}}},
      {"narrow negative start", [](auto& x) { return x[0].narrow(0, -2, 1).exp(); }, {{3, 2}}},
      {"narrow twice", [](auto& x) { return x[0].narrow(0, 1, 2) + x[0].narrow(0, 0, 2); }, {{3}}},
      // Parts' gradients summed as one cat (Note [The gradients of narrowed parts]): a split,
      // and parts with a gap, an overlap, a whole-dim part and a use of the whole.
      {"chunk three ways",
       [](auto& x) {
         const std::vector<Tensor> parts = x[0].chunk(3, 1);
         return parts[0] * parts[1] + parts[2].exp();
       },
       {{2, 9}}},
      {"narrows with a gap and an overlap",
       [](auto& x) {
         return x[0].narrow(1, 0, 2) + x[0].narrow(1, 3, 2) * x[0].narrow(1, 4, 2) +
                x[0].sum({1}, true) + x[0].narrow(0, 0, 3).narrow(1, 1, 2);
       },
       {{3, 6}}},
      // One tensor used many times, through views and in fused chains.
      {"repeated use", [](auto& x) { return x[0] * x[0] + x[0].exp() * x[0]; }, {{5}}},
      {"use through two views",
       [](auto& x) {
         return x[0].t() * x[0].reshape({3, 2});
       },
       {{2, 3}}},
      {"walkthrough", [](auto& x) { return (x[0] + 2).exp() * x[1]; }, {{3}, {3}}},
      {"softmax by hand",
       [](auto& x) {
         Tensor e = (x[0] - x[0].max(1, true)).exp();
         return e / e.sum({1}, true);
       },
       {{3, 5}}},
      // Ops and compositions that models use.
      {"log1p", [](auto& x) { return x[0].log1p(); }, {{2, 3}}, positive},
      {"expm1", [](auto& x) { return x[0].expm1(); }, {{2, 3}}},
      {"erf", [](auto& x) { return x[0].erf(); }, {{2, 3}}},
      {"softmax", [](auto& x) { return softmax(x[0], 1); }, {{3, 4}}},
      {"log_softmax dim 0", [](auto& x) { return log_softmax(x[0], 0); }, {{3, 4}}},
      {"logsumexp",
       [](auto& x) {
         return logsumexp(x[0], {0, 2});
       },
       {{2, 3, 2}}},
      {"gelu", [](auto& x) { return nn::functional::gelu(x[0]); }, {{2, 3}}},
      {"gelu tanh", [](auto& x) { return nn::functional::gelu(x[0], "tanh"); }, {{2, 3}}},
      {"layer_norm",
       [](auto& x) { return nn::functional::layer_norm(x[0], {4}, x[1], x[2]); },
       {{3, 4}, {4}, {4}}},
      {"mse_loss", [](auto& x) { return nn::functional::mse_loss(x[0], x[1]); }, {{3, 2}, {3, 2}}},
      {"cross_entropy",
       [](auto& x) {
         return nn::functional::cross_entropy(
             x[0], tensor({2, 0, 1, 2}, TensorOptions(kInt64).device(x[0].device())));
       },
       {{4, 3}}},
      {"binary_cross_entropy_with_logits",
       [](auto& x) {
         return nn::functional::binary_cross_entropy_with_logits(x[0], x[1].sigmoid());
       },
       {{5}, {5}}},
      // Causal self-attention as nanoGPT writes it (B 2, T 4, H 2, hd 3), with K transposed
      // each way a model author spells it. Its backward once failed to evaluate: a rewrite
      // changed a product's layout under a reshape the frontend had built as a view of it.
      {"attention k.transpose(2, 3)", [](auto& x) { return attention(x, kTransposeDims); },
       kAttentionShapes},
      {"attention k.transpose(-2, -1)", [](auto& x) { return attention(x, kTransposeNegative); },
       kAttentionShapes},
      {"attention k.permute", [](auto& x) { return attention(x, kPermuteLastTwo); },
       kAttentionShapes},
      {"attention k.contiguous().transpose", [](auto& x) { return attention(x, kContiguousFirst); },
       kAttentionShapes},
      {"attention permute to kT", [](auto& x) { return attention(x, kPermuteFromRows); },
       kAttentionShapes},
      {"mlp layer",
       [](auto& x) { return (matmul(x[0], x[1].t()) + x[2]).relu().sum({1}).tanh(); },
       {{4, 3}, {5, 3}, {5}}},
  };
}

class Gradcheck : public testing::TestWithParam<Case> {};

TEST_P(Gradcheck, MatchesCentralDifferencesOnTheCpu) {
  const Case& c = GetParam();
  gradcheck(c.name, c.f, c.shapes, Device::cpu(), c.domain);
}

// Named Cuda* so that it runs where the GPU tests run (tests/CMakeLists.txt).
class CudaGradcheck : public Gradcheck {};
TEST_P(CudaGradcheck, MatchesCentralDifferencesOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  const Case& c = GetParam();
  gradcheck(c.name, c.f, c.shapes, Device("cuda:0"), c.domain);
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string name;
  for (char ch : info.param.name) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}
INSTANTIATE_TEST_SUITE_P(Ops, Gradcheck, testing::ValuesIn(cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Ops, CudaGradcheck, testing::ValuesIn(cases()), case_name);

// float32 gradients agree with float64's within float32's precision.
TEST(Autograd, Float32GradientsAgreeWithFloat64) {
  std::mt19937 rng(7);
  std::vector<double> xs = draw(12, {-1, 1}, rng), ws = draw(12, {-1, 1}, rng);
  auto gradients = [&](DType dtype) {
    Tensor x = from_vector(xs, {4, 3}, dtype).requires_grad_();
    Tensor w = from_vector(ws, {3, 4}, dtype).requires_grad_();
    Tensor loss = (matmul(x, w).tanh() * x.sum({1}, true)).sigmoid().mean();
    return grad({loss}, {x, w});
  };
  std::vector<Tensor> single = gradients(kFloat32), wide = gradients(kFloat64);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(single[i].dtype(), kFloat32);
    std::vector<double> s = single[i].to_vector<double>(), d = wide[i].to_vector<double>();
    for (size_t j = 0; j < s.size(); ++j) EXPECT_NEAR(s[j], d[j], 1e-6 + 1e-5 * std::abs(d[j]));
  }
}

// ---- Conventions at kinks and ties, as PyTorch's ----

std::vector<double> grad_of(const Tensor& x, const Tensor& y) {
  return grad({y.sum()}, {x})[0].to_vector<double>();
}

// A tensor read in three parts gets its gradient as one cat of the parts' gradients, with no
// addition of zeros: the IR of the gradient has one cat and no add, and a part's -0 stays -0,
// as in PyTorch's split backward.
TEST(Autograd, APartsGradientsAreOneCat) {
  const std::vector<double> values = {0.5, -1.25, 2.0, 0.75, -0.5, 1.5, 0.25,  -2.0, 1.0,
                                      3.0, -0.25, 0.1, -1.5, 0.2,  2.5, -0.75, 0.4,  -3.0};
  Tensor x = from_vector(values, {2, 9}, kFloat64).requires_grad_();
  const std::vector<Tensor> parts = x.chunk(3, 1);
  (parts[0] * -0.0 + parts[1].exp() + parts[2].sin()).sum().backward();
  const std::string ir = x.grad().ir();
  auto count = [&](const std::string& op) {
    size_t n = 0;
    for (size_t at = ir.find("= " + op + " "); at != std::string::npos;
         at = ir.find("= " + op + " ", at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("cat"), 1u) << ir;
  EXPECT_EQ(count("add"), 0u) << ir;
  const std::vector<double> got = x.grad().to_vector<double>();
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 9; ++c) {
      const double v = values[r * 9 + c], g = got[r * 9 + c];
      if (c < 3) {
        EXPECT_EQ(g, 0.0) << r << ", " << c;
        EXPECT_TRUE(std::signbit(g)) << "the part's -0 at " << r << ", " << c;
      } else if (c < 6) {
        EXPECT_DOUBLE_EQ(g, std::exp(v)) << r << ", " << c;
      } else {
        EXPECT_DOUBLE_EQ(g, std::cos(v)) << r << ", " << c;
      }
    }
  }
}

TEST(Autograd, KinksFollowPyTorch) {
  Tensor x = tensor({-1.0, 0.0, 2.0}, kFloat64).requires_grad_();
  EXPECT_EQ(grad_of(x, x.relu()), (std::vector<double>{0, 0, 1}));
  EXPECT_EQ(grad_of(x, x.abs()), (std::vector<double>{-1, 0, 1}));
  EXPECT_EQ(grad_of(x, x.clamp(0.0, 2.0)), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(grad_of(x, x.clamp_min(0.0)), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(grad_of(x, x.clamp_max(0.0)), (std::vector<double>{1, 1, 0}));
  std::vector<double> sqrt_grad = grad_of(x, (x * x).sqrt());  // d sqrt(u) at u = 0 is inf
  EXPECT_TRUE(std::isnan(sqrt_grad[1]));                       // inf * 0, as in PyTorch
  Tensor z = tensor({0.0, 4.0}, kFloat64).requires_grad_();
  EXPECT_EQ(grad_of(z, z.sqrt())[0], INFINITY);
  // pow: d/dx x^0 is 0 even at 0; d/dy 0^y is 0 for y >= 0.
  Tensor base = tensor({0.0, 2.0}, kFloat64).requires_grad_();
  EXPECT_EQ(grad_of(base, base.pow(0)), (std::vector<double>{0, 0}));
  Tensor exponent = tensor({2.0, 3.0}, kFloat64).requires_grad_();
  std::vector<double> dy = grad_of(exponent, tensor({0.0, 2.0}, kFloat64).pow(exponent));
  EXPECT_EQ(dy[0], 0);
  EXPECT_NEAR(dy[1], 8 * std::log(2.0), 1e-12);
}

TEST(Autograd, TiesShareTheGradient) {
  Tensor x = tensor({{1.0, 3.0, 3.0}, {2.0, 2.0, 2.0}}, kFloat64).requires_grad_();
  std::vector<double> expected = {0, 0.5, 0.5, 1.0 / 3, 1.0 / 3, 1.0 / 3};
  std::vector<double> got = grad_of(x, x.max(1));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_DOUBLE_EQ(got[i], expected[i]);
  got = grad_of(x, x.max());
  EXPECT_EQ(got, (std::vector<double>{0, 0.5, 0.5, 0, 0, 0}));
  Tensor a = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_();
  Tensor b = tensor({1.0, 3.0, 2.0}, kFloat64).requires_grad_();
  std::vector<Tensor> g = grad({maximum(a, b).sum()}, {a, b});
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{0.5, 0, 1}));
  EXPECT_EQ(g[1].to_vector<double>(), (std::vector<double>{0.5, 1, 0}));
}

// ---- The API ----

TEST(Autograd, BackwardAccumulatesIntoLeaves) {
  Tensor w = tensor({1.0, 2.0, 3.0}).requires_grad_();
  Tensor x = tensor({4.0, 5.0, 6.0});
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_FALSE(x.requires_grad());
  Tensor loss = (w * x).sum();
  EXPECT_FALSE(loss.is_leaf());
  EXPECT_EQ(loss.grad_fn_name(), "SumBackward0");
  EXPECT_FALSE(w.grad().defined());
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_FALSE(x.grad().defined());
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{8, 10, 12}));
  w.mutable_grad() = Tensor();
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, PrintsAsPyTorchPrints) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  EXPECT_EQ(w.str(), "tensor([1., 2.], requires_grad=True)");
  EXPECT_EQ((w * 2).sum().str(), "tensor(6., grad_fn=<SumBackward0>)");
  EXPECT_EQ((w * 2).detach().str(), "tensor([2., 4.])");
}

TEST(Autograd, BackwardRootsAreTheOutputsStillAlive) {
  Tensor w = tensor({1.0}).requires_grad_();
  take_backward_roots();
  for (int i = 0; i < 100; ++i) (w * 2).sum().backward();  // each output gone at once
  Tensor kept = (w * 3).sum();
  kept.backward();
  std::vector<Tensor> roots = take_backward_roots();
  ASSERT_EQ(roots.size(), 1u);
  EXPECT_TRUE(roots[0].is_same(kept));
  EXPECT_TRUE(take_backward_roots().empty());
}

TEST(Autograd, GradLeavesGradAlone) {
  Tensor w = tensor({1.0, 2.0}, TensorOptions().requires_grad(true));
  EXPECT_TRUE(w.requires_grad());
  Tensor y = (w * w).sum();
  std::vector<Tensor> g = grad({y}, {w});
  EXPECT_EQ(g[0].to_vector<float>(), (std::vector<float>{2, 4}));
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, BackwardWithAGradientForANonScalar) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  Tensor y = w * 3;
  y.backward(tensor({1.0, -1.0}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3, -3}));
}

TEST(Autograd, GradientsOfGradients) {
  Tensor x = tensor({1.0, -2.0, 0.5}, kFloat64).requires_grad_();
  Tensor y = (x * x * x).sum();
  Tensor dy = grad({y}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];  // 3x^2
  EXPECT_TRUE(dy.requires_grad());
  Tensor d2y = grad({dy.sum()}, {x})[0];  // 6x
  EXPECT_EQ(dy.to_vector<double>(), (std::vector<double>{3, 12, 0.75}));
  EXPECT_EQ(d2y.to_vector<double>(), (std::vector<double>{6, -12, 3}));
  // Through a rule that reads the result: d2/dx2 exp(x) = exp(x).
  Tensor e = x.exp().sum();
  Tensor de = grad({e}, {x}, {}, std::nullopt, true)[0];
  std::vector<double> d2e = grad({de.sum()}, {x})[0].to_vector<double>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(d2e[i], std::exp(x.to_vector<double>()[i]), 1e-12);
}

TEST(Autograd, RetainGradKeepsANonLeafsGradient) {
  Tensor x = tensor({1.0, 2.0}).requires_grad_();
  Tensor h = x * 2;
  h.retain_grad();
  (h * h).sum().backward();
  EXPECT_EQ(h.grad().to_vector<float>(), (std::vector<float>{4, 8}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{8, 16}));
}

TEST(Autograd, NoGradGuardAndDetachRecordNothing) {
  Tensor w = tensor({1.0}).requires_grad_();
  {
    NoGradGuard guard;
    EXPECT_FALSE(GradMode::is_enabled());
    EXPECT_FALSE((w * 2).requires_grad());
  }
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_TRUE((w * 2).requires_grad());
  Tensor d = (w * 2).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.item<float>(), 2);
  EXPECT_FALSE((w > 0).requires_grad());  // comparisons have no gradient
}

TEST(Autograd, GradientsCrossDevicesAndDtypes) {
  Tensor w = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor y = (w.to(kFloat32) * tensor({3.0, 4.0})).sum();
  std::vector<Tensor> g = grad({y}, {w});
  EXPECT_EQ(g[0].dtype(), kFloat64);
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{3, 4}));
}

TEST(Autograd, BackwardFusesWithTheForwardPass) {
  // exp, sin and their gradients are elementwise: the forward values they need are recomputed
  // inside the one kernel that writes the gradient.
  Tensor x = rand({1000}, kFloat64).requires_grad_();
  eval(x);
  Tensor g = grad({x.exp().sin().sum()}, {x})[0];
  reset_eval_stats();
  eval(g);
  EXPECT_EQ(eval_stats().kernels, 1);
  std::vector<double> xs = x.to_vector<double>(), gs = g.to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_NEAR(gs[i], std::cos(std::exp(xs[i])) * std::exp(xs[i]), 1e-12);
}

// ---- Errors ----

TEST(AutogradErrors, BackwardOfATensorThatDoesNotRequireGrad) {
  Tensor x = tensor({1.0});
  EXPECT_THROW(
      {
        try {
          (x * 2).sum().backward();
        } catch (const GradError& e) {
          EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos);
          throw;
        }
      },
      GradError);
}

TEST(AutogradErrors, NonScalarWithoutAGradient) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  try {
    (w * 2).backward();
    FAIL() << "expected GradError";
  } catch (const GradError& e) {
    EXPECT_NE(std::string(e.what()).find("only for scalar outputs"), std::string::npos);
  }
  EXPECT_THROW((w * 2).backward(tensor({1.0, 2.0, 3.0})), GradError);  // wrong shape
}

TEST(AutogradErrors, BackwardTwiceThroughAFreedGraph) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  Tensor y = (w.exp() * w).sum();
  y.backward();
  try {
    y.backward();
    FAIL() << "expected GradError";
  } catch (const GradError& e) {
    EXPECT_NE(std::string(e.what()).find("backward through the graph a second time"),
              std::string::npos);
  }
  // The gradient from the first backward is intact.
  std::vector<float> g = w.grad().to_vector<float>();
  EXPECT_NEAR(g[0], std::exp(1.0) * 2, 1e-5);
  // A graph whose rules read no saved value may be walked again, as in PyTorch.
  Tensor z = (w + 1).sum();
  z.backward();
  EXPECT_NO_THROW(z.backward());
}

// A backward that fails part way changes no gradient: `a`'s is computed before the walk reaches
// the freed exp, and is not given to `a`.
TEST(AutogradErrors, ABackwardThatFailsPartWayChangesNoGradient) {
  Tensor a = tensor({1.0, 2.0}).requires_grad_(), b = tensor({0.5, -1.0}).requires_grad_();
  Tensor h = b.exp().sum();
  h.backward(Tensor(), /*retain_graph=*/false);
  const std::vector<float> b_before = b.grad().to_vector<float>();
  Tensor loss = h + (a * 3).sum();
  EXPECT_THROW(loss.backward(), GradError);
  EXPECT_FALSE(a.grad().defined()) << "a gradient was given before the walk failed";
  EXPECT_EQ(b.grad().to_vector<float>(), b_before);
}

TEST(AutogradErrors, GradOfATensorThatDoesNotRequireIt) {
  Tensor w = tensor({1.0}).requires_grad_();
  Tensor x = tensor({2.0});
  EXPECT_THROW(grad({(w * x).sum()}, {x}), GradError);
  Tensor unused = tensor({3.0}).requires_grad_();
  EXPECT_THROW(grad({(w * x).sum()}, {w, unused}), GradError);
  std::vector<Tensor> g = grad({(w * x).sum()}, {w, unused}, {}, std::nullopt, false, true);
  EXPECT_TRUE(g[0].defined());
  EXPECT_FALSE(g[1].defined());
}

TEST(AutogradErrors, OnlyFloatingTensorsRequireGrad) {
  Tensor i = tensor({1.0}, kInt64);
  EXPECT_THROW(i.requires_grad_(), GradError);
  Tensor w = tensor({1.0}).requires_grad_();
  EXPECT_THROW((w * 2).requires_grad_(false), GradError);
}

// ---- In-place updates ----

TEST(InPlace, RebindsEveryCopyOfTheHandle) {
  Tensor p = tensor({1.0, 2.0});
  Tensor alias = p;
  Tensor before = p * 10;  // made from the old value: keeps meaning it
  EXPECT_EQ(p._version(), 0u);
  p.add_(tensor({0.5, 0.5}));
  EXPECT_EQ(p._version(), 1u);
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{1.5, 2.5}));
  EXPECT_EQ(before.to_vector<float>(), (std::vector<float>{10, 20}));
  p.mul_(2).sub_(1).div_(tensor({2.0}));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{1, 2}));
  p.add_(tensor({1.0, 1.0}), /*alpha=*/-3);
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{-2, -1}));
  p.zero_();
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{0, 0}));
  p.fill_(7).copy_(tensor({3.0}, kFloat64));
  EXPECT_EQ(p.dtype(), kFloat32);
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{3, 3}));
}

const void* buffer_of(const Tensor& t) { return t.value()->buffer->data(); }

// An update whose old value nothing else can read is written into the old value's own buffer
// (Note [Writing an update into its own buffer] in runtime/lazy.cc); each way of still reading
// the old value keeps the update out of place, and every value is what it means.
TEST(InPlace, AnUpdateGoesIntoTheOldBufferOnlyWhereNoOneCanReadIt) {
  Tensor w = tensor({1.0, 2.0, 3.0, 4.0}).reshape({2, 2});
  eval(w);
  // Nothing else holds the old value: from the schedule's second run (the first compiles its
  // kernels, and could fail after the write), the new value is written over it.
  for (int run = 0; run < 2; ++run) {
    const void* before = buffer_of(w);
    reset_eval_stats();
    w.add_(0.5);
    eval(w);
    EXPECT_EQ(eval_stats().in_place_outputs, run) << "run " << run;
    EXPECT_EQ(buffer_of(w) == before, run == 1) << "run " << run;
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));

  // A handle on the old value, a pending expression over it, a view of it evaluated beside
  // the update, and an expression over it evaluated beside the update: each still reads it.
  Tensor held = w.detach();
  Tensor pending = w * 10;
  w.add_(1);
  reset_eval_stats();
  eval(w);
  EXPECT_EQ(eval_stats().in_place_outputs, 0);
  EXPECT_EQ(held.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(pending.to_vector<float>(), (std::vector<float>{20, 30, 40, 50}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));
  held = Tensor();
  pending = Tensor();

  Tensor transposed = w.t();
  w.mul_(2);
  eval({w, transposed});
  EXPECT_EQ(transposed.to_vector<float>(), (std::vector<float>{3, 5, 4, 6}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{6, 8, 10, 12}));
  transposed = Tensor();

  Tensor sum_before = w.sum();
  Tensor doubled_before = w * 2;
  w.sub_(1);
  eval({w, sum_before, doubled_before});
  EXPECT_EQ(sum_before.item<float>(), 36);
  EXPECT_EQ(doubled_before.to_vector<float>(), (std::vector<float>{12, 16, 20, 24}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{5, 7, 9, 11}));

  // A view's own update never writes into the buffer it shares.
  Tensor base = tensor({1.0, 2.0, 3.0, 4.0});
  eval(base);
  Tensor tail = base.narrow(0, 2, 2);
  eval(tail);
  reset_eval_stats();
  tail.add_(100);
  eval(tail);
  EXPECT_EQ(eval_stats().in_place_outputs, 0);
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(tail.to_vector<float>(), (std::vector<float>{103, 104}));
}

TEST(InPlace, BadUpdatesChangeNothing) {
  Tensor i = tensor({1.0, 2.0}, kInt64);
  EXPECT_THROW(i.add_(0.5), DTypeError);  // a float result cannot go into an int64 tensor
  EXPECT_THROW(i.div_(2), DTypeError);
  EXPECT_THROW(i.add_(tensor({1.0, 2.0}, kInt64).reshape({2, 1})), ShapeError);  // [2, 2]
  EXPECT_EQ(i._version(), 0u);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  i.copy_(tensor({2.5, 3.5}));  // copy_ converts, as PyTorch's does
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
}

TEST(InPlace, OnALeafThatRequiresGradOnlyUnderNoGrad) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  EXPECT_THROW(w.add_(1), GradError);
  (w * w).sum().backward();
  {
    NoGradGuard guard;
    w.sub_(w.grad(), 0.5);  // a step of SGD
  }
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 0}));
}

TEST(InPlace, ChangingAValueBackwardNeedsIsAnError) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  Tensor h = w * 2;
  Tensor y = (h * h).sum();  // saves h
  h.add_(1);
  try {
    y.backward();
    FAIL() << "expected GradError";
  } catch (const GradError& e) {
    EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos)
        << e.what();
  }
}

TEST(InPlace, EveryChangedOperandIsKeptFromTheRule) {
  // Both operands of the division changed; the rule for h reads only c, the second of them.
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  Tensor h = w * 1, c = tensor({2.0, 4.0});
  Tensor y = (h / c).sum();
  h.add_(1);
  c.add_(1);
  EXPECT_THROW(y.backward(), GradError);
}

TEST(InPlace, RecordsItsGradientOnANonLeaf) {
  Tensor w = tensor({1.0, 2.0}).requires_grad_();
  Tensor h = w * 1;
  h.mul_(w);  // h = w * w, in place
  EXPECT_EQ(h.grad_fn_name(), "MulBackward0");
  h.sum().backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4}));
}

}  // namespace
}  // namespace lazyfuse
