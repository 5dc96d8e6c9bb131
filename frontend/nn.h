// A small nn library in LibTorch's shape: the layers, Sequential, and the losses (Module,
// ModuleList and ModuleDict are in module.h).
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lazyfuse/frontend/functional.h"
#include "lazyfuse/frontend/module.h"
#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse::nn {

// y = x W^T + b, initialised as PyTorch's: W and b uniform in +-1/sqrt(in_features).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  Tensor& bias() { return bias_; }  // undefined when made with bias = false
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 protected:
  std::vector<std::pair<std::string, Tensor*>> own_parameters() override;

 private:
  int64_t in_features_, out_features_;
  Tensor weight_, bias_;
};

// Multi-head attention as LibTorch's torch::nn::MultiheadAttention (sequence first): query
// [L, N, E], key and value [S, N, E]; the projections in in_proj_weight [3E, E] and
// in_proj_bias [3E] (PyTorch's names and initialisation: Xavier-uniform weight, zero biases),
// the output through out_proj (a Linear, its bias zero). forward returns the output [L, N, E]
// and, with need_weights, the attention weights [N, L, S] averaged over the heads (or
// [N, H, L, S]). key_padding_mask [N, S] and a bool attn_mask ([L, S] or [N * H, L, S]) mark
// with true what is not attended to, as PyTorch's module does (the opposite of
// scaled_dot_product_attention's bool mask); a float attn_mask is added to the scores.
// Dropout on the weights while training. Without need_weights the attention is
// scaled_dot_product_attention's.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true);
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const Tensor& key_padding_mask = {}, bool need_weights = true,
                                     const Tensor& attn_mask = {},
                                     bool average_attn_weights = true);
  std::string repr() const override;
  Tensor& in_proj_weight() { return in_proj_weight_; }
  Tensor& in_proj_bias() { return in_proj_bias_; }  // undefined when made with bias = false
  Linear& out_proj() { return *out_proj_; }

 protected:
  std::vector<std::pair<std::string, Tensor*>> own_parameters() override;

 private:
  int64_t embed_dim_, num_heads_;
  double dropout_;
  Tensor in_proj_weight_, in_proj_bias_;
  std::shared_ptr<Linear> out_proj_;
};

// Activations and reshaping, as modules.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input.relu(); }
  std::string repr() const override { return "ReLU()"; }
};
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate_(std::move(approximate)) {}
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;

 private:
  std::string approximate_;
};
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input.sigmoid(); }
  std::string repr() const override { return "Sigmoid()"; }
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input.tanh(); }
  std::string repr() const override { return "Tanh()"; }
};
// Flattens dims start_dim..end_dim into one.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;

 private:
  int64_t start_dim_, end_dim_;
};
// Zeroes elements with probability p while training (from the global Philox generator, so the
// masks are the same on every device for one seed); the identity in eval().
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;

 private:
  double p_;
};
// Normalizes over the trailing dims `normalized_shape`; weight ones and bias zeros to start.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 protected:
  std::vector<std::pair<std::string, Tensor*>> own_parameters() override;

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  Tensor weight_, bias_;
};

// Divides by the root mean square over the trailing dims `normalized_shape`; weight ones to
// start. eps by default the input dtype's machine epsilon, as PyTorch's.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::vector<int64_t> normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;
  Tensor& weight() { return weight_; }

 protected:
  std::vector<std::pair<std::string, Tensor*>> own_parameters() override;

 private:
  std::vector<int64_t> normalized_shape_;
  std::optional<double> eps_;
  Tensor weight_;
};

// A table of num_embeddings vectors of embedding_dim, looked up by int64 index: forward(idx)
// has idx's shape with embedding_dim appended. Weight drawn from N(0, 1), as PyTorch's.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

 protected:
  std::vector<std::pair<std::string, Tensor*>> own_parameters() override;

 private:
  int64_t num_embeddings_, embedding_dim_;
  Tensor weight_;
};

// Modules applied one after another. Each must have a one-tensor forward: one whose forward
// takes other arguments is refused when the Sequential is built (or, given as a
// shared_ptr<Module>, is an UnsupportedError when forward reaches it).
class Sequential : public Module {
 public:
  Sequential() = default;
  template <NotA<Sequential> M>
  explicit Sequential(M&& module) {
    push_back(std::forward<M>(module));
  }
  template <typename M1, typename M2, typename... M>
  Sequential(M1&& first, M2&& second, M&&... more) {
    push_back(std::forward<M1>(first));
    push_back(std::forward<M2>(second));
    (push_back(std::forward<M>(more)), ...);
  }
  void push_back(std::shared_ptr<Module> module) {
    children_.emplace_back(std::to_string(children_.size()), std::move(module));
  }
  template <ModuleValue M>
  void push_back(M&& module) {
    static_assert(OneTensorModule<M>,
                  "Sequential chains modules with a forward(const Tensor&); this module's "
                  "forward takes other arguments");
    push_back(std::make_shared<std::decay_t<M>>(std::forward<M>(module)));
  }
  Tensor forward(const Tensor& input) override;
  std::string repr() const override { return repr_with_children("Sequential"); }
  size_t size() const { return children_.size(); }
  // net[0]: the module, so net[0]->as<Linear>()->weight().
  std::shared_ptr<Module> operator[](size_t index) const;
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    return std::dynamic_pointer_cast<M>((*this)[index]);
  }
};

// Losses as modules: loss(input, target).
class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = kMean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::mse_loss(input, target, reduction_);
  }
  std::string repr() const { return "MSELoss()"; }

 private:
  Reduction reduction_;
};
// CrossEntropyLoss(CrossEntropyLossOptions().ignore_index(0).label_smoothing(0.1)), or with a
// reduction alone: CrossEntropyLoss(kSum).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions options = {}) : options_(options) {}
  explicit CrossEntropyLoss(Reduction reduction)
      : options_(CrossEntropyLossOptions().reduction(reduction)) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::cross_entropy(input, target, options_);
  }
  const CrossEntropyLossOptions& options() const { return options_; }
  std::string repr() const { return "CrossEntropyLoss()"; }

 private:
  CrossEntropyLossOptions options_;
};

}  // namespace lazyfuse::nn
