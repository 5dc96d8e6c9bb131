// gradcheck: the gradients a function's output gives its inputs, analytic (lazyfuse::grad)
// against float64 central differences of the forward pass, for a random cotangent v. The
// forward ops are checked against the independent float64 reference in tests/ops/, so the
// analytic gradients are checked against something the gradient code never touches.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lazyfuse/lazyfuse.h"

namespace lazyfuse::testing_gradcheck {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Domain {
  double lo = -2, hi = 2;
  double min_magnitude = 0;  // keep |x| at least this (away from kinks and poles)
};

inline std::vector<double> draw(int64_t n, const Domain& domain, std::mt19937& rng) {
  std::uniform_real_distribution<double> uniform(domain.lo, domain.hi);
  std::vector<double> out(n);
  for (double& x : out) {
    do x = uniform(rng);
    while (std::abs(x) < domain.min_magnitude);
  }
  return out;
}

// The gradients f's output gives its inputs for cotangent `v`, analytic against numeric.
inline void gradcheck(const std::string& what, const Fn& f, const std::vector<Shape>& shapes,
                      Device device = Device::cpu(), Domain domain = {}, uint32_t seed = 1) {
  SCOPED_TRACE(what + " on " + device.str());
  std::mt19937 rng(seed);
  std::vector<std::vector<double>> values;
  for (const Shape& shape : shapes) values.push_back(draw(numel(shape), domain, rng));
  auto make_inputs = [&](const std::vector<std::vector<double>>& vals, bool requires_grad) {
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor t = from_vector(vals[i], shapes[i], TensorOptions(kFloat64).device(device));
      if (requires_grad) t.requires_grad_();
      inputs.push_back(t);
    }
    return inputs;
  };

  std::vector<Tensor> inputs = make_inputs(values, true);
  Tensor out = f(inputs);
  ASSERT_TRUE(out.requires_grad());
  std::vector<double> cotangent = draw(out.numel(), {-1, 1}, rng);
  Tensor v = from_vector(cotangent, out.sizes(), TensorOptions(kFloat64).device(device));
  std::vector<Tensor> analytic = grad({out}, inputs, {v});

  NoGradGuard no_grad;
  auto objective = [&](const std::vector<std::vector<double>>& vals) {
    return (f(make_inputs(vals, false)) * v).sum().item<double>();
  };
  const double eps = 1e-6;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ASSERT_TRUE(analytic[i].defined());
    ASSERT_EQ(analytic[i].sizes(), shapes[i]);
    ASSERT_EQ(analytic[i].dtype(), kFloat64);
    ASSERT_EQ(analytic[i].device(), device);
    std::vector<double> got = analytic[i].to_vector<double>();
    for (size_t j = 0; j < values[i].size(); ++j) {
      std::vector<std::vector<double>> plus = values, minus = values;
      plus[i][j] += eps;
      minus[i][j] -= eps;
      const double numeric = (objective(plus) - objective(minus)) / (2 * eps);
      EXPECT_NEAR(got[j], numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << "d/d input " << i << " element " << j;
    }
  }
}

}  // namespace lazyfuse::testing_gradcheck
