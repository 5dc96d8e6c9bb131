// Linear regression as the textbook trains it: 1000 examples drawn from y = Xw + b + noise with
// w = [2, -3.4], b = 4.2, and a Linear layer fitted by minibatch SGD on the squared error.
// Prints the loss over all examples after each epoch, then the learned w and b.
//
//   build/bin/linear_regression           on cuda:0 when a GPU exists, else on the CPU
//   LAZYFUSE_DEBUG=1 build/bin/linear_regression   each step is one evaluation
#include <cmath>
#include <cstdio>
#include <vector>

#include "lazyfuse/lazyfuse.h"

using namespace lazyfuse;

int main() {
  const Device device = cuda::is_available() ? Device("cuda:0") : Device::cpu();
  manual_seed(0);
  const Tensor true_w = tensor({2.0, -3.4}, TensorOptions().device(device)).reshape({2, 1});
  const double true_b = 4.2;
  const int64_t examples = 1000, batch_size = 10;
  Tensor features = randn({examples, 2}, TensorOptions().device(device));
  Tensor labels = matmul(features, true_w) + true_b +
                  randn({examples, 1}, TensorOptions().device(device)) * 0.01;
  // The examples are independent draws, so consecutive slices are random minibatches.
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int64_t start = 0; start < examples; start += batch_size)
    batches.emplace_back(features.narrow(0, start, batch_size),
                         labels.narrow(0, start, batch_size));
  std::vector<Tensor> all = {features, labels};
  for (auto& [x, y] : batches) all.insert(all.end(), {x, y});
  eval(all);

  nn::Linear net(2, 1);
  net.to(device);
  {
    // The textbook's initialisation: w ~ N(0, 0.01^2), b = 0.
    NoGradGuard no_grad;
    net.weight().copy_(randn({1, 2}, TensorOptions().device(device)) * 0.01);
    net.bias().zero_();
  }
  nn::MSELoss loss_fn;
  optim::SGD optimizer(net.parameters(), optim::SGDOptions(0.03));

  std::printf("linear regression on %s: %lld examples, minibatches of %lld, SGD lr 0.03\n",
              device.str().c_str(), static_cast<long long>(examples),
              static_cast<long long>(batch_size));
  for (int epoch = 1; epoch <= 3; ++epoch) {
    for (auto& [x, y] : batches) {
      optimizer.zero_grad();
      Tensor loss = loss_fn(net(x), y);
      loss.backward();
      optimizer.step();
    }
    NoGradGuard no_grad;
    std::printf("epoch %d, loss %f\n", epoch, loss_fn(net(features), labels).item<double>());
  }
  const std::vector<float> w = net.weight().to_vector<float>();
  const float b = net.bias().item<float>();
  std::printf("learned w = [%.4f, %.4f] (true [2, -3.4]), b = %.4f (true 4.2)\n", w[0], w[1], b);
  const bool close =
      std::abs(w[0] - 2.0) < 0.01 && std::abs(w[1] + 3.4) < 0.01 && std::abs(b - 4.2) < 0.01;
  std::printf("%s\n", close ? "within 0.01 of the truth" : "NOT within 0.01 of the truth");
  return close ? 0 : 1;
}
