// GPT-2 trained as nanoGPT's train.py trains it: token and position embeddings, pre-LayerNorm
// blocks of causal self-attention (scaled_dot_product_attention) and a tanh-GELU MLP, the head
// tied to the token embedding, AdamW (0.9, 0.95; weight decay 0.1 on the matrices only), linear
// warmup then cosine decay to a tenth, gradient clipping at 1.0. Parameters carry nanoGPT's
// state_dict names ("transformer.h.0.attn.c_attn.weight"), so --init reads a safetensors file
// PyTorch wrote from nanoGPT's model. Data are token shards in llm.c's format (lazyfuse::data).
//
//   build/bin/gpt2 --data='fineweb_train_*.bin' [--val='fineweb_val_*.bin'] [--config=d12]
//       [--batch=8] [--accumulate=1] [--seq=1024] [--steps=100] [--lr=6e-4] [--warmup=10]
//       [--eval-every=25]
//       [--eval-batches=4] [--init=model.safetensors] [--checkpoint=DIR] [--resume]
//       [--device=cuda:0] [--autocast=bfloat16] [--seed=1] [--peak-tflops=989] [--stop-after=N]
//       [--recompute]
//   build/bin/gpt2 --synthetic          a tiny model on a learnable shard it writes, on the CPU:
//                                       exits non-zero unless the validation loss falls below a
//                                       third of its start (what `make test` runs)
//   build/bin/lazyfuse launch --nproc=2 build/bin/gpt2 ... --distributed
//
// Each step prints its loss, rate, gradient norm, time, tokens per second (and MFU, given the
// device's peak): one line, as llm.c prints it. --checkpoint writes the model, the optimizer,
// the generator and the data's position every --eval-every steps; --resume continues from them
// and takes the steps the uninterrupted run would have taken. --recompute checkpoints each
// block (nn::utils::checkpoint): its activations are computed again in backward, not kept.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "lazyfuse/lazyfuse.h"

using namespace lazyfuse;
namespace F = lazyfuse::nn::functional;

namespace {

struct Config {
  int64_t layers = 12, heads = 12, width = 768, vocab = 50257, context = 1024;
};

Config config_named(const std::string& name) {
  if (name == "d12") return {};
  if (name == "tiny") return {2, 4, 64, 128, 64};
  throw ValueError("--config: d12 or tiny, not " + name);
}

class CausalSelfAttention : public nn::Module {
 public:
  CausalSelfAttention(const Config& c) : heads_(c.heads) {
    c_attn_ = register_module("c_attn", nn::Linear(c.width, 3 * c.width));
    c_proj_ = register_module("c_proj", nn::Linear(c.width, c.width));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const Tensor qkv = c_attn_->forward(x);
    auto head = [&](int64_t part) {
      return qkv.narrow(2, part * c, c).reshape({b, t, heads_, c / heads_}).transpose(1, 2);
    };
    const Tensor y = F::scaled_dot_product_attention(head(0), head(1), head(2), {}, 0.0, true);
    return c_proj_->forward(y.transpose(1, 2).contiguous().reshape({b, t, c}));
  }

 private:
  int64_t heads_;
  std::shared_ptr<nn::Linear> c_attn_, c_proj_;
};

class Block : public nn::Module {
 public:
  explicit Block(const Config& c) {
    ln_1_ = register_module("ln_1", nn::LayerNorm(std::vector<int64_t>{c.width}));
    attn_ = register_module("attn", CausalSelfAttention(c));
    ln_2_ = register_module("ln_2", nn::LayerNorm(std::vector<int64_t>{c.width}));
    auto mlp = std::make_shared<nn::ModuleDict>();
    mlp->insert("c_fc", nn::Linear(c.width, 4 * c.width));
    mlp->insert("c_proj", nn::Linear(4 * c.width, c.width));
    mlp_ = register_module("mlp", mlp);
  }
  Tensor forward(const Tensor& input) override {
    const Tensor x = input + attn_->forward(ln_1_->forward(input));
    const Tensor h = F::gelu((*mlp_)["c_fc"]->forward(ln_2_->forward(x)), "tanh");
    return x + (*mlp_)["c_proj"]->forward(h);
  }

 private:
  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<nn::ModuleDict> mlp_;
};

class Gpt2 : public nn::Module {
 public:
  Gpt2(const Config& c, bool recompute) : recompute_(recompute) {
    auto transformer = std::make_shared<nn::ModuleDict>();
    wte_ = std::make_shared<nn::Embedding>(c.vocab, c.width);
    transformer->insert("wte", wte_);
    transformer->insert("wpe", nn::Embedding(c.context, c.width));
    auto blocks = std::make_shared<nn::ModuleList>();
    for (int64_t l = 0; l < c.layers; ++l) blocks->push_back(Block(c));
    transformer->insert("h", blocks);
    transformer->insert("ln_f", nn::LayerNorm(std::vector<int64_t>{c.width}));
    transformer_ = register_module("transformer", transformer);
    lm_head_ = register_module("lm_head", nn::Linear(c.width, c.vocab, /*bias=*/false));
    lm_head_->weight() = wte_->weight();  // tied, as nanoGPT's
    // nanoGPT's initialization: N(0, 0.02), the residual projections scaled by 1/sqrt(2 L),
    // biases zero, norms one.
    NoGradGuard no_grad;
    for (auto& [name, p] : named_parameters()) {
      if (name.find("ln_") != std::string::npos) continue;
      const bool residual = name.ends_with("c_proj.weight");
      const double std = residual ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02;
      Tensor value = p.dim() == 1 ? zeros(p.sizes()) : randn(p.sizes()) * std;
      p.copy_(value.to(p.device()));
    }
  }
  Tensor forward(const Tensor& idx) override {
    const int64_t t = idx.size(1);
    const Tensor positions = arange(t, TensorOptions(kInt64).device(idx.device()));
    Tensor x = wte_->forward(idx) + (*transformer_)["wpe"]->forward(positions);
    for (const auto& block : *(*transformer_)["h"]->as<nn::ModuleList>())
      x = recompute_
              ? nn::utils::checkpoint([&](const Tensor& in) { return block->forward(in); }, x)
              : block->forward(x);
    return lm_head_->forward((*transformer_)["ln_f"]->forward(x));
  }

 private:
  std::shared_ptr<nn::Embedding> wte_;
  std::shared_ptr<nn::ModuleDict> transformer_;
  std::shared_ptr<nn::Linear> lm_head_;
  bool recompute_;
};

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!arg.starts_with("--")) throw ValueError("unexpected argument " + arg);
    const size_t eq = arg.find('=');
    flags[arg.substr(2, eq - 2)] = eq == std::string::npos ? "1" : arg.substr(eq + 1);
  }
  return flags;
}

// A learnable shard: the tokens of a fixed permutation of the vocabulary, repeated, so that each
// token tells the next.
std::string write_synthetic(int64_t vocab, int64_t count) {
  std::vector<int64_t> next(vocab);
  for (int64_t i = 0; i < vocab; ++i) next[i] = (i * 37 + 11) % vocab;
  std::vector<int32_t> header(256, 0);
  header[0] = data::kTokenShardMagic, header[1] = 1, header[2] = static_cast<int32_t>(count);
  std::vector<uint16_t> tokens(count);
  int64_t token = 0;
  for (auto& t : tokens) t = static_cast<uint16_t>(token = next[token]);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("lazyfuse_gpt2_" + std::to_string(::getpid()) + ".bin"))
                               .string();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * count));
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = parse(argc, argv);
  auto flag = [&](const std::string& name, const std::string& otherwise) {
    return flags.contains(name) ? flags[name] : otherwise;
  };
  const bool synthetic = flags.contains("synthetic"), distributed = flags.contains("distributed");
  if (distributed) distributed::init();
  const int rank = distributed::rank();
  const Config c = config_named(flag("config", synthetic ? "tiny" : "d12"));
  const int64_t batch = std::stoll(flag("batch", "8"));
  const int64_t seq = std::stoll(flag("seq", std::to_string(c.context)));
  const int64_t steps = std::stoll(flag("steps", synthetic ? "60" : "100"));
  const int64_t warmup = std::stoll(flag("warmup", synthetic ? "5" : "10"));
  const int64_t eval_every = std::stoll(flag("eval-every", synthetic ? "20" : "25"));
  const int64_t eval_batches = std::stoll(flag("eval-batches", "4"));
  const int64_t accumulate = std::stoll(flag("accumulate", "1"));
  const double max_lr = std::stod(flag("lr", synthetic ? "3e-3" : "6e-4"));
  const double peak_tflops = std::stod(flag("peak-tflops", "0"));
  const Device device(flag("device", "cpu"));
  std::string train = flag("data", ""), val = flag("val", "");
  if (synthetic) train = val = write_synthetic(c.vocab, 100000);  // a file of each process's own
  if (train.empty()) throw ValueError("--data=PATTERN (or --synthetic) names the token shards");
  if (val.empty()) val = train;

  manual_seed(std::stoull(flag("seed", "1")));
  auto model = std::make_shared<Gpt2>(c, flags.contains("recompute"));
  model->to(device);
  if (flags.contains("init")) load_safetensors(*model, flags["init"]);
  std::optional<nn::parallel::DistributedDataParallel> ddp;
  if (distributed) ddp.emplace(model);
  // Matrices and embeddings decayed; biases and norms not.
  std::vector<Tensor> decayed, rest;
  for (const Tensor& p : model->parameters()) (p.dim() >= 2 ? decayed : rest).push_back(p);
  const auto adamw = optim::AdamWOptions(max_lr).betas({0.9, 0.95});
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      decayed, std::make_unique<optim::AdamWOptions>(optim::AdamWOptions(adamw).weight_decay(0.1)));
  groups.emplace_back(
      rest, std::make_unique<optim::AdamWOptions>(optim::AdamWOptions(adamw).weight_decay(0)));
  optim::AdamW optimizer(std::move(groups), adamw);
  optim::LambdaLR schedule(optimizer, [&](int64_t step) {
    if (step < warmup) return static_cast<double>(step + 1) / warmup;
    const double progress =
        static_cast<double>(step - warmup) / std::max<int64_t>(1, steps - warmup);
    return 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * std::min(1.0, progress)));
  });
  data::TokenLoader loader(train, batch, seq, {.device = device});
  data::TokenLoader val_loader(val, batch, seq, {.device = device});

  // --checkpoint=DIR: a save writes this rank's model, optimizer and run state into DIR/step_N/,
  // then points DIR/latest_rankR at that set (written aside and renamed over it, so a save cut
  // short leaves the previous set whole and named), then drops this rank's previous set.
  namespace fs = std::filesystem;
  const std::string checkpoint = flag("checkpoint", "");
  const std::string suffix = "_rank" + std::to_string(rank);
  const fs::path pointer = fs::path(checkpoint) / ("latest" + suffix);
  auto set_file = [&](const fs::path& set, const std::string& name) {
    return (set / (name + suffix + ".safetensors")).string();
  };
  auto latest_set = [&]() -> fs::path {
    std::ifstream in(pointer);
    std::string name;
    if (!(in >> name))
      throw SerializationError("--resume: " + pointer.string() + " names no checkpoint");
    return fs::path(checkpoint) / name;
  };
  auto save_set = [&](int64_t step, const NamedTensors& run) {
    const std::string name = "step_" + std::to_string(step);
    const fs::path set = fs::path(checkpoint) / name;
    fs::create_directories(set);
    save_safetensors(set_file(set, "model"), *model);
    save_safetensors(set_file(set, "optimizer"), optimizer.state_dict());
    save_safetensors(set_file(set, "run"), run);
    const std::optional<fs::path> previous =
        fs::exists(pointer) ? std::optional(latest_set()) : std::nullopt;
    const std::string aside = pointer.string() + ".tmp";
    std::ofstream out(aside, std::ios::trunc);
    out << name << "\n";
    out.close();
    if (!out) throw SerializationError("--checkpoint: could not write " + aside);
    fs::rename(aside, pointer);
    if (!previous || *previous == set) return;
    for (const char* part : {"model", "optimizer", "run"}) fs::remove(set_file(*previous, part));
    std::error_code not_empty;  // another rank's files are still there
    fs::remove(*previous, not_empty);
  };
  // --autocast=bfloat16 (or float16): products and attention in that type, norms, softmax and
  // the loss in float32, parameters and the optimizer's state in float32.
  const std::string autocast = flag("autocast", "");
  if (!autocast.empty() && autocast != "bfloat16" && autocast != "float16")
    throw ValueError("--autocast: bfloat16 or float16, not " + autocast);
  // float16's gradients underflow: its losses are scaled (bfloat16 and float32 take scale 1).
  GradScaler scaler(65536.0, 2.0, 0.5, 2000, autocast == "float16");
  int64_t first_step = 0;
  if (flags.contains("resume")) {
    const fs::path set = latest_set();
    load_safetensors(*model, set_file(set, "model"));
    optimizer.load_state_dict(load_safetensors(set_file(set, "optimizer")));
    std::map<std::string, Tensor> run;
    for (auto& [name, t] : load_safetensors(set_file(set, "run"))) run[name] = t;
    first_step = run.at("step").item<int64_t>();
    if (distributed) {
      // Every process resumes from the same step (one cut short before its pointer moved
      // would not).
      const Tensor at = scalar_tensor(first_step);
      if (distributed::all_reduce(at, ReduceOp::MAX).item<int64_t>() !=
          distributed::all_reduce(at, ReduceOp::MIN).item<int64_t>())
        throw SerializationError(
            "--resume: the processes' latest checkpoints are of different steps");
    }
    schedule.set_epoch(first_step);
    set_rng_state(run.at("rng"));
    loader.set_position(
        {run.at("data.epoch").item<int64_t>(), run.at("data.batch").item<int64_t>()});
    NamedTensors scaler_state;
    for (const auto& [name, t] : run)
      if (name.starts_with("scaler.")) scaler_state.emplace_back(name.substr(7), t);
    scaler.load_state_dict(scaler_state);
  }

  auto loss_of = [&](const data::TokenBatch& b) {
    AutocastGuard mixed(device.type(), autocast == "float16" ? kFloat16 : kBFloat16,
                        !autocast.empty());
    const Tensor logits = model->forward(b.inputs);
    return F::cross_entropy(logits.reshape({-1, c.vocab}), b.targets.reshape({-1}));
  };
  auto validation_loss = [&] {
    NoGradGuard no_grad;
    model->eval();
    val_loader.set_position({0, 0});
    double total = 0;
    for (int64_t i = 0; i < eval_batches; ++i) total += loss_of(val_loader.next()).item<double>();
    model->train();
    return total / eval_batches;
  };
  // FLOPs a token: 6 per parameter, and the attention's 12 L T C (as nanoGPT's estimate_mfu).
  int64_t parameters = 0;
  for (const Tensor& p : model->parameters()) parameters += p.numel();
  const double flops_per_token = 6.0 * parameters + 12.0 * c.layers * seq * c.width;
  const double first_val = validation_loss();
  if (rank == 0)
    std::printf("%lld parameters; validation loss %.4f\n", (long long)parameters, first_val);
  double last_val = first_val;
  // --stop-after: an interrupted run (the schedule still the whole run's), for --resume to go on.
  const int64_t stop = std::stoll(flag("stop-after", std::to_string(steps)));
  for (int64_t step = first_step; step < std::min(steps, stop); ++step) {
    const auto start = std::chrono::steady_clock::now();
    // --accumulate micro-batches a step: each backward's gradient scaled by their count, the
    // losses computed with the step (one evaluation); under DDP only the last backward averages.
    optimizer.zero_grad();
    std::vector<Tensor> losses;
    for (int64_t m = 0; m < accumulate; ++m) {
      std::optional<nn::parallel::DistributedDataParallel::NoSync> unsynced;
      if (ddp && m + 1 < accumulate) unsynced.emplace(*ddp);
      losses.push_back(loss_of(loader.next()));
      losses.back().backward(scaler.scale(
          scalar_tensor(1.0 / static_cast<double>(accumulate), TensorOptions().device(device))));
    }
    scaler.unscale_(optimizer);  // clipping sees the true gradients
    const Tensor norm = nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    const double lr = optimizer.param_groups()[0].options().get_lr();
    scaler.step(optimizer);
    scaler.update();
    schedule.step();
    double loss_value = 0;
    for (const Tensor& loss : losses)
      loss_value += loss.item<double>() / static_cast<double>(accumulate);
    const double norm_value = norm.item<double>();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tokens = static_cast<double>(batch * seq * accumulate * distributed::world_size());
    if (rank == 0) {
      std::printf("step %4lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.2f ms | %.0f tok/s",
                  (long long)step + 1, (long long)steps, loss_value, lr, norm_value, 1e3 * seconds,
                  tokens / seconds);
      if (peak_tflops > 0)
        std::printf(" | MFU %.1f%%",
                    100 * flops_per_token * tokens / seconds / (peak_tflops * 1e12));
      std::printf("\n");
    }
    if ((step + 1) % eval_every == 0 || step + 1 == steps) {
      last_val = validation_loss();
      if (rank == 0) std::printf("validation loss %.4f\n", last_val);
      if (!checkpoint.empty()) {
        const data::TokenLoaderPosition at = loader.position();
        NamedTensors run = {{"step", scalar_tensor(step + 1)},
                            {"rng", get_rng_state()},
                            {"data.epoch", scalar_tensor(at.epoch)},
                            {"data.batch", scalar_tensor(at.batch)}};
        for (const auto& [name, t] : scaler.state_dict()) run.emplace_back("scaler." + name, t);
        save_set(step + 1, run);
      }
    }
  }
  if (synthetic) std::filesystem::remove(train);
  if (distributed) distributed::destroy_process_group();
  // The claim is a whole run's: from its first step to its last.
  if (!synthetic || stop < steps || first_step > 0) return 0;
  const bool learned = last_val < first_val / 3;
  std::printf("%s: validation loss %.4f from %.4f\n", learned ? "learned" : "did NOT learn",
              last_val, first_val);
  return learned ? 0 : 1;
}
