// Optimizers against float64 re-implementations of their update rules, losses and row ops
// against float64 references written here, the modules, and small models that learn.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

using Vec = std::vector<double>;

// Gradients for three steps of a two-element parameter, chosen by hand.
const std::vector<Vec> kGrads = {{0.5, -1.0}, {0.25, 2.0}, {-0.75, 0.1}};
const Vec kStart = {1.0, -2.0};

// Runs `optimizer` for kGrads.size() steps with the gradients set directly, and returns the
// parameter after each step.
template <typename MakeOptimizer>
std::vector<Vec> trajectory(MakeOptimizer make) {
  Tensor p = from_vector(kStart, {2}, kFloat64).requires_grad_();
  auto optimizer = make(std::vector<Tensor>{p});
  std::vector<Vec> out;
  for (const Vec& g : kGrads) {
    optimizer.zero_grad();
    p.mutable_grad() = from_vector(g, {2}, kFloat64);
    optimizer.step();
    out.push_back(p.to_vector<double>());
  }
  return out;
}

void expect_trajectory(const std::vector<Vec>& got, const std::vector<Vec>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s)
    for (size_t i = 0; i < got[s].size(); ++i)
      EXPECT_NEAR(got[s][i], want[s][i], 1e-14 + 1e-12 * std::abs(want[s][i]))
          << "step " << s << " element " << i;
}

// The reference SGD, as torch.optim.SGD documents it.
std::vector<Vec> reference_sgd(double lr, double momentum, double dampening, double weight_decay,
                               bool nesterov) {
  Vec p = kStart, buf;
  std::vector<Vec> out;
  for (const Vec& grad : kGrads) {
    Vec d(2);
    for (int i = 0; i < 2; ++i) d[i] = grad[i] + weight_decay * p[i];
    if (momentum != 0) {
      if (buf.empty()) {
        buf = d;
      } else {
        for (int i = 0; i < 2; ++i) buf[i] = momentum * buf[i] + (1 - dampening) * d[i];
      }
      for (int i = 0; i < 2; ++i) d[i] = nesterov ? d[i] + momentum * buf[i] : buf[i];
    }
    for (int i = 0; i < 2; ++i) p[i] -= lr * d[i];
    out.push_back(p);
  }
  return out;
}

// The reference Adam and AdamW, as torch.optim.Adam(W) document them.
std::vector<Vec> reference_adam(double lr, double beta1, double beta2, double eps,
                                double weight_decay, bool decoupled) {
  Vec p = kStart, m(2, 0), v(2, 0);
  std::vector<Vec> out;
  int t = 0;
  for (const Vec& grad : kGrads) {
    ++t;
    for (int i = 0; i < 2; ++i) {
      double g = grad[i];
      if (decoupled) {
        p[i] *= 1 - lr * weight_decay;
      } else {
        g += weight_decay * p[i];
      }
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    out.push_back(p);
  }
  return out;
}

TEST(Optim, SgdMatchesTheUpdateRule) {
  expect_trajectory(
      trajectory([](auto params) { return optim::SGD(params, optim::SGDOptions(0.1)); }),
      reference_sgd(0.1, 0, 0, 0, false));
  expect_trajectory(trajectory([](auto params) {
                      return optim::SGD(params,
                                        optim::SGDOptions(0.05).momentum(0.9).dampening(0.2));
                    }),
                    reference_sgd(0.05, 0.9, 0.2, 0, false));
  expect_trajectory(trajectory([](auto params) {
                      return optim::SGD(
                          params,
                          optim::SGDOptions(0.05).momentum(0.8).nesterov(true).weight_decay(0.1));
                    }),
                    reference_sgd(0.05, 0.8, 0, 0.1, true));
}

TEST(Optim, AdamAndAdamWMatchTheUpdateRule) {
  expect_trajectory(
      trajectory([](auto params) { return optim::Adam(params, optim::AdamOptions(0.1)); }),
      reference_adam(0.1, 0.9, 0.999, 1e-8, 0, false));
  expect_trajectory(trajectory([](auto params) {
                      return optim::Adam(
                          params,
                          optim::AdamOptions(0.01).betas({0.8, 0.99}).eps(1e-3).weight_decay(0.5));
                    }),
                    reference_adam(0.01, 0.8, 0.99, 1e-3, 0.5, false));
  expect_trajectory(trajectory([](auto params) {
                      return optim::AdamW(params, optim::AdamWOptions(0.02).weight_decay(0.3));
                    }),
                    reference_adam(0.02, 0.9, 0.999, 1e-8, 0.3, true));
}

// Adam's step count and bias corrections are written once for the parameters stepped together
// (they share one count), while a parameter that misses a step keeps its own count: each
// parameter's trajectory against the float64 rule with its own count, and the evaluation's
// nodes growing by less than a whole update per parameter.
TEST(Optim, AdamParametersSteppedTogetherShareTheirCount) {
  // Two parameters; the second has no gradient at the second step, so its count lags.
  Tensor a = from_vector(kStart, {2}, kFloat64).requires_grad_();
  Tensor b = from_vector(kStart, {2}, kFloat64).requires_grad_();
  optim::Adam optimizer({a, b}, optim::AdamOptions(0.1));
  std::vector<Vec> got_a, got_b;
  for (size_t step = 0; step < kGrads.size(); ++step) {
    optimizer.zero_grad();
    a.mutable_grad() = from_vector(kGrads[step], {2}, kFloat64);
    if (step != 1) b.mutable_grad() = from_vector(kGrads[step], {2}, kFloat64);
    optimizer.step();
    got_a.push_back(a.to_vector<double>());
    got_b.push_back(b.to_vector<double>());
  }
  expect_trajectory(got_a, reference_adam(0.1, 0.9, 0.999, 1e-8, 0, false));
  // b's float64 rule: steps 1 and 3 with counts 1 and 2; unchanged at step 2.
  Vec p = kStart, m(2, 0), v(2, 0);
  std::vector<Vec> want_b;
  int t = 0;
  for (size_t step = 0; step < kGrads.size(); ++step) {
    if (step != 1) {
      ++t;
      for (int i = 0; i < 2; ++i) {
        const double g = kGrads[step][i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        p[i] -= 0.1 * (m[i] / (1 - std::pow(0.9, t))) /
                (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8);
      }
    }
    want_b.push_back(p);
  }
  expect_trajectory(got_b, want_b);

  // The nodes of the third step's evaluation for 1, 2 and 4 parameters: a whole update per
  // parameter would make the count without parameters (the intercept) zero.
  auto third_step_nodes = [](int parameters) {
    std::vector<Tensor> ps;
    for (int i = 0; i < parameters; ++i)
      ps.push_back(from_vector(kStart, {2}, kFloat64).requires_grad_());
    optim::Adam optimizer(ps, optim::AdamOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      for (Tensor& p : ps) p.mutable_grad() = from_vector(kGrads[step], {2}, kFloat64);
      reset_eval_stats();
      optimizer.step();
    }
    return eval_stats().nodes;
  };
  const int64_t one = third_step_nodes(1), two = third_step_nodes(2), four = third_step_nodes(4);
  const int64_t per_parameter = two - one;
  EXPECT_EQ(four - two, 2 * per_parameter);
  // The count, its increment and the two bias corrections with their conversions.
  EXPECT_GE(one - per_parameter, 10);
}

// From the third step on, a step also writes every parameter and every moment into the buffer
// it had (Note [Writing an update into its own buffer] in runtime/lazy.cc): nothing moves, and
// the values are those of the update rule (Optim.AdamAndAdamWMatchTheUpdateRule).
TEST(Optim, AStepIsOneEvaluationReusesItsScheduleAndKeepsItsBuffers) {
  manual_seed(3);
  nn::Sequential net(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
  optim::Adam optimizer(net.parameters(), optim::AdamOptions(1e-2));
  Tensor x = randn({16, 4});
  Tensor y = tensor({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, kInt64);
  eval({x, y});
  std::vector<const void*> buffers;
  for (int step = 0; step < 4; ++step) {
    optimizer.zero_grad();
    Tensor loss = nn::functional::cross_entropy(net(x), y);
    loss.backward();
    reset_eval_stats();
    optimizer.step();
    // Forward, backward and update in one evaluation; the loss is computed with it.
    EXPECT_EQ(eval_stats().evaluations, 1) << "step " << step;
    EXPECT_TRUE(loss.is_computed());
    std::vector<const void*> now;
    for (const Tensor& parameter : net.parameters())
      now.push_back(parameter.value()->buffer->data());
    // The first step starts Adam's state from zeros; from the third on, every step is the
    // same graph (the step count is a tensor, not a constant): its schedule is reused, and
    // four parameters and their two moments each are written in place. (The step count they
    // share is computed in an earlier kernel than the last, so it is not.)
    if (step >= 2) {
      EXPECT_EQ(eval_stats().schedule_cache_hits, 1) << "step " << step;
      EXPECT_EQ(eval_stats().in_place_outputs, 12) << "step " << step;
      EXPECT_EQ(now, buffers) << "step " << step;
    }
    buffers = now;
  }
}

// SGD's momentum buffer starts as the first gradient's value and is then updated in place: a
// gradient the user still holds from that step keeps its values, and so does each parameter
// value the user kept.
TEST(Optim, MomentumInPlaceChangesNothingTheUserHolds) {
  Tensor p = from_vector({1.0, 2.0}, {2}, kFloat64).requires_grad_();
  optim::SGD optimizer({p}, optim::SGDOptions(0.5).momentum(0.9));
  p.mutable_grad() = from_vector({1.0, -1.0}, {2}, kFloat64);
  const Tensor first_grad = p.grad();
  optimizer.step();
  const Tensor after_first = p.detach();
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    p.mutable_grad() = from_vector({2.0, 4.0}, {2}, kFloat64);
    reset_eval_stats();
    optimizer.step();
    // From the third step on, the parameter and the buffer go into their own buffers.
    if (step >= 1) EXPECT_EQ(eval_stats().in_place_outputs, 2) << "step " << step;
  }
  EXPECT_EQ(first_grad.to_vector<double>(), (std::vector<double>{1.0, -1.0}));
  EXPECT_EQ(after_first.to_vector<double>(), (std::vector<double>{0.5, 2.5}));
}

// ---- Losses and row ops against float64 references ----

TEST(Losses, MatchFloat64References) {
  const Vec logits = {1.0, -2.0, 0.5, 3.0, 3.0, -1.0};  // [2, 3]
  const std::vector<int64_t> labels = {2, 0};
  Tensor x = from_vector(logits, {2, 3}, kFloat64);
  Tensor y = tensor({2, 0}, kInt64);
  double want = 0;
  for (int r = 0; r < 2; ++r) {
    double z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(logits[r * 3 + c]);
    want += std::log(z) - logits[r * 3 + labels[r]];
  }
  EXPECT_NEAR(nn::functional::cross_entropy(x, y).item<double>(), want / 2, 1e-14);
  EXPECT_NEAR(nn::CrossEntropyLoss(kSum)(x, y).item<double>(), want, 1e-14);
  EXPECT_EQ(nn::functional::cross_entropy(x, y, kNone).sizes(), Shape({2}));

  Tensor a = tensor({1.0, 2.0, 4.0}, kFloat64), b = tensor({0.5, 2.0, 1.0}, kFloat64);
  EXPECT_NEAR(nn::MSELoss()(a, b).item<double>(), (0.25 + 0 + 9) / 3, 1e-15);
  EXPECT_NEAR(nn::functional::mse_loss(a, b, kSum).item<double>(), 9.25, 1e-15);

  // Logits far out in both directions: the stable form neither overflows nor loses them.
  const Vec z = {-800.0, -3.0, 0.0, 2.5, 900.0}, t = {0.0, 1.0, 0.5, 0.25, 1.0};
  std::vector<double> got = nn::functional::binary_cross_entropy_with_logits(
                                from_vector(z, {5}, kFloat64), from_vector(t, {5}, kFloat64), kNone)
                                .to_vector<double>();
  for (int i = 0; i < 5; ++i) {
    const double softplus =
        z[i] > 0 ? z[i] + std::log1p(std::exp(-z[i])) : std::log1p(std::exp(z[i]));
    EXPECT_NEAR(got[i], softplus - t[i] * z[i], 1e-12) << i;
  }
}

TEST(RowOps, SoftmaxAndLogsumexpMatchFloat64) {
  const Vec v = {1.0, 2.0, 3.0, -1000.0, 0.0, 1000.0};
  Tensor x = from_vector(v, {2, 3}, kFloat64);
  std::vector<double> s = softmax(x, 1).to_vector<double>();
  std::vector<double> ls = log_softmax(x, -1).to_vector<double>();
  std::vector<double> lse = logsumexp(x, {1}).to_vector<double>();
  for (int r = 0; r < 2; ++r) {
    double m = std::max({v[r * 3], v[r * 3 + 1], v[r * 3 + 2]}), z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(v[r * 3 + c] - m);
    EXPECT_NEAR(lse[r], m + std::log(z), 1e-12);
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(s[r * 3 + c], std::exp(v[r * 3 + c] - m) / z, 1e-15);
      EXPECT_NEAR(ls[r * 3 + c], v[r * 3 + c] - m - std::log(z), 1e-12);
    }
  }
  const double inf = INFINITY;
  EXPECT_EQ(logsumexp(tensor({-inf, -inf}), {0}).item<float>(), -inf);
  EXPECT_EQ(logsumexp(tensor({inf, 1.0}), {0}).item<float>(), inf);
}

TEST(RowOps, ArgmaxTakesTheFirstOfTiesAndNan) {
  Tensor x = tensor({{1.0, 3.0, 3.0}, {2.0, NAN, 5.0}, {-1.0, -1.0, -2.0}});
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(argmax(x, 1, true).sizes(), Shape({3, 1}));
  EXPECT_EQ(argmax(x, 1).dtype(), kInt64);
  EXPECT_EQ(one_hot(tensor({2, 0}, kInt64), 3).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 1, 1, 0, 0}));
}

// ---- Modules ----

// RMSNorm and normalize against float64 references (the default eps of RMSNorm is the dtype's
// machine epsilon, as PyTorch's); the module prints as PyTorch's, and a bad p is a ShapeError.
TEST(Modules, RmsNormAndNormalizeMatchFloat64) {
  const Vec x = {0.5, -1.25, 2.0, 0.0, 3.0, -0.5, 1.0, 1.5, -2.5, 0.75, 0.25, -1.0};
  const Vec w = {1.5, -0.5, 2.0, 1.0};
  Tensor tx = from_vector(x, {3, 4}), tw = from_vector(w, {4});
  nn::RMSNorm norm({4});
  EXPECT_EQ(norm.repr(), "RMSNorm((4,), eps=None, elementwise_affine=True)");
  EXPECT_EQ(nn::RMSNorm({4}, 1e-6, false).repr(),
            "RMSNorm((4,), eps=1e-06, elementwise_affine=False)");
  norm.weight() = tw.detach().requires_grad_();
  const std::vector<float> scaled = norm(tx).to_vector<float>();
  const std::vector<float> unit = nn::functional::normalize(tx, 2.0, 1).to_vector<float>();
  const std::vector<float> l1 = nn::functional::normalize(tx, 1.0, 0).to_vector<float>();
  const std::vector<float> l3 = nn::functional::normalize(tx, 3.0, 1).to_vector<float>();
  for (int r = 0; r < 3; ++r) {
    double squares = 0, cubes = 0;
    for (int c = 0; c < 4; ++c) {
      squares += x[r * 4 + c] * x[r * 4 + c];
      cubes += std::pow(std::abs(x[r * 4 + c]), 3);
    }
    const double rms = std::sqrt(squares / 4 + std::numeric_limits<float>::epsilon());
    for (int c = 0; c < 4; ++c) {
      const int i = r * 4 + c;
      EXPECT_NEAR(scaled[i], x[i] / rms * w[c], 1e-6) << i;
      EXPECT_NEAR(unit[i], x[i] / std::sqrt(squares), 1e-6) << i;
      EXPECT_NEAR(l3[i], x[i] / std::cbrt(cubes), 1e-6) << i;
    }
  }
  for (int c = 0; c < 4; ++c) {
    double total = 0;
    for (int r = 0; r < 3; ++r) total += std::abs(x[r * 4 + c]);
    for (int r = 0; r < 3; ++r) EXPECT_NEAR(l1[r * 4 + c], x[r * 4 + c] / total, 1e-6);
  }
  // A zero row's norm is eps: zeros, not NaN.
  EXPECT_EQ(nn::functional::normalize(zeros({2, 3})).to_vector<float>(),
            std::vector<float>(6, 0.0f));
  EXPECT_THROW(nn::functional::normalize(tx, 0.0), ShapeError);
}

TEST(Modules, NamedParametersTrainEvalAndRepr) {
  nn::Sequential net(nn::Linear(2, 4), nn::GELU(), nn::LayerNorm({4}), nn::Dropout(0.25),
                     nn::Linear(4, 1, false), nn::Flatten(0));
  std::vector<std::string> names;
  for (auto& [name, p] : net.named_parameters()) {
    names.push_back(name);
    EXPECT_TRUE(p.requires_grad()) << name;
    EXPECT_TRUE(p.is_leaf()) << name;
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight"}));
  EXPECT_EQ(net.repr(),
            "Sequential(\n"
            "  (0): Linear(in_features=2, out_features=4, bias=True)\n"
            "  (1): GELU(approximate='none')\n"
            "  (2): LayerNorm((4,), eps=1e-05, elementwise_affine=True)\n"
            "  (3): Dropout(p=0.25, inplace=False)\n"
            "  (4): Linear(in_features=4, out_features=1, bias=False)\n"
            "  (5): Flatten(start_dim=0, end_dim=-1)\n"
            ")");
  EXPECT_TRUE(net.is_training());
  net.eval();
  EXPECT_FALSE(net[3]->is_training());
  Tensor x = randn({3, 2});
  // In eval mode dropout is the identity: two passes agree exactly.
  EXPECT_EQ(net(x).to_vector<float>(), net(x).to_vector<float>());
  EXPECT_EQ(net(x).sizes(), Shape({3}));
}

TEST(Modules, DropoutKeepsAndScales) {
  manual_seed(11);
  Tensor x = ones({100000}, kFloat64);
  std::vector<double> y = nn::functional::dropout(x, 0.3).to_vector<double>();
  int64_t zeros = 0;
  for (double v : y) {
    if (v == 0) {
      ++zeros;
    } else {
      EXPECT_DOUBLE_EQ(v, 1 / 0.7);
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / y.size(), 0.3, 0.01);
  EXPECT_EQ(nn::functional::dropout(x, 0.3, /*training=*/false).to_vector<double>(),
            x.to_vector<double>());
}

TEST(Modules, LinearGradientsMatchTheirFormula) {
  manual_seed(5);
  nn::Linear layer(3, 2);
  Tensor x = randn({4, 3});
  Tensor loss = (layer(x) * layer(x)).sum();
  loss.backward();
  // d/dW sum((xW^T + b)^2) = 2 (xW^T + b)^T x, d/db = 2 sum over rows of (xW^T + b).
  std::vector<float> xs = x.to_vector<float>(), w = layer.weight().to_vector<float>(),
                     b = layer.bias().to_vector<float>();
  std::vector<double> dw(6, 0), db(2, 0);
  for (int r = 0; r < 4; ++r)
    for (int o = 0; o < 2; ++o) {
      double y = b[o];
      for (int i = 0; i < 3; ++i) y += double(xs[r * 3 + i]) * w[o * 3 + i];
      db[o] += 2 * y;
      for (int i = 0; i < 3; ++i) dw[o * 3 + i] += 2 * y * xs[r * 3 + i];
    }
  std::vector<float> gw = layer.weight().grad().to_vector<float>(),
                     gb = layer.bias().grad().to_vector<float>();
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(gw[i], dw[i], 1e-4);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(gb[i], db[i], 1e-4);
}

// ---- Models that learn ----

TEST(Training, LinearRegressionRecoversItsParameters) {
  manual_seed(0);
  const Tensor true_w = tensor({2.0, -3.4}).reshape({2, 1});
  Tensor features = randn({1000, 2});
  Tensor labels = matmul(features, true_w) + 4.2 + randn({1000, 1}) * 0.01;
  eval({features, labels});
  nn::Linear net(2, 1);
  optim::SGD optimizer(net.parameters(), optim::SGDOptions(0.03));
  for (int epoch = 0; epoch < 3; ++epoch)
    for (int64_t start = 0; start < 1000; start += 10) {
      optimizer.zero_grad();
      Tensor loss =
          nn::functional::mse_loss(net(features.narrow(0, start, 10)), labels.narrow(0, start, 10));
      loss.backward();
      optimizer.step();
    }
  std::vector<float> w = net.weight().to_vector<float>();
  EXPECT_NEAR(w[0], 2.0, 0.01);
  EXPECT_NEAR(w[1], -3.4, 0.01);
  EXPECT_NEAR(net.bias().item<float>(), 4.2, 0.01);
}

TEST(Training, ParametersMoveBetweenDevicesAsTheSameTensors) {
  nn::Linear layer(2, 2);
  Tensor weight = layer.weight();
  layer.to(Device::cpu());
  EXPECT_TRUE(layer.weight().is_same(weight));
  EXPECT_TRUE(layer.weight().requires_grad());
}

}  // namespace
}  // namespace lazyfuse
