// The API a model author reaches for, as LibTorch has it: user modules that register their
// parameters, buffers and submodules, ModuleList and ModuleDict, a forward of several
// arguments, skip_init, tied weights, split/chunk/tril/triu/masked_fill, an honest contiguous(),
// cross_entropy over [N, C, d...] with its options, device strings in TensorOptions and
// reset_peak_memory_stats. Each is checked against values computed here by hand or in float64,
// or against finite differences (gradcheck.h), never against lazyfuse's own results.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

using testing_gradcheck::gradcheck;

std::vector<std::string> names_of(const nn::NamedTensorList& named) {
  std::vector<std::string> out;
  for (const auto& entry : named) out.push_back(entry.first);
  return out;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "model_api_" + name + ".safetensors";
}

// A user's module: a submodule, a parameter and a buffer registered by name, and a forward of
// two arguments.
struct Block : nn::Module {
  Block() {
    fc = register_module("fc", nn::Linear(3, 4));
    scale = register_parameter("scale", ones({4}) * 2);
    mask = register_buffer("mask", tril(ones({4, 4})));
    steps = register_buffer("steps", zeros({1}, kInt64));
  }
  Tensor forward(const Tensor& x, const Tensor& keep) { return fc->forward(x) * scale * keep; }
  std::shared_ptr<nn::Linear> fc;
  Tensor scale, mask, steps;
};

// Only a forward of several arguments: Sequential cannot chain it.
static_assert(!nn::OneTensorModule<Block>);
static_assert(nn::OneTensorModule<nn::Linear>);

// --- Modules -----------------------------------------------------------------------------

TEST(ModelApi, UserModuleRegistersParametersBuffersAndSubmodules) {
  Block block;
  EXPECT_EQ(names_of(block.named_parameters()),
            (std::vector<std::string>{"scale", "fc.weight", "fc.bias"}));  // own ones first
  EXPECT_EQ(names_of(block.named_buffers()), (std::vector<std::string>{"mask", "steps"}));
  EXPECT_EQ(block.parameters(/*recurse=*/false).size(), 1u);
  EXPECT_TRUE(block.parameters()[0].is_same(block.scale));
  EXPECT_TRUE(block.scale.requires_grad());
  EXPECT_FALSE(block.mask.requires_grad());
  EXPECT_TRUE(block.buffers()[0].is_same(block.mask));
  ASSERT_EQ(block.children().size(), 1u);
  EXPECT_EQ(block.named_children()[0].first, "fc");
  EXPECT_EQ(block.name(), "Block");
  EXPECT_EQ(block.repr(), "Block(\n  (fc): Linear(in_features=3, out_features=4, bias=True)\n)");

  // A forward of two arguments, called as LibTorch's are; values by hand.
  Tensor x = tensor({{1.0, 2.0, 3.0}});
  Tensor keep = tensor({1.0, 0.0, 1.0, 1.0});
  std::vector<float> w = block.fc->weight().to_vector<float>(),
                     b = block.fc->bias().to_vector<float>();
  std::vector<float> got = block.forward(x, keep).to_vector<float>();
  for (int j = 0; j < 4; ++j) {
    const double y = (w[j * 3] * 1.0 + w[j * 3 + 1] * 2.0 + w[j * 3 + 2] * 3.0 + b[j]) * 2;
    EXPECT_NEAR(got[j], j == 1 ? 0.0 : y, 1e-5) << j;
  }
}

TEST(ModelApi, RegisteringTheSameNameReplacesAndBadNamesAreKeyErrors) {
  Block block;
  Tensor other = zeros({4});
  block.register_parameter("scale", other);
  ASSERT_EQ(block.parameters().size(), 3u);
  EXPECT_TRUE(block.parameters()[0].is_same(other));  // in place, same position
  EXPECT_THROW(block.register_parameter("", ones({1})), KeyError);
  EXPECT_THROW(block.register_buffer("a.b", ones({1})), KeyError);
  EXPECT_THROW(block.register_buffer("scale", ones({1})), KeyError);          // a parameter's name
  EXPECT_THROW(block.register_parameter("fc", ones({1})), KeyError);          // a submodule's name
  EXPECT_THROW(block.register_module("mask", nn::ReLU()), KeyError);          // a buffer's name
  EXPECT_THROW(block.fc->register_parameter("weight", ones({1})), KeyError);  // built-in
  EXPECT_THROW(block.replace_module("nothing", std::make_shared<nn::ReLU>()), KeyError);
  try {
    block.register_buffer("fc", ones({1}));
    FAIL() << "expected a KeyError";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("\"fc\" already exists as a module of Block"),
              std::string::npos)
        << e.what();
  }
  // A parameter is a leaf.
  Tensor leaf = ones({2}, TensorOptions().requires_grad(true));
  EXPECT_THROW(block.register_parameter("p", leaf * 2), GradError);
}

TEST(ModelApi, OneTensorForwardIsAnUnsupportedErrorWhereNotDeclared) {
  auto block = std::make_shared<Block>();
  nn::Module& base = *block;
  EXPECT_THROW(base.forward(ones({1, 3})), UnsupportedError);
  // Given as a Module pointer, Sequential cannot check it when built: forward says so.
  nn::Sequential net;
  net.push_back(block);
  try {
    net.forward(ones({1, 3}));
    FAIL() << "expected an UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("Block has no forward(const Tensor&)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nn::ModuleList()(ones({1})), UnsupportedError);
}

TEST(ModelApi, ModuleListIndexesIteratesAndNamesByPosition) {
  nn::ModuleList list(nn::Linear(2, 3), nn::ReLU());
  list.push_back(std::make_shared<nn::Linear>(3, 1));
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(names_of(list.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_NE(list.at<nn::Linear>(0), nullptr);
  EXPECT_EQ(list.at<nn::Linear>(1), nullptr);  // a ReLU
  EXPECT_NE(list[1]->as<nn::ReLU>(), nullptr);
  EXPECT_THROW(list[3], IndexError);

  // insert shifts the names after it; extend appends the same modules.
  list.insert(0, std::make_shared<nn::Tanh>());
  EXPECT_EQ(names_of(list.named_parameters())[0], "1.weight");
  nn::ModuleList more;
  more.extend(list);
  EXPECT_EQ(more.size(), 4u);
  EXPECT_TRUE(more.parameters()[0].is_same(list.parameters()[0]));
  EXPECT_THROW(list.insert(9, std::make_shared<nn::Tanh>()), IndexError);

  // Iterating, as LibTorch's: a forward over the list.
  nn::ModuleList layers(nn::Linear(2, 2), nn::Linear(2, 2));
  Tensor x = tensor({{1.0, -1.0}});
  Tensor y = x;
  for (const auto& layer : layers) y = (*layer)(y);
  Tensor want = layers.at<nn::Linear>(1)->forward(layers.at<nn::Linear>(0)->forward(x));
  EXPECT_EQ(y.to_vector<float>(), want.to_vector<float>());
  EXPECT_EQ(nn::ModuleList(nn::ReLU()).repr(), "ModuleList(\n  (0): ReLU()\n)");
}

TEST(ModelApi, ModuleDictHoldsModulesByKeyInOrder) {
  nn::ModuleDict dict(
      {{"encoder", std::make_shared<nn::Linear>(2, 3)}, {"act", std::make_shared<nn::GELU>()}});
  dict.insert("decoder", nn::Linear(3, 2));
  EXPECT_EQ(dict.keys(), (std::vector<std::string>{"encoder", "act", "decoder"}));
  EXPECT_EQ(names_of(dict.named_parameters()),
            (std::vector<std::string>{"encoder.weight", "encoder.bias", "decoder.weight",
                                      "decoder.bias"}));
  EXPECT_TRUE(dict.contains("act"));
  EXPECT_NE(dict.at<nn::Linear>("decoder"), nullptr);
  // A key already held: replaced in place.
  dict.insert("act", std::make_shared<nn::ReLU>());
  EXPECT_EQ(dict.keys()[1], "act");
  EXPECT_NE(dict["act"]->as<nn::ReLU>(), nullptr);
  auto popped = dict.pop("act");
  EXPECT_NE(popped->as<nn::ReLU>(), nullptr);
  EXPECT_EQ(dict.size(), 2u);
  EXPECT_THROW(dict["act"], KeyError);
  EXPECT_THROW(dict.pop("act"), KeyError);
  EXPECT_THROW(dict.insert("a.b", std::make_shared<nn::ReLU>()), KeyError);
  EXPECT_THROW(dict.insert("", std::make_shared<nn::ReLU>()), KeyError);
}

TEST(ModelApi, BuffersMoveWithToAndKeepIntegerDtypes) {
  Block block;
  Tensor mask = block.mask, steps = block.steps;
  block.to(kFloat64);
  EXPECT_TRUE(block.mask.is_same(mask));  // the same tensors, converted
  EXPECT_EQ(block.mask.dtype(), kFloat64);
  EXPECT_EQ(block.steps.dtype(), kInt64);  // not floating: kept
  EXPECT_EQ(block.scale.dtype(), kFloat64);
  EXPECT_EQ(block.mask.to_vector<double>(),
            (std::vector<double>{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
  block.to(Device("cpu"));
  EXPECT_TRUE(block.mask.is_same(mask));
  EXPECT_THROW(block.to(Device(DeviceType::CUDA, cuda::device_count())), DeviceIndexError);
  EXPECT_EQ(block.mask.device(), Device::cpu());
}

TEST(ModelApi, BuffersAreSavedAndLoadedWithTheParameters) {
  Block saved;
  saved.mask.fill_(3);
  saved.steps.fill_(7);
  const std::string path = temp_path("buffers");
  save_safetensors(path, saved);
  std::vector<std::string> keys;
  for (const auto& [name, t] : load_safetensors(path)) keys.push_back(name);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"fc.bias", "fc.weight", "mask", "scale", "steps"}));

  Block loaded;
  Tensor mask = loaded.mask;
  load_safetensors(loaded, path);
  EXPECT_TRUE(loaded.mask.is_same(mask));
  EXPECT_EQ(loaded.mask.to_vector<float>(), std::vector<float>(16, 3.0f));
  EXPECT_EQ(loaded.steps.to_vector<int64_t>(), std::vector<int64_t>{7});
  EXPECT_EQ(loaded.fc->weight().to_vector<float>(), saved.fc->weight().to_vector<float>());

  // A file without the buffers is missing keys, and changes nothing.
  save_safetensors(path, saved.named_parameters());
  try {
    load_safetensors(loaded, path);
    FAIL() << "expected a SerializationError";
  } catch (const SerializationError& e) {
    EXPECT_NE(std::string(e.what()).find("Missing key(s): \"mask\", \"steps\""), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(loaded.steps.to_vector<int64_t>(), std::vector<int64_t>{7});
  std::remove(path.c_str());
}

TEST(ModelApi, SkipInitDrawsNothingAndLoadedWeightsReplaceTheZeros) {
  manual_seed(5);
  const std::vector<float> stream = rand({6}).to_vector<float>();
  manual_seed(5);
  nn::Linear head = nn::skip_init<nn::Linear>(3, 2);
  nn::Embedding table = nn::skip_init<nn::Embedding>(4, 3);
  // No random number was drawn for them: the generator is where it was.
  EXPECT_EQ(rand({6}).to_vector<float>(), stream);
  EXPECT_FALSE(head.weight().is_computed());
  EXPECT_TRUE(head.weight().requires_grad());
  EXPECT_EQ(head.weight().sizes(), Shape({2, 3}));
  EXPECT_EQ(head.bias().to_vector<float>(), std::vector<float>(2, 0.0f));

  nn::Linear trained(3, 2);
  const std::string path = temp_path("skip_init");
  save_safetensors(path, trained);
  load_safetensors(head, path);
  EXPECT_EQ(head.weight().to_vector<float>(), trained.weight().to_vector<float>());
  EXPECT_EQ(head.bias().to_vector<float>(), trained.bias().to_vector<float>());
  std::remove(path.c_str());

  // A user's module: what it registers is zeros, the same shapes.
  Block block = nn::skip_init<Block>();
  EXPECT_EQ(block.scale.to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(block.fc->weight().to_vector<float>(), std::vector<float>(12, 0.0f));
  // Outside skip_init, modules initialise again.
  nn::Linear normal(3, 2);
  EXPECT_TRUE(normal.weight().is_computed());
}

// --- Tied weights -------------------------------------------------------------------------

// The output head shares the token embedding's table, as GPT-2's does.
struct TiedModel : nn::Module {
  TiedModel() {
    wte = register_module("wte", nn::Embedding(5, 3));
    head = register_module("head", nn::Linear(3, 5, /*bias=*/false));
    head->weight() = wte->weight();
  }
  Tensor forward(const Tensor& idx) override { return head->forward(wte->forward(idx)); }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> head;
};

TEST(ModelApi, TiedWeightsAreOneParameterThroughOptimizerSteps) {
  TiedModel model;
  EXPECT_EQ(names_of(model.named_parameters()), std::vector<std::string>{"wte.weight"});
  EXPECT_EQ(names_of(model.named_parameters(true, /*remove_duplicate=*/false)),
            (std::vector<std::string>{"wte.weight", "head.weight"}));
  optim::SGD sgd(model.parameters(), optim::SGDOptions(0.1));
  const Tensor idx = tensor({1, 3}, kInt64);
  for (int step = 0; step < 2; ++step) {
    // loss = sum(E W^T) = (sum_i E_i) . (sum_v W_v), E the rows idx of W: d/dW_v is sum_i E_i
    // through the head, plus sum_v W_v at the rows looked up.
    const std::vector<float> w = model.wte->weight().to_vector<float>();
    double sum_e[3] = {0, 0, 0}, sum_w[3] = {0, 0, 0};
    for (int c = 0; c < 3; ++c) {
      sum_e[c] = double(w[1 * 3 + c]) + w[3 * 3 + c];
      for (int v = 0; v < 5; ++v) sum_w[c] += w[v * 3 + c];
    }
    sgd.zero_grad();
    model(idx).sum().backward();
    sgd.step();
    // Both modules still hold the one tensor, with its new value.
    ASSERT_TRUE(model.head->weight().is_same(model.wte->weight()));
    const std::vector<float> got = model.head->weight().to_vector<float>();
    for (int v = 0; v < 5; ++v)
      for (int c = 0; c < 3; ++c) {
        const double grad = sum_e[c] + ((v == 1 || v == 3) ? sum_w[c] : 0.0);
        EXPECT_NEAR(got[v * 3 + c], w[v * 3 + c] - 0.1 * grad, 1e-5) << step << " " << v << c;
      }
  }
}

TEST(ModelApi, TiedWeightsAreSavedOnceAndLoadedFromEitherName) {
  TiedModel model;
  const std::string path = temp_path("tied");
  save_safetensors(path, model);
  NamedTensors file = load_safetensors(path);
  ASSERT_EQ(file.size(), 1u);
  EXPECT_EQ(file[0].first, "wte.weight");

  TiedModel loaded;
  load_safetensors(loaded, path);
  EXPECT_TRUE(loaded.head->weight().is_same(loaded.wte->weight()));
  EXPECT_EQ(loaded.head->weight().to_vector<float>(), model.wte->weight().to_vector<float>());

  // A file that kept the other name (as safetensors' save_model may) loads too.
  Tensor other = randn({5, 3});
  save_safetensors(path, {{"head.weight", other}});
  load_safetensors(loaded, path);
  EXPECT_EQ(loaded.wte->weight().to_vector<float>(), other.to_vector<float>());
  std::remove(path.c_str());
}

// --- Tensor ops ---------------------------------------------------------------------------

Tensor iota_tensor(Shape shape, DType dtype = kFloat32) {
  std::vector<double> values(numel(shape));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  return from_vector(values, shape, dtype);
}

TEST(ModelApi, SplitAndChunkGivePiecesAsPyTorch) {
  const Tensor x = iota_tensor({2, 5});
  std::vector<Tensor> pieces = x.split(2, 1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].to_vector<float>(), (std::vector<float>{0, 1, 5, 6}));
  EXPECT_EQ(pieces[2].to_vector<float>(), (std::vector<float>{4, 9}));
  EXPECT_EQ(pieces[2].sizes(), Shape({2, 1}));
  EXPECT_TRUE(pieces[1].shares_storage_with(x));  // views

  pieces = split(x, {1, 4}, -1);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 6, 7, 8, 9}));
  // chunk: pieces of ceil(5 / 3) = 2; 6 in 4 chunks of 2 is 3 pieces, as PyTorch's.
  EXPECT_EQ(x.chunk(3, 1).size(), 3u);
  EXPECT_EQ(x.chunk(3, 1)[2].sizes(), Shape({2, 1}));
  EXPECT_EQ(iota_tensor({6}).chunk(4).size(), 3u);
  EXPECT_EQ(chunk(x, 2, 0)[1].to_vector<float>(), (std::vector<float>{5, 6, 7, 8, 9}));
  EXPECT_EQ(zeros({0, 2}).chunk(3).size(), 3u);
  EXPECT_EQ(zeros({0, 2}).split(2).size(), 1u);

  EXPECT_THROW(x.split(-1), ShapeError);
  EXPECT_THROW(x.split(0, 1), ShapeError);
  EXPECT_THROW(x.split(2, 2), ShapeError);
  EXPECT_THROW(x.chunk(0), ShapeError);
  try {
    x.split({2, 2}, 1);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("split_with_sizes expects split_sizes to sum exactly to "
                                         "5 (input tensor's size at dimension 1), but got "
                                         "split_sizes=[2, 2]"),
              std::string::npos)
        << e.what();
  }

  gradcheck("split",
            [](const std::vector<Tensor>& in) {
              std::vector<Tensor> p = in[0].split(2, 1);
              std::vector<Tensor> q = in[0].chunk(2, 0);
              return cat({p[0] * 2, p[1] * 3, p[2] * 5}, 1) + cat({q[1], q[0] * q[0]}, 0);
            },
            {{2, 5}});
}

TEST(ModelApi, TrilAndTriuKeepTheirTriangleOnEveryDiagonal) {
  const Tensor x = iota_tensor({2, 3, 4});
  for (int64_t diagonal : {-1, 0, 2, 5}) {
    std::vector<float> lower = x.tril(diagonal).to_vector<float>(),
                       upper = triu(x, diagonal).to_vector<float>();
    for (int b = 0, i = 0; b < 2; ++b)
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 4; ++c, ++i) {
          EXPECT_EQ(lower[i], c - r <= diagonal ? i : 0) << diagonal << " " << i;
          EXPECT_EQ(upper[i], c - r >= diagonal ? i : 0) << diagonal << " " << i;
        }
  }
  // Integer and bool tensors keep their dtype.
  EXPECT_EQ(iota_tensor({2, 2}, kInt32).triu().dtype(), kInt32);
  EXPECT_EQ(ones({2, 2}, kBool).tril().to_vector<bool>(),
            (std::vector<bool>{true, false, true, true}));
  EXPECT_THROW(iota_tensor({3}).tril(), ShapeError);
  gradcheck("tril and triu",
            [](const std::vector<Tensor>& in) { return in[0].tril(-1) * 2 + in[0].triu(1); },
            {{3, 4}});
}

TEST(ModelApi, MaskedFillBroadcastsTheMaskAndKeepsTheDtype) {
  const Tensor x = iota_tensor({3, 4});
  const Tensor rows = tensor({{true}, {false}, {true}}, kBool);  // [3, 1]
  std::vector<float> got = x.masked_fill(rows, -1.5).to_vector<float>();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[i], (i / 4) == 1 ? i : -1.5f) << i;
  // A mask larger than the tensor broadcasts it: [4] with [2, 4].
  const Tensor mask = tensor({{true, false, false, true}, {false, false, true, false}}, kBool);
  got = iota_tensor({4}).masked_fill(mask, 9).to_vector<float>();
  EXPECT_EQ(got, (std::vector<float>{9, 1, 2, 9, 0, 1, 9, 3}));
  // A 0-d tensor value; -inf as attention masks use it.
  got = x.masked_fill(x > 9, tensor(-std::numeric_limits<double>::infinity(), kFloat64))
            .to_vector<float>();
  EXPECT_EQ(x.masked_fill(x > 9, tensor(-1.0, kFloat64)).dtype(), kFloat32);
  EXPECT_TRUE(std::isinf(got[10]) && got[10] < 0);
  EXPECT_EQ(got[9], 9.0f);
  // An integer tensor stays integer.
  const Tensor ints = iota_tensor({3}, kInt64).masked_fill(tensor({true, false, true}, kBool), 7);
  EXPECT_EQ(ints.dtype(), kInt64);
  EXPECT_EQ(ints.to_vector<int64_t>(), (std::vector<int64_t>{7, 1, 7}));

  EXPECT_THROW(x.masked_fill(x, 1.0), DTypeError);  // a float mask
  EXPECT_THROW(x.masked_fill(rows, ones({1})), ShapeError);
  EXPECT_THROW(x.masked_fill(tensor({true, false}, kBool), 1.0), ShapeError);

  // The gradient reaches the unmasked elements and, for a tensor value, sums the masked ones.
  gradcheck("masked_fill",
            [](const std::vector<Tensor>& in) {
              const Tensor m = tensor({{true, false, true}, {false, false, true}}, kBool);
              return in[0].masked_fill(m, in[1]) * in[0] + masked_fill(in[0], m, 0.5);
            },
            {{2, 3}, {}});
}

TEST(ModelApi, ContiguousIsHonestBeforeAndAfterEvaluation) {
  const Tensor x = iota_tensor({4, 6});
  eval(x);
  EXPECT_TRUE(x.contiguous().is_same(x));  // computed and dense: itself
  const Tensor t = x.t().contiguous();
  EXPECT_FALSE(t.is_same(x));
  eval(t);
  EXPECT_TRUE(t.is_contiguous());
  const float* data = t.data_ptr<float>();
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(data[r * 4 + c], c * 6 + r);

  // A view of a pending value whose foreseen layout the passes may change (sink_views computes
  // (x + 1).t() as x.t() + 1): is_contiguous() foresees true, and contiguous() must still give
  // a dense value once computed.
  const Tensor split = (x + 1).t().reshape({6, 2, 2}).permute({1, 2, 0});
  const Tensor dense = split.contiguous();
  eval(dense);
  EXPECT_TRUE(dense.is_contiguous());
  const float* values = dense.data_ptr<float>();
  // split[a][b][k] = (x + 1).t() flattened at k*4 + a*2 + b, that is x[a*2+b][k] + 1.
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int k = 0; k < 6; ++k)
        EXPECT_EQ(values[(a * 2 + b) * 6 + k], (a * 2 + b) * 6 + k + 1) << a << b << k;
}

// --- cross_entropy ------------------------------------------------------------------------

// PyTorch's cross_entropy in float64, from its definition: per element, (1 - s) * nll + s/C *
// (-sum log p), ignored targets 0, the mean over the targets not ignored. Also its gradient
// with respect to the logits: ((1 - s)(p - onehot) + s (p - 1/C)) / count for the mean.
struct Reference {
  std::vector<double> loss;      // per element ([N, d...])
  std::vector<double> gradient;  // of the reduced loss, like the input
  double reduced = 0;
};
Reference reference_cross_entropy(const std::vector<double>& logits,
                                  const std::vector<int64_t>& target, int64_t n, int64_t classes,
                                  int64_t inner, int64_t ignore, double s, Reduction reduction) {
  Reference r;
  r.loss.assign(n * inner, 0);
  r.gradient.assign(logits.size(), 0);
  int64_t count = 0;
  for (int64_t t : target) count += t != ignore;
  const double scale = reduction == Reduction::Mean ? 1.0 / count : 1.0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t k = 0; k < inner; ++k) {
      const int64_t label = target[b * inner + k];
      if (label == ignore) continue;
      auto at = [&](int64_t c) { return (b * classes + c) * inner + k; };
      double m = -INFINITY, z = 0, sum_logp = 0;
      for (int64_t c = 0; c < classes; ++c) m = std::max(m, logits[at(c)]);
      for (int64_t c = 0; c < classes; ++c) z += std::exp(logits[at(c)] - m);
      for (int64_t c = 0; c < classes; ++c) sum_logp += logits[at(c)] - m - std::log(z);
      const double nll = -(logits[at(label)] - m - std::log(z));
      r.loss[b * inner + k] = (1 - s) * nll - s / classes * sum_logp;
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(logits[at(c)] - m) / z;
        r.gradient[at(c)] = scale * ((1 - s) * (p - (c == label)) + s * (p - 1.0 / classes));
      }
    }
  for (double l : r.loss) r.reduced += l;
  if (reduction == Reduction::Mean) r.reduced /= count;
  return r;
}

TEST(ModelApi, CrossEntropyOverClassDimOneMatchesFloat64) {
  const int64_t n = 2, classes = 4, inner = 3;
  std::mt19937 rng(3);
  std::vector<double> logits = testing_gradcheck::draw(n * classes * inner, {-3, 3}, rng);
  const std::vector<int64_t> target = {0, 3, -100, 2, 1, 1};
  for (Reduction reduction : {Reduction::None, Reduction::Sum, Reduction::Mean})
    for (double s : {0.0, 0.1}) {
      SCOPED_TRACE(::testing::Message() << "reduction " << int(reduction) << " smoothing " << s);
      const Reference want =
          reference_cross_entropy(logits, target, n, classes, inner, -100, s, reduction);
      Tensor input = from_vector(logits, {n, classes, inner}, kFloat64).requires_grad_();
      const Tensor labels = from_vector({0, 3, -100, 2, 1, 1}, {n, inner}, kInt64);
      const Tensor loss = nn::functional::cross_entropy(
          input, labels,
          nn::functional::CrossEntropyFuncOptions().reduction(reduction).label_smoothing(s));
      if (reduction == Reduction::None) {
        ASSERT_EQ(loss.sizes(), Shape({n, inner}));
        const std::vector<double> got = loss.to_vector<double>();
        for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.loss[i], 1e-12) << i;
        continue;
      }
      EXPECT_NEAR(loss.item<double>(), want.reduced, 1e-12);
      loss.backward();
      const std::vector<double> got = input.grad().to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.gradient[i], 1e-12) << i;
    }
}

TEST(ModelApi, CrossEntropyIgnoreIndexLabelSmoothingAndTheLossModule) {
  // [N, C] with a custom ignore_index that is a valid class: those rows add nothing.
  std::mt19937 rng(4);
  const std::vector<double> logits = testing_gradcheck::draw(3 * 5, {-2, 2}, rng);
  const std::vector<int64_t> target = {2, 0, 4};
  const Reference want = reference_cross_entropy(logits, target, 3, 5, 1, 0, 0.2, Reduction::Mean);
  nn::CrossEntropyLoss loss_fn(nn::CrossEntropyLossOptions().ignore_index(0).label_smoothing(0.2));
  const Tensor input = from_vector(logits, {3, 5}, kFloat64);
  const Tensor labels = tensor({2, 0, 4}, kInt64);
  EXPECT_NEAR(loss_fn(input, labels).item<double>(), want.reduced, 1e-12);
  EXPECT_EQ(loss_fn.options().reduction(), Reduction::Mean);
  EXPECT_EQ(nn::CrossEntropyLossOptions().ignore_index(), -100);
  EXPECT_EQ(nn::CrossEntropyLossOptions().label_smoothing(), 0.0);
  // [C] with a 0-d target.
  const Reference one = reference_cross_entropy({1, 2, 3}, {1}, 1, 3, 1, -100, 0, Reduction::Mean);
  EXPECT_NEAR(nn::functional::cross_entropy(tensor({1.0, 2.0, 3.0}, kFloat64), tensor(1, kInt64))
                  .item<double>(),
              one.reduced, 1e-12);
  // Every target ignored: the mean is 0 / 0, as PyTorch's.
  EXPECT_TRUE(std::isnan(nn::functional::cross_entropy(input, tensor({-100, -100, -100}, kInt64),
                                                       nn::functional::CrossEntropyFuncOptions())
                             .item<double>()));

  // Finite differences, through smoothing and an ignored element, over [N, C, d].
  gradcheck("cross_entropy",
            [](const std::vector<Tensor>& in) {
              const Tensor labels = tensor({{1, -100}, {2, 0}}, kInt64);
              return nn::functional::cross_entropy(
                  in[0], labels, nn::functional::CrossEntropyFuncOptions().label_smoothing(0.3));
            },
            {{2, 3, 2}});
}

TEST(ModelApi, CrossEntropyRejectsMismatchedInputsWithTypedErrors) {
  const Tensor input = zeros({2, 4, 3});
  try {
    nn::functional::cross_entropy(input, zeros({2, 4}, kInt64));
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a target of shape [2, 3], got [2, 4]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nn::functional::cross_entropy(input, zeros({2, 3})), DTypeError);
  EXPECT_THROW(nn::functional::cross_entropy(zeros({2, 4}, kInt64), zeros({2}, kInt64)),
               DTypeError);
  EXPECT_THROW(nn::functional::cross_entropy(zeros({}), zeros({}, kInt64)), ShapeError);
  EXPECT_THROW(
      nn::functional::cross_entropy(input, zeros({2, 3}, kInt64),
                                    nn::functional::CrossEntropyFuncOptions().label_smoothing(1.5)),
      ValueError);
}

// --- Options and statistics ---------------------------------------------------------------

TEST(ModelApi, TensorOptionsTakeDeviceStrings) {
  const std::string name = "cuda:0";
  EXPECT_EQ(TensorOptions().device("cuda:0").device(), Device(DeviceType::CUDA, 0));
  EXPECT_EQ(TensorOptions().device(name).device(), Device(DeviceType::CUDA, 0));
  EXPECT_EQ(TensorOptions().device(DeviceType::CUDA, 1).device(), Device(DeviceType::CUDA, 1));
  EXPECT_EQ(TensorOptions(std::string("cuda:1")).device(), Device(DeviceType::CUDA, 1));
  EXPECT_EQ(TensorOptions(kFloat64).device(std::string("cpu")).dtype(), kFloat64);
  EXPECT_EQ(zeros({2}, TensorOptions().device(std::string("cpu"))).device(), Device::cpu());
  EXPECT_EQ(ones({1}).to(std::string("cpu")).device(), Device::cpu());
  EXPECT_THROW(TensorOptions().device(std::string("tpu:0")), DeviceStringError);
}

TEST(ModelApi, ResetPeakMemoryStatsKeepsTheCounters) {
  const Tensor small = ones({16});
  eval(small);
  {
    const Tensor big = ones({1 << 20});  // 4 MiB
    eval(big);
  }
  const Stats before = stats();
  ASSERT_GE(before.memory[0].peak_bytes, int64_t{4} << 20);
  ASSERT_GE(memory_stats(Device("cpu")).peak_bytes, int64_t{4} << 20);
  reset_peak_memory_stats();
  const Stats after = stats();
  EXPECT_EQ(after.memory[0].peak_bytes, after.memory[0].allocated_bytes);
  EXPECT_LT(after.memory[0].peak_bytes, before.memory[0].peak_bytes);
  EXPECT_EQ(after.evaluations, before.evaluations);  // counters are kept
  EXPECT_EQ(after.kernels, before.kernels);
  // memory_stats(device), what tensors hold, is reset with it (its peak once outlived the reset:
  // a test measuring one phase's peak saw an earlier test's 64 MB).
  const MemoryStats held = memory_stats(Device("cpu"));
  EXPECT_EQ(held.peak_bytes, held.allocated_bytes);
  {
    const Tensor big = ones({1 << 20});
    eval(big);
  }
  ASSERT_GE(memory_stats(Device("cpu")).peak_bytes, int64_t{4} << 20);
  reset_peak_memory_stats(Device("cpu"));
  EXPECT_EQ(memory_stats(Device("cpu")).peak_bytes, memory_stats(Device("cpu")).allocated_bytes);
  EXPECT_THROW(reset_peak_memory_stats(Device(DeviceType::CUDA, cuda::device_count())),
               DeviceIndexError);
}

}  // namespace
}  // namespace lazyfuse
