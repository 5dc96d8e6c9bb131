// An MLP classifier on three interleaved spirals in 2-D (3000 points generated here), trained
// with cross-entropy and Adam; prints the loss and the accuracy over all points per epoch.
// A linear model cannot separate the spirals (about 50%); the MLP reaches at least 95%.
//
//   build/bin/mlp_classifier          on cuda:0 when a GPU exists, else on the CPU
//   LAZYFUSE_DEBUG=1 build/bin/mlp_classifier   each training step is one evaluation
//   build/bin/lazyfuse launch --nproc=2 build/bin/mlp_classifier --distributed
//                                     data-parallel: each process trains on its share of every
//                                     minibatch (cuda:LOCAL_RANK where there is one, else the
//                                     CPU), DistributedDataParallel averaging the gradients
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/lazyfuse.h"

using namespace lazyfuse;

int main(int argc, char** argv) {
  const bool distributed = argc > 1 && std::string(argv[1]) == "--distributed";
  if (distributed) distributed::init();
  const int rank = distributed::rank(), world = distributed::world_size();
  const int gpu = distributed::local_rank();
  const Device device = cuda::device_count() > gpu ? Device(DeviceType::CUDA, gpu) : Device::cpu();
  const TensorOptions on_device = TensorOptions().device(device);
  const int64_t classes = 3, per_class = 1000, points = classes * per_class, batch_size = 100;

  // Spiral arms: radius r in [0, 1], angle growing with r, a little noise; shuffled so that
  // consecutive slices are random minibatches.
  std::mt19937 rng(42);
  std::normal_distribution<double> noise(0.0, 0.2);
  std::vector<int64_t> order(points);
  for (int64_t i = 0; i < points; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<double> xy(points * 2), label(points);
  for (int64_t i = 0; i < points; ++i) {
    const int64_t k = i / per_class, j = i % per_class;
    const double r = static_cast<double>(j) / per_class;
    const double t = 4.0 * k + 4.0 * r + noise(rng);
    xy[order[i] * 2] = r * std::sin(t);
    xy[order[i] * 2 + 1] = r * std::cos(t);
    label[order[i]] = static_cast<double>(k);
  }
  Tensor x = from_vector(xy, {points, 2}, on_device);
  Tensor y = from_vector(label, {points}, TensorOptions(kInt64).device(device));
  // This process's share of every minibatch: with one process, all of it.
  const int64_t share = batch_size / world;
  distributed::DistributedSampler sampler(points, std::nullopt, std::nullopt, /*shuffle=*/false);
  const std::vector<int64_t> mine = sampler.indices();
  std::vector<double> my_xy, my_label;
  for (int64_t i : mine) {
    my_xy.insert(my_xy.end(), {xy[i * 2], xy[i * 2 + 1]});
    my_label.push_back(label[i]);
  }
  const int64_t my_points = static_cast<int64_t>(mine.size());
  Tensor my_x = from_vector(my_xy, {my_points, 2}, on_device);
  Tensor my_y = from_vector(my_label, {my_points}, TensorOptions(kInt64).device(device));
  std::vector<std::pair<Tensor, Tensor>> batches;
  std::vector<Tensor> all = {x, y};
  for (int64_t start = 0; start + share <= my_points; start += share) {
    batches.emplace_back(my_x.narrow(0, start, share), my_y.narrow(0, start, share));
    all.insert(all.end(), {batches.back().first, batches.back().second});
  }
  eval(all);

  manual_seed(0);
  auto net = std::make_shared<nn::Sequential>(nn::Linear(2, 64), nn::ReLU(), nn::Linear(64, 64),
                                              nn::ReLU(), nn::Linear(64, classes));
  net->to(device);
  if (rank == 0)
    std::printf("%s\non %s: %lld points in %lld classes, minibatches of %lld, Adam lr 0.01\n",
                net->repr().c_str(), device.str().c_str(), static_cast<long long>(points),
                static_cast<long long>(classes), static_cast<long long>(batch_size));
  if (world > 1)
    std::printf("rank %d of %d: %lld points per minibatch\n", rank, world,
                static_cast<long long>(share));
  // With several processes, the gradients are averaged across them after each backward().
  std::optional<nn::parallel::DistributedDataParallel> ddp;
  if (distributed) ddp.emplace(net);
  optim::Adam optimizer(net->parameters(), optim::AdamOptions(0.01));
  nn::CrossEntropyLoss loss_fn;

  double accuracy = 0;
  for (int epoch = 1; epoch <= 30; ++epoch) {
    net->train();
    for (auto& [inputs, targets] : batches) {
      optimizer.zero_grad();
      Tensor loss = loss_fn((*net)(inputs), targets);
      loss.backward();
      optimizer.step();
    }
    net->eval();
    NoGradGuard no_grad;
    Tensor logits = (*net)(x);
    Tensor loss = loss_fn(logits, y);
    Tensor correct = (argmax(logits, 1) == y).to(kFloat64).mean();
    eval({loss, correct});
    accuracy = correct.item<double>();
    if (rank == 0 && (epoch == 1 || epoch % 5 == 0))
      std::printf("epoch %2d, loss %.4f, accuracy %.1f%%\n", epoch, loss.item<double>(),
                  100 * accuracy);
  }
  std::printf("%s%s\n", world > 1 ? absl::StrCat("rank ", rank, ": ").c_str() : "",
              accuracy >= 0.95 ? "reached 95% accuracy" : "did NOT reach 95% accuracy");
  if (distributed) distributed::destroy_process_group();
  return accuracy >= 0.95 ? 0 : 1;
}
