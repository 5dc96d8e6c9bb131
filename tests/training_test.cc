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

// Adam(W) as torch.optim.AdamW documents it, with the rate of each step given (a schedule).
std::vector<Vec> reference_adamw_scheduled(const Vec& lrs, double weight_decay) {
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  Vec p = kStart, m(2, 0), v(2, 0);
  std::vector<Vec> out;
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    const double lr = lrs[t - 1];
    for (int i = 0; i < 2; ++i) {
      const double g = kGrads[t - 1][i];
      p[i] *= 1 - lr * weight_decay;
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      p[i] -= lr * (m[i] / (1 - std::pow(beta1, t))) /
              (std::sqrt(v[i] / (1 - std::pow(beta2, t))) + eps);
    }
    out.push_back(p);
  }
  return out;
}

// Each parameter group steps with its own options; a group without options takes the
// optimizer's defaults, as torch.optim's param groups do.
TEST(Optim, ParameterGroupsStepWithTheirOwnOptions) {
  Tensor decayed = from_vector(kStart, {2}, kFloat64).requires_grad_();
  Tensor plain = from_vector(kStart, {2}, kFloat64).requires_grad_();
  Tensor added = from_vector(kStart, {2}, kFloat64).requires_grad_();
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<Tensor>{decayed},
      std::make_unique<optim::AdamWOptions>(optim::AdamWOptions(0.02).weight_decay(0.3)));
  groups.emplace_back(std::vector<Tensor>{plain});  // the defaults: lr 0.01, weight decay 0
  optim::AdamW optimizer(groups, optim::AdamWOptions(0.01).weight_decay(0));
  optimizer.add_param_group(optim::OptimizerParamGroup(
      {added}, std::make_unique<optim::AdamWOptions>(optim::AdamWOptions(0.05))));
  ASSERT_EQ(optimizer.param_groups().size(), 3u);
  EXPECT_EQ(optimizer.param_groups()[1].options().get_lr(), 0.01);
  std::vector<Vec> got_decayed, got_plain, got_added;
  for (const Vec& g : kGrads) {
    optimizer.zero_grad();
    for (Tensor* p : {&decayed, &plain, &added}) p->mutable_grad() = from_vector(g, {2}, kFloat64);
    optimizer.step();
    got_decayed.push_back(decayed.to_vector<double>());
    got_plain.push_back(plain.to_vector<double>());
    got_added.push_back(added.to_vector<double>());
  }
  expect_trajectory(got_decayed, reference_adam(0.02, 0.9, 0.999, 1e-8, 0.3, true));
  expect_trajectory(got_plain, reference_adam(0.01, 0.9, 0.999, 1e-8, 0, true));
  expect_trajectory(got_added, reference_adam(0.05, 0.9, 0.999, 1e-8, 1e-2, true));
  // A parameter in two groups, a negative rate and options of another optimizer are errors.
  EXPECT_THROW(optimizer.add_param_group(optim::OptimizerParamGroup({plain})), ValueError);
  EXPECT_THROW(optim::SGD({plain}, optim::SGDOptions(-1)), ValueError);
  std::vector<optim::OptimizerParamGroup> wrong;
  wrong.emplace_back(std::vector<Tensor>{plain},
                     std::make_unique<optim::SGDOptions>(optim::SGDOptions(0.1)));
  optim::Adam mismatched(wrong);
  plain.mutable_grad() = from_vector({1.0, 1.0}, {2}, kFloat64);
  EXPECT_THROW(mismatched.step(), ValueError);
  EXPECT_EQ(plain.to_vector<double>(), got_plain.back());  // the failed step changed nothing
}

// PyTorch's schedulers step recursively, each rate from the last (their get_lr()); lazyfuse's
// compute each step's rate in closed form. The recursive forms, restated here, are the
// reference.
TEST(LRScheduler, RatesMatchPyTorchsRecursiveForms) {
  const double base = 0.1, pi = std::acos(-1.0);
  auto rates = [](optim::Optimizer& optimizer, optim::LRScheduler& scheduler, int steps) {
    Vec out = {optimizer.param_groups()[0].options().get_lr()};
    for (int i = 1; i < steps; ++i) {
      scheduler.step();
      out.push_back(optimizer.param_groups()[0].options().get_lr());
      EXPECT_EQ(scheduler.get_last_lr(), Vec{out.back()});
    }
    return out;
  };
  auto expect_rates = [](const Vec& got, const Vec& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-15 + 1e-12 * std::abs(want[i])) << what << " step " << i;
  };
  Tensor p = zeros({2}, kFloat64).requires_grad_();
  const int steps = 40;
  {  // StepLR(step_size 7, gamma 0.5)
    optim::SGD sgd({p}, optim::SGDOptions(base));
    optim::StepLR scheduler(sgd, 7, 0.5);
    Vec want = {base};
    for (int e = 1; e < steps; ++e) want.push_back(e % 7 == 0 ? want.back() * 0.5 : want.back());
    expect_rates(rates(sgd, scheduler, steps), want, "StepLR");
  }
  {  // CosineAnnealingLR(T_max 10, eta_min 0.01): past T_max it rises again, as PyTorch's does.
    optim::SGD sgd({p}, optim::SGDOptions(base));
    optim::CosineAnnealingLR scheduler(sgd, 10, 0.01);
    const double T = 10, eta = 0.01;
    Vec want = {base};
    for (int e = 1; e < steps; ++e) {
      const double last = want.back();
      if ((e - 1 - 10) % 20 == 0)
        want.push_back(last + (base - eta) * (1 - std::cos(pi / T)) / 2);
      else
        want.push_back(
            (1 + std::cos(pi * e / T)) / (1 + std::cos(pi * (e - 1) / T)) * (last - eta) + eta);
    }
    expect_rates(rates(sgd, scheduler, steps), want, "CosineAnnealingLR");
  }
  {  // LinearLR(start 0.25, end 1, total 8)
    optim::SGD sgd({p}, optim::SGDOptions(base));
    optim::LinearLR scheduler(sgd, 0.25, 1.0, 8);
    Vec want = {base * 0.25};
    for (int e = 1; e < steps; ++e)
      want.push_back(e > 8 ? want.back() : want.back() * (1 + 0.75 / (8 * 0.25 + (e - 1) * 0.75)));
    expect_rates(rates(sgd, scheduler, steps), want, "LinearLR");
  }
  {  // LambdaLR: the lambda times the initial rate.
    optim::SGD sgd({p}, optim::SGDOptions(base));
    optim::LambdaLR scheduler(sgd, [](int64_t e) { return 1.0 / (1 + e); });
    Vec want;
    for (int e = 0; e < steps; ++e) want.push_back(base / (1 + e));
    expect_rates(rates(sgd, scheduler, steps), want, "LambdaLR");
  }
  {  // nanoGPT's schedule: linear warmup over 5 steps, then cosine over 20.
    optim::SGD sgd({p}, optim::SGDOptions(base));
    auto warmup = std::make_shared<optim::LinearLR>(sgd, 0.2, 1.0, 5);
    auto cosine = std::make_shared<optim::CosineAnnealingLR>(sgd, 20);
    optim::SequentialLR scheduler(sgd, {warmup, cosine}, {5});
    Vec want;
    for (int e = 0; e < steps; ++e)
      want.push_back(e < 5 ? base * (0.2 + 0.8 * e / 5)
                           : base * (1 + std::cos(pi * (e - 5) / 20)) / 2);
    expect_rates(rates(sgd, scheduler, steps), want, "SequentialLR");
  }
  optim::SGD sgd({p}, optim::SGDOptions(base));
  EXPECT_THROW(optim::StepLR(sgd, 0), ValueError);
  EXPECT_THROW(optim::LinearLR(sgd, 0.0), ValueError);
  EXPECT_THROW(optim::SequentialLR(sgd, {std::make_shared<optim::StepLR>(sgd, 2)}, {3}),
               ValueError);
}

// AdamW with the rate tensor its step reads in view.
class AdamWShowingItsRate : public optim::AdamW {
 public:
  using AdamW::AdamW;
  using Optimizer::lr_tensor;
};

// A rate that changes every step is a value the step's kernels read, not a constant in its
// graph: a cosine-scheduled AdamW step reuses one schedule from its third step on, writes its
// state in place, and follows the update rule with each step's rate. Each new rate is written
// where the last lay, so a step (and a CUDA graph recorded from one) reads it at one address.
TEST(LRScheduler, AScheduledStepIsTheSameGraphEveryStep) {
  Tensor p = from_vector(kStart, {2}, kFloat64).requires_grad_();
  AdamWShowingItsRate optimizer({p}, optim::AdamWOptions(0.1).weight_decay(0.2));
  std::vector<const void*> rate_addresses;
  optim::CosineAnnealingLR scheduler(optimizer, 4);
  Vec lrs;
  std::vector<Vec> got;
  for (size_t step = 0; step < kGrads.size(); ++step) {
    optimizer.zero_grad();
    p.mutable_grad() = from_vector(kGrads[step], {2}, kFloat64);
    lrs.push_back(optimizer.param_groups()[0].options().get_lr());
    reset_eval_stats();
    optimizer.step();
    const Tensor& rate = optimizer.lr_tensor(0, Device::cpu());
    rate_addresses.push_back(rate.value()->buffer->data());
    EXPECT_EQ(rate.item<double>(), lrs.back()) << "step " << step;
    scheduler.step();
    got.push_back(p.to_vector<double>());
    if (step >= 2) {
      EXPECT_EQ(eval_stats().schedule_cache_hits, 1) << "step " << step;
      EXPECT_EQ(eval_stats().in_place_outputs, 3) << "step " << step;
    }
  }
  EXPECT_NE(lrs[1], lrs[2]);
  for (size_t step = 1; step < rate_addresses.size(); ++step)
    EXPECT_EQ(rate_addresses[step], rate_addresses[0]) << "step " << step;
  expect_trajectory(got, reference_adamw_scheduled(lrs, 0.2));
}

// clip_grad_norm_ against the norms computed here in float64.
TEST(Optim, ClipGradNormScalesToTheMaxNorm) {
  const Vec ga = {3.0, -4.0}, gb = {12.0};
  auto make = [&](std::vector<Tensor>& params) {
    params = {zeros({2}, kFloat64).requires_grad_(), zeros({1}, kFloat64).requires_grad_(),
              zeros({1}, kFloat64).requires_grad_()};  // the last has no gradient
    params[0].mutable_grad() = from_vector(ga, {2}, kFloat64);
    params[1].mutable_grad() = from_vector(gb, {1}, kFloat64);
  };
  std::vector<Tensor> params;
  make(params);
  Tensor norm = nn::utils::clip_grad_norm_(params, 6.5);
  EXPECT_DOUBLE_EQ(norm.item<double>(), 13.0);  // sqrt(9 + 16 + 144)
  const double c = 6.5 / (13.0 + 1e-6);
  EXPECT_NEAR(params[0].grad().to_vector<double>()[1], -4.0 * c, 1e-14);
  EXPECT_NEAR(params[1].grad().to_vector<double>()[0], 12.0 * c, 1e-14);
  EXPECT_FALSE(params[2].grad().defined());
  make(params);
  norm = nn::utils::clip_grad_norm_(params, 100.0);  // below the max: unchanged
  EXPECT_EQ(params[0].grad().to_vector<double>(), ga);
  make(params);
  norm = nn::utils::clip_grad_norm_(params, 6.0, std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(norm.item<double>(), 12.0);
  EXPECT_NEAR(params[1].grad().to_vector<double>()[0], 12.0 * 6.0 / (12.0 + 1e-6), 1e-14);
  make(params);
  norm = nn::utils::clip_grad_norm_(params, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(norm.item<double>(), 19.0);
  make(params);
  params[1].mutable_grad() = from_vector({std::nan("")}, {1}, kFloat64);
  EXPECT_THROW(nn::utils::clip_grad_norm_(params, 1.0, 2.0, true), ValueError);
  EXPECT_EQ(params[0].grad().to_vector<double>(), ga);  // nothing scaled
}

// Adam's step size and bias correction are written once for the parameters stepped together
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
  // The step size and the bias correction, read by every parameter's update.
  EXPECT_GE(one - per_parameter, 2);
}

// clip_grad_norm_'s norm is computed with the step that its scaling fuses into: reading it after
// the step evaluates nothing more (before, it stayed pending, and printing it ran the forward
// and backward passes a second time).
TEST(Optim, AClippedStepComputesTheNormWithIt) {
  manual_seed(5);
  nn::Sequential net(nn::Linear(4, 8), nn::Tanh(), nn::Linear(8, 3));
  optim::SGD optimizer(net.parameters(), optim::SGDOptions(0.1));
  Tensor x = randn({16, 4});
  Tensor y = tensor({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, kInt64);
  eval({x, y});
  // The gradients' norm, from the same gradients evaluated on their own.
  optimizer.zero_grad();
  nn::functional::cross_entropy(net(x), y).backward();
  double squares = 0;
  for (const Tensor& p : net.parameters())
    for (double g : p.grad().to_vector<double>()) squares += g * g;
  const double want = std::sqrt(squares);

  optimizer.zero_grad();
  const Tensor loss = nn::functional::cross_entropy(net(x), y);
  loss.backward();
  const Tensor norm = nn::utils::clip_grad_norm_(net.parameters(), 0.5);
  reset_eval_stats();
  optimizer.step();
  EXPECT_EQ(eval_stats().evaluations, 1);
  EXPECT_TRUE(norm.is_computed());
  EXPECT_TRUE(loss.is_computed());
  EXPECT_NEAR(norm.item<double>(), want, 1e-5 * want);
  EXPECT_EQ(eval_stats().evaluations, 1) << "reading the norm evaluated again";
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

// Gradient accumulation as PyTorch users write it: backward() of each micro-batch's loss over
// their count, then one step. The gradients are those of the whole batch at once (to rounding:
// the sums are ordered otherwise), and the micro-batches' forwards and backwards, their sums and
// the update are one evaluation with the step.
TEST(Optim, AccumulatedMicroBatchesStepAsTheirWholeBatchInOneEvaluation) {
  manual_seed(5);
  nn::Sequential net(nn::Linear(4, 8), nn::GELU(), nn::Linear(8, 3));
  Tensor x = randn({16, 4});
  Tensor y = tensor({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, kInt64);
  eval({x, y});
  auto gradients = [&](int micro_batches) {
    net.zero_grad();
    const int64_t size = 16 / micro_batches;
    for (int m = 0; m < micro_batches; ++m) {
      const Tensor loss = nn::functional::cross_entropy(net(x.narrow(0, m * size, size)),
                                                        y.narrow(0, m * size, size));
      (loss / micro_batches).backward();
    }
    std::vector<Vec> grads;
    for (const Tensor& p : net.parameters()) grads.push_back(p.grad().to_vector<double>());
    return grads;
  };
  const std::vector<Vec> whole = gradients(1), accumulated = gradients(4);
  ASSERT_EQ(whole.size(), accumulated.size());
  for (size_t i = 0; i < whole.size(); ++i)
    for (size_t j = 0; j < whole[i].size(); ++j)
      EXPECT_NEAR(accumulated[i][j], whole[i][j], 1e-6 + 1e-5 * std::abs(whole[i][j]));

  optim::AdamW optimizer(net.parameters(), optim::AdamWOptions(1e-2));
  optimizer.zero_grad();
  std::vector<Tensor> losses;
  for (int m = 0; m < 4; ++m) {
    losses.push_back(
        nn::functional::cross_entropy(net(x.narrow(0, 4 * m, 4)), y.narrow(0, 4 * m, 4)));
    // backward's gradient scales the micro-batch's loss, which stays the root the step computes
    // (as (loss / 4).backward() leaves loss / 4 computed, not loss).
    losses.back().backward(scalar_tensor(0.25));
  }
  reset_eval_stats();
  optimizer.step();
  EXPECT_EQ(eval_stats().evaluations, 1);
  for (const Tensor& loss : losses) EXPECT_TRUE(loss.is_computed());
}

// A residual network of pre-LayerNorm blocks (x + fc2(gelu(fc1(ln(x))))), as a transformer's
// MLP half is written: each block reads the stream twice. Its training step, forward, backward
// and AdamW, is one evaluation of the same graph every step: the same kernels, its schedule
// reused from the third step, every parameter and moment written into its own buffer. (The
// pending bound once counted the stream's nodes once per path, doubling per block, and cut
// this step into dozens of evaluations.)
TEST(Optim, AResidualNetworksStepIsOneEvaluationOfTheSameGraph) {
  manual_seed(5);
  const int64_t width = 16, blocks = 12;
  struct Block {
    nn::LayerNorm norm;
    nn::Linear fc1, fc2;
  };
  std::vector<Block> net;
  std::vector<Tensor> parameters;
  for (int64_t b = 0; b < blocks; ++b) {
    net.push_back(
        {nn::LayerNorm({width}), nn::Linear(width, 2 * width), nn::Linear(2 * width, width)});
    for (nn::Module* m :
         {static_cast<nn::Module*>(&net.back().norm), static_cast<nn::Module*>(&net.back().fc1),
          static_cast<nn::Module*>(&net.back().fc2)})
      for (const Tensor& p : m->parameters()) parameters.push_back(p);
  }
  optim::AdamW optimizer(parameters, optim::AdamWOptions(1e-3));
  Tensor x = randn({8, width}), target = randn({8, width});
  eval({x, target});
  const int64_t held = pending_values();
  int64_t kernels = -1;
  for (int step = 0; step < 4; ++step) {
    optimizer.zero_grad();
    // The stream is not held past the loss: a pending value the user holds would still read
    // the parameters' old values, which then could not be overwritten.
    Tensor loss = [&] {
      Tensor h = x;
      for (Block& block : net) h = h + block.fc2(nn::functional::gelu(block.fc1(block.norm(h))));
      return nn::functional::mse_loss(h, target);
    }();
    loss.backward();
    reset_eval_stats();
    optimizer.step();
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ(eval_stats().evaluations, 1);
    EXPECT_TRUE(loss.is_computed());
    // The first step also starts AdamW's state from zeros; every later one is the same graph.
    if (step >= 2) EXPECT_EQ(eval_stats().kernels, kernels);
    kernels = eval_stats().kernels;
    if (step >= 2) {
      EXPECT_EQ(eval_stats().schedule_cache_hits, 1);
      EXPECT_EQ(eval_stats().in_place_outputs, 3 * static_cast<int64_t>(parameters.size()));
    }
  }
  EXPECT_EQ(pending_values(), held);  // nothing of the steps is left pending
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
