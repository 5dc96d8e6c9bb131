// A small nn library in LibTorch's shape: Module, Linear, Sequential.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "frontend/tensor.h"

namespace lazyfuse::nn {

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Every parameter, this module's and its children's, in registration order.
  std::vector<Tensor> parameters() const;
  // Moves every parameter to `device` (computing them there).
  virtual void to(Device device);
  // PyTorch's repr: "Linear(in_features=3, out_features=1, bias=True)".
  virtual std::string repr() const = 0;

 protected:
  // This module's own parameters (not its children's). Asked for each time rather than stored,
  // so that a module that is copied or moved never points into its old self.
  virtual std::vector<Tensor*> own_parameters() { return {}; }
  std::vector<std::shared_ptr<Module>> children_;
};

std::ostream& operator<<(std::ostream& os, const Module& module);

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
  std::vector<Tensor*> own_parameters() override;

 private:
  int64_t in_features_, out_features_;
  Tensor weight_, bias_;
};

class Sequential : public Module {
 public:
  Sequential() = default;
  template <typename... M>
  explicit Sequential(M&&... modules) {
    (push_back(std::make_shared<std::decay_t<M>>(std::forward<M>(modules))), ...);
  }
  void push_back(std::shared_ptr<Module> module) { children_.push_back(std::move(module)); }
  Tensor forward(const Tensor& input) override;
  std::string repr() const override;
  size_t size() const { return children_.size(); }
  // net[0]: the module, so net[0]->as<Linear>()->weight().
  std::shared_ptr<Module> operator[](size_t index) const;
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    return std::dynamic_pointer_cast<M>((*this)[index]);
  }
};

}  // namespace lazyfuse::nn
