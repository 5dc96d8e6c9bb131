// A GPT training step as nanoGPT writes it (token and position embeddings, pre-LayerNorm blocks of
// causal multi-head attention and a tanh-GELU MLP, the head tied to the token embedding,
// cross-entropy, AdamW with weight decay on the matrices only), timed as a user runs it: the
// wall time of each step, the loss read back on the host every step, the median after warm-up.
// bench/gpt_peers.py runs the same model in PyTorch (eager and torch.compile) from the same
// weights and batches: both sides draw them from one closed-form formula (`draw` below), so the
// first losses agree and are printed.
//
//   lazyfuse_gpt_step [--device=cpu] [--layers=2] [--width=128] [--heads=4] [--seq=64]
//                     [--batch=4] [--vocab=65] [--steps=20] [--warmup=5]
//
// Prints one JSON line: the median and mean milliseconds per step; of the last step, its
// evaluations, kernels, values written in place, schedule-cache hits and programs the CPU JIT
// compiled; and the first three losses.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/lazyfuse.h"

namespace {

using namespace lazyfuse;
namespace F = lazyfuse::nn::functional;

struct Config {
  Device device = Device::cpu();
  int64_t layers = 2, width = 128, heads = 4, seq = 64, batch = 4, vocab = 65, steps = 20,
          warmup = 5;
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "--device") c.device = Device(value);
    if (key == "--layers") c.layers = std::stoll(value);
    if (key == "--width") c.width = std::stoll(value);
    if (key == "--heads") c.heads = std::stoll(value);
    if (key == "--seq") c.seq = std::stoll(value);
    if (key == "--batch") c.batch = std::stoll(value);
    if (key == "--vocab") c.vocab = std::stoll(value);
    if (key == "--steps") c.steps = std::stoll(value);
    if (key == "--warmup") c.warmup = std::stoll(value);
  }
  return c;
}

// Weights in [-scale, scale) from a closed form of (tensor id, element): the same numbers in
// bench/gpt_peers.py, computed there in float64 by numpy.
Tensor draw(int64_t id, Shape shape, double scale, const Device& device) {
  std::vector<double> values(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) {
    const double x =
        std::sin(static_cast<double>(i) * 12.9898 + static_cast<double>(id) * 78.233) * 43758.5453;
    values[i] = (2 * (x - std::floor(x)) - 1) * scale;
  }
  Tensor t = from_vector(values, std::move(shape), TensorOptions(kFloat32).device(device));
  eval(t);
  return t.requires_grad_();
}

// Token ids of batch `step`: the same formula in bench/gpt_peers.py.
Tensor tokens(const Config& c, int64_t step, int64_t shift) {
  std::vector<double> ids(static_cast<size_t>(c.batch * c.seq));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] =
        static_cast<double>((static_cast<int64_t>(i + shift) * 7919 + step * 104729) % c.vocab);
  Tensor t = from_vector(ids, {c.batch, c.seq}, TensorOptions(kInt64).device(c.device));
  eval(t);
  return t;
}

struct Block {
  Tensor ln1_w, ln1_b, attn_w, attn_b, attn_proj_w, attn_proj_b;
  Tensor ln2_w, ln2_b, fc_w, fc_b, mlp_proj_w, mlp_proj_b;
};

struct Gpt {
  Tensor wte, wpe, lnf_w, lnf_b;
  std::vector<Block> blocks;
};

Gpt make_gpt(const Config& c) {
  const int64_t C = c.width;
  const double s = 0.02, proj = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  int64_t id = 0;
  auto ones_like_ln = [&](double v) {
    Tensor t = full({C}, v, TensorOptions(kFloat32).device(c.device));
    eval(t);
    ++id;
    return t.requires_grad_();
  };
  Gpt g;
  g.wte = draw(id++, {c.vocab, C}, s, c.device);
  g.wpe = draw(id++, {c.seq, C}, s, c.device);
  for (int64_t l = 0; l < c.layers; ++l) {
    Block b;
    b.ln1_w = ones_like_ln(1), b.ln1_b = ones_like_ln(0);
    b.attn_w = draw(id++, {3 * C, C}, s, c.device), b.attn_b = draw(id++, {3 * C}, s, c.device);
    b.attn_proj_w = draw(id++, {C, C}, proj, c.device);
    b.attn_proj_b = draw(id++, {C}, s, c.device);
    b.ln2_w = ones_like_ln(1), b.ln2_b = ones_like_ln(0);
    b.fc_w = draw(id++, {4 * C, C}, s, c.device), b.fc_b = draw(id++, {4 * C}, s, c.device);
    b.mlp_proj_w = draw(id++, {C, 4 * C}, proj, c.device);
    b.mlp_proj_b = draw(id++, {C}, s, c.device);
    g.blocks.push_back(b);
  }
  g.lnf_w = ones_like_ln(1), g.lnf_b = ones_like_ln(0);
  return g;
}

// nanoGPT's CausalSelfAttention, written by hand as it is there without flash attention.
Tensor attention(const Config& c, const Block& b, const Tensor& x, const Tensor& future) {
  const int64_t B = x.size(0), T = x.size(1), C = c.width, H = c.heads, hd = C / H;
  const Tensor qkv = F::linear(x, b.attn_w, b.attn_b);
  auto heads = [&](int64_t part) {
    return qkv.narrow(2, part * C, C).reshape({B, T, H, hd}).transpose(1, 2);
  };
  const Tensor q = heads(0), k = heads(1), v = heads(2);
  Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  att = F::softmax(where(future, -INFINITY, att), -1);
  const Tensor y = att.matmul(v).transpose(1, 2).contiguous().reshape({B, T, C});
  return F::linear(y, b.attn_proj_w, b.attn_proj_b);
}

Tensor loss_of(const Config& c, const Gpt& g, const Tensor& idx, const Tensor& targets,
               const Tensor& future) {
  const int64_t C = c.width;
  Tensor x = F::embedding(idx, g.wte) + g.wpe;
  for (const Block& b : g.blocks) {
    x = x + attention(c, b, F::layer_norm(x, {C}, b.ln1_w, b.ln1_b), future);
    const Tensor h =
        F::gelu(F::linear(F::layer_norm(x, {C}, b.ln2_w, b.ln2_b), b.fc_w, b.fc_b), "tanh");
    x = x + F::linear(h, b.mlp_proj_w, b.mlp_proj_b);
  }
  const Tensor logits = F::linear(F::layer_norm(x, {C}, g.lnf_w, g.lnf_b), g.wte);
  return F::cross_entropy(logits.reshape({-1, c.vocab}), targets.reshape({-1}));
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  Gpt gpt = make_gpt(c);
  // nanoGPT's groups: matrices (and the embeddings) decayed, biases and norms not.
  std::vector<Tensor> decayed = {gpt.wte, gpt.wpe}, plain = {gpt.lnf_w, gpt.lnf_b};
  for (const Block& b : gpt.blocks) {
    for (const Tensor& t : {b.attn_w, b.attn_proj_w, b.fc_w, b.mlp_proj_w}) decayed.push_back(t);
    for (const Tensor& t :
         {b.ln1_w, b.ln1_b, b.attn_b, b.attn_proj_b, b.ln2_w, b.ln2_b, b.fc_b, b.mlp_proj_b})
      plain.push_back(t);
  }
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<optim::AdamWOptions>(
                                   optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1)));
  groups.emplace_back(plain, std::make_unique<optim::AdamWOptions>(
                                 optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0)));
  optim::AdamW optimizer(groups, optim::AdamWOptions(6e-4));
  const Tensor positions = arange(c.seq, TensorOptions(kInt64).device(c.device));
  Tensor future = positions.reshape({1, c.seq}) > positions.reshape({c.seq, 1});
  eval(future);

  std::vector<double> times, losses;
  EvalStats per_step;
  int64_t jit_compiles = 0;  // in the timed steps: 0 once the CPU JIT has compiled the step's loops
  for (int64_t s = 0; s < c.warmup + c.steps; ++s) {
    const Tensor idx = tokens(c, s, 0), targets = tokens(c, s, 1);
    const int64_t compiled_before = cpu_jit_stats().compiled;
    const auto start = std::chrono::steady_clock::now();
    reset_eval_stats();
    optimizer.zero_grad();
    const Tensor loss = loss_of(c, gpt, idx, targets, future);
    loss.backward();
    optimizer.step();
    const double value = loss.item<double>();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (losses.size() < 3) losses.push_back(value);
    if (s >= c.warmup) times.push_back(ms);
    per_step = eval_stats();
    if (s >= c.warmup) jit_compiles += cpu_jit_stats().compiled - compiled_before;
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double t : times) mean += t / static_cast<double>(times.size());
  std::printf(
      "%s\n",
      absl::StrFormat("{\"impl\": \"lazyfuse\", \"device\": \"%s\", \"layers\": %d, \"width\": %d, "
                      "\"seq\": %d, \"batch\": %d, \"ms_per_step_median\": %.3f, "
                      "\"ms_per_step_mean\": %.3f, \"evaluations\": %d, \"kernels\": %d, "
                      "\"in_place\": %d, \"cache_hits\": %d, \"jit_compiles\": %d, "
                      "\"losses\": [%.7f, %.7f, %.7f]}",
                      c.device.str(), c.layers, c.width, c.seq, c.batch, sorted[sorted.size() / 2],
                      mean, per_step.evaluations, per_step.kernels, per_step.in_place_outputs,
                      per_step.schedule_cache_hits, jit_compiles, losses[0], losses[1], losses[2])
          .c_str());
  return 0;
}
