// Attention as users run it: scaled_dot_product_attention (the API), the same attention written
// by hand (the pattern fusion recognises), and the hand-written form with fused attention off
// (its matmuls and softmax as written), forward and forward+backward, timed per evaluation.
// Prints one JSON line per case: the median milliseconds, TFLOP/s as FlashAttention counts them
// (forward 4 B H T S d, halved under a causal mask; backward 2.5 times the forward) and the
// device's peak memory over the timed evaluations. bench/attention_peers.py runs PyTorch's and
// JAX's on the same shapes; scripts/gpu-bench.sh runs both.
//
// options: --device=cuda:0 --dtype=bfloat16|float16|float32 --shape=gpt2|long|padded|B,H,T,d
//          --form=api|hand|composite --backward --causal=auto|0|1 --iters=20 --warmup=3
//   gpt2: B 8, H 12, T 1024, d 64, causal; long: B 2, H 16, T 8192, d 128, causal;
//   padded: B 8, H 12, T 1024, d 64, not causal, a key padding mask hiding the last eighth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/stats.h"

namespace {

using namespace lazyfuse;

struct Config {
  Device device = Device::cpu();
  DType dtype = kBFloat16;
  std::string shape = "gpt2", form = "api";
  int64_t b = 8, h = 12, t = 1024, d = 64;
  bool causal = true, padded = false, backward = false;
  int iters = 20, warmup = 3;
};

Config parse(int argc, char** argv) {
  Config c;
  std::string causal = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--device") c.device = Device(value);
    if (key == "--dtype")
      c.dtype = value == "float16" ? kFloat16 : value == "float32" ? kFloat32 : kBFloat16;
    if (key == "--shape") c.shape = value;
    if (key == "--form") c.form = value;
    if (key == "--backward") c.backward = true;
    if (key == "--causal") causal = value;
    if (key == "--iters") c.iters = std::stoi(value);
    if (key == "--warmup") c.warmup = std::stoi(value);
  }
  if (c.shape == "long") {
    c.b = 2, c.h = 16, c.t = 8192, c.d = 128;
  } else if (c.shape == "padded") {
    c.causal = false, c.padded = true;
  } else if (c.shape != "gpt2") {
    std::sscanf(c.shape.c_str(), "%lld,%lld,%lld,%lld", reinterpret_cast<long long*>(&c.b),
                reinterpret_cast<long long*>(&c.h), reinterpret_cast<long long*>(&c.t),
                reinterpret_cast<long long*>(&c.d));
  }
  if (causal != "auto") c.causal = causal == "1";
  return c;
}

// The attention as a model author writes it by hand.
Tensor by_hand(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seen, bool causal) {
  Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const double minus_infinity = -std::numeric_limits<double>::infinity();
  if (causal) {
    const TensorOptions positions = TensorOptions(kInt64).device(q.device());
    const Tensor future =
        arange(k.size(-2), positions).unsqueeze(0) > arange(q.size(-2), positions).unsqueeze(1);
    scores = scores.masked_fill(future, minus_infinity);
  }
  if (seen.defined()) scores = where(seen, scores, minus_infinity);
  return softmax(scores, -1).matmul(v);
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  nn::functional::set_fused_attention_enabled(c.form != "composite");
  manual_seed(0);
  const TensorOptions options = TensorOptions(c.dtype).device(c.device);
  Tensor q = randn({c.b, c.h, c.t, c.d}, options), k = randn({c.b, c.h, c.t, c.d}, options),
         v = randn({c.b, c.h, c.t, c.d}, options);
  // A key padding mask [B, 1, 1, T]: the last eighth of each sequence's keys are padding.
  Tensor seen;
  if (c.padded)
    seen = (arange(c.t, TensorOptions(kInt64).device(c.device)) < c.t - c.t / 8)
               .reshape({1, 1, 1, c.t})
               .expand({c.b, 1, 1, c.t});
  eval({q, k, v});
  if (seen.defined()) eval(seen);
  if (c.backward) {
    q.requires_grad_();
    k.requires_grad_();
    v.requires_grad_();
  }
  const Tensor g = randn({c.b, c.h, c.t, c.d}, options);
  eval(g);
  auto once = [&] {
    const Tensor out =
        c.form == "api" ? nn::functional::scaled_dot_product_attention(q, k, v, seen, 0.0, c.causal)
                        : by_hand(q, k, v, seen, c.causal);
    if (!c.backward) {
      eval(out);
    } else {
      const std::vector<Tensor> grads = grad({out}, {q, k, v}, {g});
      eval(grads);
    }
    // Waits for the device: a one-element read.
    (void)out.detach().reshape({-1}).narrow(0, 0, 1).item<double>();
  };
  for (int i = 0; i < c.warmup; ++i) once();
  reset_peak_memory_stats();
  std::vector<double> ms;
  for (int i = 0; i < c.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    once();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  double forward_flops = 4.0 * c.b * c.h * c.t * c.t * c.d;
  if (c.causal) forward_flops /= 2;
  const double flops = c.backward ? 3.5 * forward_flops : forward_flops;
  int64_t peak = 0;
  for (const DeviceMemoryStats& m : stats().memory)
    if (m.device == c.device) peak = m.peak_bytes;
  std::printf(
      "{\"workload\": \"attention\", \"shape\": \"%s\", \"b\": %lld, \"h\": %lld, \"t\": %lld, "
      "\"d\": %lld, \"causal\": %s, \"padded\": %s, \"dtype\": \"%s\", \"device\": \"%s\", "
      "\"form\": \"%s\", \"pass\": \"%s\", \"ms_median\": %.4f, \"tflops\": %.2f, "
      "\"peak_bytes\": %lld}\n",
      c.shape.c_str(), static_cast<long long>(c.b), static_cast<long long>(c.h),
      static_cast<long long>(c.t), static_cast<long long>(c.d), c.causal ? "true" : "false",
      c.padded ? "true" : "false", std::string(dtype_torch_name(c.dtype)).c_str(),
      c.device.str().c_str(), c.form.c_str(), c.backward ? "forward+backward" : "forward", median,
      flops / (median * 1e-3) / 1e12, static_cast<long long>(peak));
  return 0;
}
