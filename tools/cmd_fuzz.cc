// lazyfuse fuzz: random graphs over the ops, dtypes, broadcasts, views and reductions, each
// evaluated fused and unfused. On the CPU the two must agree bit for bit (every value is rounded
// to its dtype after each op, so fusion may not change a result); on a GPU the fused result is
// compared with the CPU's, within a per-dtype tolerance. A mismatch prints the graph as IR
// text, which `lazyfuse run FILE --check` replays.
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "absl/strings/str_format.h"
#include "frontend/tensor.h"
#include "ir/errors.h"
#include "runtime/devices.h"
#include "runtime/lazy.h"
#include "tools/commands.h"

namespace lazyfuse::tools {
namespace {

constexpr DType kDTypes[] = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kBool};

// One random graph, built through the public API; the same seed builds the same graph.
struct RandomGraph {
  std::vector<Tensor> outputs;
};

RandomGraph build(uint64_t seed, const Device& device) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const int64_t sizes[] = {1, 2, 3, 5, 8, 17};
  Shape base;
  for (int d = 0, rank = 1 + pick(3); d < rank; ++d) base.push_back(sizes[pick(6)]);
  std::vector<Tensor> pool;
  for (int i = 0, inputs = 1 + pick(3); i < inputs; ++i) {
    Shape shape = base;
    for (int64_t& s : shape)
      if (pick(4) == 0) s = 1;  // broadcast along this dim
    if (shape.size() > 1 && pick(4) == 0) shape.erase(shape.begin());
    DType dtype = kDTypes[pick(7)];
    std::vector<double> values(numel(shape));
    for (double& v : values)
      v = dtype == kBool       ? pick(2)
          : is_integral(dtype) ? pick(10)
                               : 0.5 + static_cast<double>(rng() % 1000) / 1000;
    pool.push_back(from_vector(values, shape, TensorOptions().dtype(dtype).device(device)));
  }
  auto any = [&]() -> Tensor& {
    return pool[pool.size() - 1 - pick(std::min<int>(4, pool.size()))];
  };
  for (int step = 0, steps = 3 + pick(10); step < steps; ++step) {
    try {
      Tensor& a = any();
      Tensor& b = any();
      Tensor out;
      switch (pick(12)) {
        case 0:
          out = a + b;
          break;
        case 1:
          out = a * b;
          break;
        case 2:
          out = a - b;
          break;
        case 3:
          out = a / (b.abs() + 1);
          break;
        case 4: {
          const int which = pick(6);
          Tensor positive = a.abs() + 0.5;
          out = which == 0   ? positive.log()
                : which == 1 ? positive.sqrt()
                : which == 2 ? a.tanh()
                : which == 3 ? a.sigmoid()
                : which == 4 ? a.sin()
                             : a.relu();
          break;
        }
        case 5:
          out = maximum(a, b);
          break;
        case 6:
          out = where(a > b, a, b);
          break;
        case 7:
          out = a.to(kDTypes[pick(7)]);
          break;
        case 8: {
          if (a.dim() == 0) continue;
          const int which = pick(4);
          const bool keepdim = pick(2);
          std::vector<int64_t> dims = {-1 - pick(static_cast<int>(a.dim()))};
          if (which == 0)
            out = a.sum(dims, keepdim);
          else if (which == 1)
            out = a.to(kFloat32).mean(dims, keepdim);
          else
            out = which == 2 ? a.max(dims[0], keepdim) : a.min(dims[0], keepdim);
          break;
        }
        case 9: {
          if (a.dim() < 2) continue;
          out = a.transpose(0, a.dim() - 1) * 1;
          break;
        }
        case 10: {
          if (a.dim() == 0 || a.size(0) < 2) continue;
          out = a.narrow(0, 1, a.size(0) - 1).exp();
          break;
        }
        default: {
          if (a.dim() == 0) continue;
          Tensor e = (a.to(kFloat32) - a.to(kFloat32).max(-1, true)).exp();
          out = e / e.sum({-1}, true);  // softmax
        }
      }
      pool.push_back(out);
    } catch (const Error&) {
      // An op the operands do not allow (bool negation, shapes that do not broadcast): skip.
    }
  }
  RandomGraph graph;
  for (int i = 0, n = 1 + pick(2); i < n && i < static_cast<int>(pool.size()); ++i)
    graph.outputs.push_back(pool[pool.size() - 1 - i]);
  return graph;
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

double tolerance(DType dtype) {
  return dtype == kFloat64    ? 1e-9
         : dtype == kFloat32  ? 1e-4
         : dtype == kFloat16  ? 1e-2
         : is_floating(dtype) ? 5e-2
                              : 0;
}

}  // namespace

int fuzz(uint64_t seed, int64_t graphs, const std::string& device_name) {
  const Device device = resolve_device(Device(device_name));
  int64_t mismatches = 0, evaluated = 0;
  for (int64_t g = 0; g < graphs; ++g) {
    const uint64_t graph_seed = seed * 1000003 + static_cast<uint64_t>(g);
    RandomGraph fused = build(graph_seed, device);
    RandomGraph reference = build(graph_seed, Device::cpu());
    if (fused.outputs.empty()) continue;
    std::string ir;
    {
      std::vector<LazyRef> values;
      for (const Tensor& t : fused.outputs) values.push_back(t.value());
      ir = print_graph(build_graph(values).graph);
    }
    try {
      eval(fused.outputs);
      eval(reference.outputs, EvalOptions{.fusion = false});
    } catch (const Error& e) {
      // An evaluation that throws on a graph the frontend accepted is a bug too.
      ++mismatches;
      std::cout << absl::StrFormat("ERROR: graph %d (seed %d): %s\n", g, graph_seed, e.what()) << ir
                << "\n";
      continue;
    }
    ++evaluated;
    for (size_t k = 0; k < fused.outputs.size(); ++k) {
      std::vector<double> got = fused.outputs[k].to_vector<double>();
      std::vector<double> want = reference.outputs[k].to_vector<double>();
      const double tol = device.is_cpu() ? 0 : tolerance(fused.outputs[k].dtype());
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        bad += !same_value(got[i], want[i]) &&
               !(std::fabs(got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
      if (bad == 0) continue;
      ++mismatches;
      std::cout << absl::StrFormat(
                       "MISMATCH: graph %d (seed %d), output %d: %d of %d elements differ\n", g,
                       graph_seed, k, bad, got.size())
                << ir << "\n";
    }
  }
  std::cout << absl::StrFormat(
      "%d graphs evaluated on %s, fused against unfused%s: %d mismatches\n", evaluated,
      device.str(), device.is_cpu() ? " (bit for bit)" : " on the CPU", mismatches);
  return mismatches ? 1 : 0;
}

}  // namespace lazyfuse::tools
