// Module, Linear, Sequential.
#include "frontend/nn.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ir/errors.h"

namespace lazyfuse::nn {

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  // own_parameters() hands out pointers so that to() can replace parameters; here they are
  // only copied (handles), so a const module may use it.
  for (Tensor* parameter : const_cast<Module*>(this)->own_parameters())
    if (parameter->defined()) out.push_back(*parameter);
  for (const auto& child : children_) {
    std::vector<Tensor> more = child->parameters();
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

void Module::to(Device device) {
  std::vector<Tensor> moved;
  for (Tensor* parameter : own_parameters()) {
    if (!parameter->defined()) continue;
    *parameter = parameter->to(device);
    moved.push_back(*parameter);
  }
  // Parameters hold values, not pending copies: move them now, in one evaluation.
  eval(moved);
  for (const auto& child : children_) child->to(device);
}

std::ostream& operator<<(std::ostream& os, const Module& module) { return os << module.repr(); }

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  if (in_features < 0 || out_features < 0)
    throw ShapeError(absl::StrCat("Linear: negative size (in_features=", in_features,
                                  ", out_features=", out_features, ")"));
  // PyTorch's kaiming_uniform_(a=sqrt(5)) comes down to this bound for both.
  double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  weight_ = rand({out_features, in_features}) * (2 * bound) - bound;
  if (bias) {
    bias_ = rand({out_features}) * (2 * bound) - bound;
  }
  eval(parameters());
}

std::vector<Tensor*> Linear::own_parameters() { return {&weight_, &bias_}; }

Tensor Linear::forward(const Tensor& input) {
  if (input.dim() == 0 || input.size(-1) != in_features_)
    throw ShapeError(absl::StrCat("Linear(in_features=", in_features_, "): input of shape ",
                                  shape_str(input.sizes()), " does not end in ", in_features_));
  Tensor out = matmul(input, weight_.t());
  return bias_.defined() ? out + bias_ : out;
}

std::string Linear::repr() const {
  return absl::StrCat("Linear(in_features=", in_features_, ", out_features=", out_features_,
                      ", bias=", bias_.defined() ? "True" : "False", ")");
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& child : children_) x = child->forward(x);
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  if (index >= children_.size())
    throw Error(absl::StrCat("index ", index, " is out of range for Sequential with ",
                             children_.size(), " modules"));
  return children_[index];
}

std::string Sequential::repr() const {
  std::string out = "Sequential(";
  for (size_t i = 0; i < children_.size(); ++i) {
    // Children's own lines are indented under their index, as PyTorch's _addindent.
    std::string child = absl::StrReplaceAll(children_[i]->repr(), {{"\n", "\n  "}});
    absl::StrAppend(&out, "\n  (", i, "): ", child);
  }
  absl::StrAppend(&out, children_.empty() ? "" : "\n", ")");
  return out;
}

}  // namespace lazyfuse::nn
