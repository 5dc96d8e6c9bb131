// A training step as users run it: an MLP of `layers` Linear+ReLU layers of `width` and a
// `classes`-way head, cross-entropy, Adam, and the loss read back every step. Two modes:
//
//   lazyfuse_train_bench [options]             times steps; prints one JSON line: the median and
//                                              mean microseconds per step, kernels (schedule
//                                              steps), launches (what the device ran: a group of
//                                              kernels is one, a staging copy one more) and
//                                              evaluations per step
//   lazyfuse_train_bench --dump=DIR [options]  writes DIR/init.safetensors (the initial
//                                              parameters, named as torch.nn.Sequential names
//                                              them), DIR/data.safetensors (one batch per step)
//                                              and DIR/lazyfuse_losses.json (the loss after each
//                                              step), for bench/train_compare.py to train the
//                                              same model in PyTorch from the same start
//
// options: --device=cuda:0 --dtype=float32|float64|bfloat16 --batch=32 --width=1024 --layers=4
//          --classes=10 --steps=100 --warmup=20 --lr=0.001 --seed=0
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/frontend/serialize.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"

namespace {

using namespace lazyfuse;

struct Config {
  Device device = Device::cpu();
  DType dtype = kFloat32;
  int64_t batch = 32, width = 1024, layers = 4, classes = 10, steps = 100, warmup = 20;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string dump;
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--device") {
      c.device = Device(value);
    } else if (key == "--dtype") {
      c.dtype = value == "float64" ? kFloat64 : value == "bfloat16" ? kBFloat16 : kFloat32;
    } else if (key == "--batch") {
      c.batch = std::stoll(value);
    } else if (key == "--width") {
      c.width = std::stoll(value);
    } else if (key == "--layers") {
      c.layers = std::stoll(value);
    } else if (key == "--classes") {
      c.classes = std::stoll(value);
    } else if (key == "--steps") {
      c.steps = std::stoll(value);
    } else if (key == "--warmup") {
      c.warmup = std::stoll(value);
    } else if (key == "--lr") {
      c.lr = std::stod(value);
    } else if (key == "--seed") {
      c.seed = std::stoull(value);
    } else if (key == "--dump") {
      c.dump = value;
    } else {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return c;
}

nn::Sequential make_model(const Config& c) {
  nn::Sequential net;
  for (int64_t i = 0; i < c.layers; ++i) {
    net.push_back(std::make_shared<nn::Linear>(c.width, c.width));
    net.push_back(std::make_shared<nn::ReLU>());
  }
  net.push_back(std::make_shared<nn::Linear>(c.width, c.classes));
  net.to(c.device);
  net.to(c.dtype);
  return net;
}

// `count` batches of inputs and labels, drawn on the device.
std::pair<Tensor, Tensor> make_data(const Config& c, int64_t count) {
  Tensor x = randn({count, c.batch, c.width}, TensorOptions(kFloat32).device(c.device)).to(c.dtype);
  Tensor y = (rand({count, c.batch}, TensorOptions(kFloat32).device(c.device)) * c.classes)
                 .to(kInt64)
                 .clamp_max(c.classes - 1);
  eval({x, y});
  return {x, y};
}

// Every digit: the comparison with PyTorch is at float64 precision.
std::string json_number(double x) { return absl::StrFormat("%.17g", x); }

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  manual_seed(c.seed);
  nn::Sequential net = make_model(c);
  optim::Adam optimizer(net.parameters(), optim::AdamOptions(c.lr));
  const int64_t batches = c.dump.empty() ? 8 : c.steps;
  auto [x, y] = make_data(c, batches);
  std::vector<std::pair<Tensor, Tensor>> data;
  std::vector<Tensor> slices;
  for (int64_t b = 0; b < batches; ++b) {
    data.emplace_back(x.narrow(0, b, 1).squeeze(0), y.narrow(0, b, 1).squeeze(0));
    slices.insert(slices.end(), {data.back().first, data.back().second});
  }
  eval(slices);

  if (!c.dump.empty()) {
    std::filesystem::create_directories(c.dump);
    save_safetensors(c.dump + "/init.safetensors", net.named_parameters());
    save_safetensors(c.dump + "/data.safetensors", {{"x", x}, {"y", y}});
  }

  auto step = [&](int64_t s) {
    const auto& [inputs, labels] = data[s % batches];
    optimizer.zero_grad();
    Tensor loss = nn::functional::cross_entropy(net(inputs), labels);
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  };

  if (!c.dump.empty()) {
    std::vector<std::string> losses;
    for (int64_t s = 0; s < c.steps; ++s) losses.push_back(json_number(step(s)));
    std::ofstream(c.dump + "/lazyfuse_losses.json") << "[" << absl::StrJoin(losses, ", ") << "]\n";
    std::printf("wrote %s/{init,data}.safetensors and lazyfuse_losses.json (%lld steps)\n",
                c.dump.c_str(), static_cast<long long>(c.steps));
    return 0;
  }

  for (int64_t s = 0; s < c.warmup; ++s) step(s);
  reset_eval_stats();
  cuda::reset_graph_stats();
  std::vector<double> micros;
  for (int64_t s = 0; s < c.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    step(s);
    micros.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  const EvalStats stats = eval_stats();
  const cuda::GraphStats graphs = cuda::graph_stats();
  std::vector<double> sorted = micros;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double m : micros) mean += m / micros.size();
  std::printf(
      "{\"peer\": \"lazyfuse\", \"device\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, "
      "\"width\": %lld, \"layers\": %lld, \"us_per_step_median\": %.1f, \"us_per_step_mean\": "
      "%.1f, \"kernels_per_step\": %.1f, \"launches_per_step\": %.1f, "
      "\"evaluations_per_step\": %.2f, \"cuda_graphs\": \"%s\", \"graph_replays_per_step\": "
      "%.2f, \"graph_captures\": %lld}\n",
      c.device.str().c_str(), dtype_torch_name(c.dtype), static_cast<long long>(c.batch),
      static_cast<long long>(c.width), static_cast<long long>(c.layers), sorted[sorted.size() / 2],
      mean, static_cast<double>(stats.kernels) / c.steps,
      static_cast<double>(stats.launches) / c.steps,
      static_cast<double>(stats.evaluations) / c.steps,
      cuda::graph_mode() == cuda::GraphMode::Off  ? "off"
      : cuda::graph_mode() == cuda::GraphMode::On ? "on"
                                                  : "always",
      static_cast<double>(graphs.replays) / c.steps, static_cast<long long>(graphs.captures));
  return 0;
}
