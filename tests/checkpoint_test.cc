// Activation checkpointing (frontend/checkpoint.h): a checkpointed model's gradients are the
// plain model's bit for bit (dropout, autocast and a hand-written attention inside included)
// and a float64 reference's within float32 rounding; its peak memory over a forward and backward
// in one evaluation is below the plain model's, because the blocks' activations are recomputed
// in backward rather than kept; a second backward needs retain_graph, as PyTorch's.
#include <cmath>
#include <functional>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

namespace F = nn::functional;
using nn::utils::checkpoint;

// A pre-norm MLP block: x + W2 gelu(W1 layer_norm(x) + b1) + b2, with dropout after the GELU.
struct Block {
  Tensor w1, b1, w2, b2;
  double p = 0;
  Tensor forward(const Tensor& x) const {
    Tensor h = F::linear(F::layer_norm(x, {x.size(-1)}, Tensor(), Tensor()), w1, b1);
    h = F::dropout(F::gelu(h, "tanh"), p, p > 0);
    return x + F::linear(h, w2, b2);
  }
};

struct Model {
  std::vector<Block> blocks;
  Model(int n, int64_t width, double p, Device device = Device::cpu()) {
    manual_seed(11);
    auto parameter = [&](const Tensor& values) { return values.to(device).requires_grad_(); };
    for (int i = 0; i < n; ++i)
      blocks.push_back(
          {parameter(randn({2 * width, width}) * 0.3), parameter(randn({2 * width}) * 0.1),
           parameter(randn({width, 2 * width}) * 0.3), parameter(randn({width}) * 0.1), p});
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all;
    for (const Block& b : blocks) all.insert(all.end(), {b.w1, b.b1, b.w2, b.b2});
    return all;
  }
  Tensor forward(Tensor x, bool checkpointed) const {
    for (const Block& b : blocks)
      x = checkpointed ? checkpoint([&](const Tensor& in) { return b.forward(in); }, x)
                       : b.forward(x);
    return x;
  }
};

// The loss's gradients with respect to the input and every parameter, evaluated together.
std::vector<Tensor> gradients(const Model& model, const Tensor& x, bool checkpointed,
                              uint64_t seed = 5) {
  manual_seed(seed);
  const Tensor loss = (model.forward(x, checkpointed).tanh() * 0.5).sum();
  std::vector<Tensor> wrt = model.parameters();
  wrt.insert(wrt.begin(), x);
  std::vector<Tensor> grads = grad({loss}, wrt);
  grads.push_back(loss);
  eval(grads);
  return grads;
}

void expect_same_bits(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].to(kFloat32).cpu().to_vector<float>(),
              want[i].to(kFloat32).cpu().to_vector<float>())
        << "gradient " << i;
}

TEST(Checkpoint, GradientsAreThePlainModelsBitForBit) {
  const Model model(3, 16, /*p=*/0.2);
  const Tensor x = randn({4, 6, 16}).requires_grad_();
  expect_same_bits(gradients(model, x, true), gradients(model, x, false));
  // Another seed drops other units: the recomputed dropout is the forward's, not a new draw.
  EXPECT_NE(gradients(model, x, true, 6)[1].to_vector<float>(),
            gradients(model, x, true, 5)[1].to_vector<float>());
}

TEST(Checkpoint, OnTheGpuGradientsAreThePlainModelsBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  const Device gpu("cuda");
  const Model model(3, 16, /*p=*/0.2, gpu);
  const Tensor x = randn({4, 6, 16}).to(gpu).requires_grad_();
  expect_same_bits(gradients(model, x, true), gradients(model, x, false));
}

TEST(Checkpoint, GradientsMatchAFloat64Reference) {
  const Model model(3, 16, /*p=*/0);
  Model wide = model;
  for (Block& b : wide.blocks)
    for (Tensor* t : {&b.w1, &b.b1, &b.w2, &b.b2}) *t = t->detach().to(kFloat64).requires_grad_();
  const Tensor x = randn({4, 6, 16});
  const std::vector<Tensor> got = gradients(model, x.detach().requires_grad_(), true);
  const std::vector<Tensor> want = gradients(wide, x.to(kFloat64).requires_grad_(), false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const std::vector<double> g = got[i].to_vector<double>(), w = want[i].to_vector<double>();
    ASSERT_EQ(g.size(), w.size());
    double scale = 0;
    for (double v : w) scale = std::max(scale, std::fabs(v));
    for (size_t j = 0; j < g.size(); ++j)
      ASSERT_NEAR(g[j], w[j], 2e-5 * std::max(1.0, scale)) << "gradient " << i << " element " << j;
  }
}

// Rounded after every op, bfloat16 values have the same bits however the recomputation fuses
// (by default they stay float32 within a kernel, and the recomputed values fuse into backward's
// kernels where the plain model's were stored, so their last bits may differ).
TEST(Checkpoint, UnderAutocastGradientsAreThePlainModelsBitForBit) {
  const Model model(2, 16, /*p=*/0.1);
  const Tensor x = randn({3, 5, 16}).requires_grad_();
  auto under_autocast = [&](bool checkpointed) {
    HalfRoundingGuard each_op(HalfRounding::EachOp);
    AutocastGuard autocast(kCPU, kBFloat16);
    return gradients(model, x, checkpointed);
  };
  const std::vector<Tensor> got = under_autocast(true);
  EXPECT_EQ(got[1].dtype(), kFloat32);  // a float32 parameter's gradient
  expect_same_bits(got, under_autocast(false));
}

// A hand-written causal attention inside a checkpoint is still recognised as one attention step
// (the pattern walks the recorded graph while the function runs), and its gradients are the
// plain attention's.
TEST(Checkpoint, AHandWrittenAttentionInsideIsStillOneAttentionStep) {
  manual_seed(2);
  const Tensor q = randn({1, 2, 9, 8}).requires_grad_(), k = randn({1, 2, 9, 8}).requires_grad_(),
               v = randn({1, 2, 9, 8}).requires_grad_();
  auto attention = [](const std::vector<Tensor>& in) {
    const Tensor causal = ones({9, 9}, TensorOptions(kBool)).triu(1);
    const Tensor scores = in[0].matmul(in[1].transpose(-2, -1)) / std::sqrt(8.0);
    return std::vector<Tensor>{F::softmax(scores.masked_fill(causal, -INFINITY), -1).matmul(in[2])};
  };
  auto run = [&](bool checkpointed) {
    const Tensor out = checkpointed ? checkpoint(attention, {q, k, v})[0] : attention({q, k, v})[0];
    if (checkpointed) {
      const std::string ir = out.fused_ir();
      EXPECT_NE(ir.find("= attention "), std::string::npos) << ir;
    }
    std::vector<Tensor> grads = grad({(out * out).sum()}, {q, k, v});
    grads.push_back(out);
    eval(grads);
    return grads;
  };
  expect_same_bits(run(true), run(false));
}

// Eight blocks over [64, 256] activations, the forward and backward in one evaluation: the
// checkpointed model keeps each block's input (64 KB) until backward reaches it, the plain model
// each block's normalized input, hidden activations, GELU and dropout mask (most of a megabyte a
// block).
TEST(Checkpoint, HoldsLessMemoryThanThePlainModel) {
  const Device cpu("cpu");
  const Model model(8, 256, /*p=*/0.1);
  const Tensor x = randn({64, 256}).requires_grad_();
  eval({x});
  auto peak_of = [&](bool checkpointed) {
    reset_peak_memory_stats();
    const int64_t before = memory_stats(cpu).allocated_bytes;
    gradients(model, x, checkpointed);
    return memory_stats(cpu).peak_bytes - before;
  };
  // Beyond the gradients themselves (the results, held at the end either way).
  int64_t gradients_bytes = x.numel() * 4;
  for (const Tensor& p : model.parameters()) gradients_bytes += p.numel() * 4;
  const int64_t plain = peak_of(false) - gradients_bytes;
  const int64_t checkpointed = peak_of(true) - gradients_bytes;
  const int64_t activation = 64 * 256 * 4;
  EXPECT_LT(checkpointed * 3, plain)
      << "checkpointed " << checkpointed << " bytes, plain " << plain;
  EXPECT_GT(plain, 8 * 4 * activation) << "the plain model should keep the blocks' activations";
}

// An input that is a view (a transpose): the recomputation reads a dense copy of it, so a
// reshape the forward took as a view copies now; the gradients are still the plain function's.
TEST(Checkpoint, AnInputThatIsAViewIsRecomputedFromItsValues) {
  manual_seed(4);
  const Tensor y = randn({6, 4}).requires_grad_();
  auto function = [](const Tensor& x) { return (x.t().reshape({-1}) * 3).exp(); };
  auto gradient = [&](bool checkpointed) {
    const Tensor x = y.t();  // [4, 6], strided
    const Tensor out = checkpointed ? checkpoint(function, x) : function(x);
    return grad({(out * out).sum()}, {y})[0];
  };
  EXPECT_EQ(gradient(true).to_vector<float>(), gradient(false).to_vector<float>());
}

// Backward through one of the function's results frees none of what the others need.
TEST(Checkpoint, EachResultHasItsOwnBackward) {
  manual_seed(9);
  const Tensor x = randn({5}).requires_grad_(), w1 = randn({5}).requires_grad_(),
               w2 = randn({5}).requires_grad_();
  const std::vector<Tensor> out = checkpoint(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{(in[0] * w1).tanh(), (in[0] * w2).sigmoid()};
      },
      {x});
  out[0].sum().backward();
  out[1].sum().backward();
  const std::vector<float> got = x.grad().to_vector<float>();
  const std::vector<double> xs = x.to_vector<double>(), a = w1.to_vector<double>(),
                            b = w2.to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double t = std::tanh(xs[i] * a[i]), s = 1 / (1 + std::exp(-xs[i] * b[i]));
    EXPECT_NEAR(got[i], (1 - t * t) * a[i] + s * (1 - s) * b[i], 1e-6) << "element " << i;
  }
}

TEST(Checkpoint, ASecondBackwardNeedsRetainGraph) {
  const Model model(1, 8, 0);
  const Tensor x = randn({2, 8}).requires_grad_();
  const Tensor loss = model.forward(x, true).sum();
  loss.backward(Tensor(), /*retain_graph=*/true);
  const std::vector<float> once = x.grad().to_vector<float>();
  loss.backward();
  const std::vector<float> twice = x.grad().to_vector<float>();
  ASSERT_EQ(twice.size(), once.size());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2 * once[i]) << "element " << i;
  try {
    loss.backward();
    FAIL() << "a third backward through a freed checkpoint ran";
  } catch (const GradError& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
  // The failed backward changed nothing.
  EXPECT_EQ(x.grad().to_vector<float>(), twice);
}

TEST(Checkpoint, OutsideGradModeItIsTheFunction) {
  const Model model(2, 8, 0);
  const Tensor x = randn({2, 8});
  NoGradGuard no_grad;
  const Tensor out = model.forward(x, true);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.to_vector<float>(), model.forward(x, false).to_vector<float>());
}

}  // namespace
}  // namespace lazyfuse
