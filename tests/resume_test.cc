// Resuming a training run: the module's parameters, the optimizer's state (state_dict), the
// scheduler's epoch, the generator's state and the data's position, saved at a step and loaded
// into a run made afresh, give the later steps' losses of the uninterrupted run bit for bit.
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 64;

// A shard of 600 tokens below kVocab in llm.c's layout (tests/data_test.cc reads the layout
// against shards a script wrote).
std::string write_shard(const fs::path& dir) {
  std::vector<int32_t> header(256, 0);
  header[0] = data::kTokenShardMagic;
  header[1] = 1;
  header[2] = 600;
  std::vector<uint16_t> tokens(600);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>((i * 7 + i / 5) % kVocab);
  const fs::path path = dir / "tokens.bin";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()), 1200);
  return path.string();
}

// A small language model with dropout (so the generator's state matters), AdamW over two
// parameter groups, a cosine schedule, clipping, and shuffled data.
struct TrainingRun {
  explicit TrainingRun(uint64_t seed, const std::string& shard)
      : loader({shard}, 4, 8,
               data::TokenLoaderOptions{.shuffle = true, .seed = 3, .num_replicas = 1, .rank = 0}) {
    manual_seed(seed);
    net = std::make_shared<nn::Sequential>(nn::Embedding(kVocab, 16), nn::Linear(16, 32),
                                           nn::GELU(), nn::Dropout(0.2), nn::Linear(32, kVocab));
    std::vector<Tensor> decayed, rest;
    for (const Tensor& p : net->parameters()) (p.dim() == 2 ? decayed : rest).push_back(p);
    std::vector<optim::OptimizerParamGroup> groups = {
        optim::OptimizerParamGroup(decayed),
        optim::OptimizerParamGroup(rest, std::make_unique<optim::AdamWOptions>(
                                             optim::AdamWOptions(3e-3).weight_decay(0)))};
    optimizer = std::make_unique<optim::AdamW>(std::move(groups),
                                               optim::AdamWOptions(3e-3).weight_decay(0.1));
    scheduler = std::make_unique<optim::CosineAnnealingLR>(*optimizer, 20);
  }
  double step() {
    const data::TokenBatch batch = loader.next();
    const Tensor logits = net->forward(batch.inputs);
    const Tensor loss =
        nn::functional::cross_entropy(logits.reshape({-1, kVocab}), batch.targets.reshape({-1}));
    optimizer->zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(net->parameters(), 1.0);
    optimizer->step();
    scheduler->step();
    return loss.item<double>();
  }
  // Everything a resumed run needs, written under `dir`.
  void save(const fs::path& dir) {
    save_safetensors((dir / "model.safetensors").string(), *net);
    save_safetensors((dir / "optimizer.safetensors").string(), optimizer->state_dict());
    const data::TokenLoaderPosition at = loader.position();
    save_safetensors((dir / "run.safetensors").string(),
                     {{"rng", get_rng_state()},
                      {"scheduler.last_epoch", scalar_tensor(scheduler->last_epoch())},
                      {"data.epoch", scalar_tensor(at.epoch)},
                      {"data.batch", scalar_tensor(at.batch)}});
  }
  void load(const fs::path& dir, bool with_optimizer = true) {
    load_safetensors(*net, (dir / "model.safetensors").string());
    if (with_optimizer)
      optimizer->load_state_dict(load_safetensors((dir / "optimizer.safetensors").string()));
    std::map<std::string, Tensor> run;
    for (auto& [name, t] : load_safetensors((dir / "run.safetensors").string())) run[name] = t;
    scheduler->set_epoch(run.at("scheduler.last_epoch").item<int64_t>());
    set_rng_state(run.at("rng"));
    loader.set_position(
        {run.at("data.epoch").item<int64_t>(), run.at("data.batch").item<int64_t>()});
  }

  data::TokenLoader loader;
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<optim::CosineAnnealingLR> scheduler;
};

class Resume : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lazyfuse_resume_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    shard_ = write_shard(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string shard_;
};

// Steps 1-16 uninterrupted, saved after step 6 and resumed in a run made from another seed
// (600 tokens make 74 sequences of 8, 18 batches an epoch). Without the optimizer's state the
// resumed steps part from the first run's.
TEST_F(Resume, AResumedRunsLossesEqualTheUninterruptedRunsBitForBit) {
  std::vector<double> first;
  {
    TrainingRun run(1, shard_);
    for (int i = 1; i <= 16; ++i) {
      first.push_back(run.step());
      if (i == 6) run.save(dir_);
    }
  }
  EXPECT_LT(first.back(), first.front()) << "the loss falls";
  TrainingRun resumed(2, shard_);
  resumed.load(dir_);
  for (int i = 7; i <= 16; ++i) EXPECT_EQ(resumed.step(), first[i - 1]) << "step " << i;

  TrainingRun without(2, shard_);
  without.load(dir_, /*with_optimizer=*/false);
  std::vector<double> parted;
  for (int i = 7; i <= 16; ++i) parted.push_back(without.step());
  EXPECT_EQ(parted[0], first[6]) << "the first step's loss precedes its update";
  EXPECT_NE(parted.back(), first.back()) << "fresh moments take other steps";
}

// Across the loader's epoch boundary (18 batches an epoch) and with the generator's draws.
TEST_F(Resume, ResumingAcrossAnEpochOfTheData) {
  std::vector<double> first;
  {
    TrainingRun run(1, shard_);
    for (int i = 1; i <= 21; ++i) {
      first.push_back(run.step());
      if (i == 17) run.save(dir_);
    }
  }
  TrainingRun resumed(5, shard_);
  resumed.load(dir_);
  for (int i = 18; i <= 21; ++i) EXPECT_EQ(resumed.step(), first[i - 1]) << "step " << i;
}

TEST(OptimizerState, NamesAsPyTorchsStateDictFlattened) {
  manual_seed(0);
  nn::Linear fc(3, 2);
  optim::SGD sgd(fc.parameters(), optim::SGDOptions(0.1).momentum(0.9));
  std::vector<std::string> names;
  for (const auto& [name, t] : sgd.state_dict()) names.push_back(name);
  EXPECT_EQ(names, std::vector<std::string>{"param_groups.0.lr"}) << "nothing stepped yet";
  const Tensor x = randn({4, 3});
  fc.forward(x).sum().backward();
  sgd.step();
  names.clear();
  for (const auto& [name, t] : sgd.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"param_groups.0.lr", "state.0.momentum_buffer",
                                             "state.1.momentum_buffer"}));
  // Momentum restored: the next step from a loaded state is the same step. (The state's tensors
  // are the optimizer's own, as PyTorch's state_dict's are: a copy outlives the next step.)
  const NamedTensors saved =
      load_safetensors_from_memory(save_safetensors_to_memory(sgd.state_dict()));
  const std::vector<double> before = fc.weight().to_vector<double>(),
                            bias_before = fc.bias().to_vector<double>();
  sgd.zero_grad();
  fc.forward(x).sum().backward();
  sgd.step();
  const std::vector<double> want = fc.weight().to_vector<double>();
  {
    NoGradGuard no_grad;
    fc.weight().copy_(from_vector(before, {2, 3}));
    fc.bias().copy_(from_vector(bias_before, {2}));
  }
  optim::SGD again(fc.parameters(), optim::SGDOptions(0.5).momentum(0.9));
  again.load_state_dict(saved);
  EXPECT_EQ(again.param_groups()[0].options().get_lr(), 0.1);
  fc.zero_grad();
  fc.forward(x).sum().backward();
  again.step();
  EXPECT_EQ(fc.weight().to_vector<double>(), want);
}

// A state that does not fit is a ValueError naming the key, and changes nothing.
TEST(OptimizerState, AStateThatDoesNotFitIsAValueErrorAndChangesNothing) {
  manual_seed(0);
  nn::Linear fc(3, 2);
  optim::Adam adam(fc.parameters(), optim::AdamOptions(0.01));
  fc.forward(randn({4, 3})).sum().backward();
  adam.step();
  const auto good = adam.state_dict();
  auto message = [&](std::vector<std::pair<std::string, Tensor>> state) {
    try {
      adam.load_state_dict(state);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto with = [&](const std::string& key, Tensor value) {
    auto state = good;
    for (auto& [name, t] : state)
      if (name == key) t = value;
    return state;
  };
  EXPECT_EQ(message(with("state.0.exp_avg", zeros({3, 2}))),
            "load_state_dict: 'state.0.exp_avg' has shape [3, 2], expected [2, 3]");
  auto unknown = good;
  unknown.emplace_back("state.0.momentum_buffer", zeros({2, 3}));
  EXPECT_EQ(message(unknown),
            "load_state_dict: 'state.0.momentum_buffer' is not a name of this optimizer's state");
  auto partial = good;
  std::erase_if(partial, [](const auto& entry) { return entry.first == "state.1.exp_avg_sq"; });
  EXPECT_EQ(message(partial), "load_state_dict: 'state.1' holds only part of a parameter's state");
  auto no_lr = good;
  std::erase_if(no_lr, [](const auto& entry) { return entry.first == "param_groups.0.lr"; });
  EXPECT_EQ(message(no_lr), "load_state_dict: 'param_groups.0.lr' is missing");
  auto past = good;
  past.emplace_back("state.7.step", scalar_tensor(int64_t{1}));
  EXPECT_NE(message(past).find("names a parameter past the 2 there are"), std::string::npos);
  // Nothing changed: the state reads as it did.
  const auto after = adam.state_dict();
  ASSERT_EQ(after.size(), good.size());
  for (size_t i = 0; i < good.size(); ++i) {
    EXPECT_EQ(after[i].first, good[i].first);
    EXPECT_EQ(after[i].second.to_vector<double>(), good[i].second.to_vector<double>());
  }
}

TEST(RngState, PuttingAStateBackDrawsTheSameTensors) {
  manual_seed(11);
  (void)randn({5});
  const Tensor state = get_rng_state();
  EXPECT_EQ(state.dtype(), kInt64);
  const std::vector<double> a = randn({7}).to_vector<double>();
  const std::vector<double> b = rand({3}).to_vector<double>();
  manual_seed(99);
  set_rng_state(state);
  EXPECT_EQ(randn({7}).to_vector<double>(), a);
  EXPECT_EQ(rand({3}).to_vector<double>(), b);
  EXPECT_THROW(set_rng_state(zeros({2})), ValueError);
  EXPECT_THROW(set_rng_state(Tensor()), ValueError);
}

}  // namespace
}  // namespace lazyfuse
