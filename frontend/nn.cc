// The layers: Linear, the activations, LayerNorm, RMSNorm, Embedding, Sequential.
#include "lazyfuse/frontend/nn.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse::nn {

using detail::compute_initial;
using detail::initial;

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  if (in_features < 0 || out_features < 0)
    throw ShapeError(absl::StrCat("Linear: negative size (in_features=", in_features,
                                  ", out_features=", out_features, ")"));
  // PyTorch's kaiming_uniform_(a=sqrt(5)) comes down to this bound for both.
  double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  weight_ = initial({out_features, in_features}, [&] {
    return rand({out_features, in_features}) * (2 * bound) - bound;
  });
  if (bias)
    bias_ = initial({out_features}, [&] { return rand({out_features}) * (2 * bound) - bound; });
  compute_initial(parameters());
  weight_.requires_grad_();
  if (bias) bias_.requires_grad_();
}

std::vector<std::pair<std::string, Tensor*>> Linear::own_parameters() {
  return {{"weight", &weight_}, {"bias", &bias_}};
}

Tensor Linear::forward(const Tensor& input) {
  if (input.dim() == 0 || input.size(-1) != in_features_)
    throw ShapeError(absl::StrCat("Linear(in_features=", in_features_, "): input of shape ",
                                  shape_str(input.sizes()), " does not end in ", in_features_));
  return functional::linear(input, weight_, bias_);
}

std::string Linear::repr() const {
  return absl::StrCat("Linear(in_features=", in_features_, ", out_features=", out_features_,
                      ", bias=", bias_.defined() ? "True" : "False", ")");
}

Tensor GELU::forward(const Tensor& input) { return functional::gelu(input, approximate_); }
std::string GELU::repr() const {
  return approximate_ == "none" ? "GELU(approximate='none')"
                                : absl::StrCat("GELU(approximate='", approximate_, "')");
}

Tensor Flatten::forward(const Tensor& input) {
  if (input.dim() == 0) return input.reshape({1});
  const int64_t start = normalize_dim(start_dim_, input.dim(), "flatten");
  const int64_t end = normalize_dim(end_dim_, input.dim(), "flatten");
  if (start > end)
    throw ShapeError(absl::StrCat("flatten() has invalid args: start_dim (", start_dim_,
                                  ") cannot come after end_dim (", end_dim_, ")"));
  Shape shape;
  int64_t flat = 1;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d < start || d > end) {
      shape.push_back(input.size(d));
      continue;
    }
    flat *= input.size(d);
    if (d == end) shape.push_back(flat);
  }
  return input.reshape(shape);
}
std::string Flatten::repr() const {
  return absl::StrCat("Flatten(start_dim=", start_dim_, ", end_dim=", end_dim_, ")");
}

Dropout::Dropout(double p) : p_(p) {
  if (p < 0 || p > 1)
    throw Error(absl::StrCat("dropout probability has to be between 0 and 1, but got ", p));
}
Tensor Dropout::forward(const Tensor& input) {
  return functional::dropout(input, p_, is_training());
}
std::string Dropout::repr() const { return absl::StrCat("Dropout(p=", p_, ", inplace=False)"); }

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  if (elementwise_affine) {
    const Shape shape(normalized_shape_.begin(), normalized_shape_.end());
    weight_ = initial(shape, [&] { return ones(shape); });
    bias_ = zeros(shape);
    compute_initial({weight_, bias_});
    weight_.requires_grad_();
    bias_.requires_grad_();
  }
}
Tensor LayerNorm::forward(const Tensor& input) {
  return functional::layer_norm(input, normalized_shape_, weight_, bias_, eps_);
}
namespace {
// A shape as a Python tuple prints: "(1024,)", "(4, 8)".
std::string python_tuple(const std::vector<int64_t>& shape) {
  std::string text;
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&text, i ? ", " : "", shape[i]);
  if (shape.size() == 1) text += ",";
  return absl::StrCat("(", text, ")");
}
}  // namespace

std::string LayerNorm::repr() const {
  return absl::StrCat("LayerNorm(", python_tuple(normalized_shape_), ", eps=", eps_,
                      ", elementwise_affine=", weight_.defined() ? "True" : "False", ")");
}
std::vector<std::pair<std::string, Tensor*>> LayerNorm::own_parameters() {
  return {{"weight", &weight_}, {"bias", &bias_}};
}

RMSNorm::RMSNorm(std::vector<int64_t> normalized_shape, std::optional<double> eps,
                 bool elementwise_affine)
    : normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  if (elementwise_affine) {
    const Shape shape(normalized_shape_.begin(), normalized_shape_.end());
    weight_ = initial(shape, [&] { return ones(shape); });
    compute_initial({weight_});
    weight_.requires_grad_();
  }
}
Tensor RMSNorm::forward(const Tensor& input) {
  return functional::rms_norm(input, normalized_shape_, weight_, eps_);
}
std::string RMSNorm::repr() const {
  return absl::StrCat("RMSNorm(", python_tuple(normalized_shape_),
                      ", eps=", eps_ ? absl::StrCat(*eps_) : "None",
                      ", elementwise_affine=", weight_.defined() ? "True" : "False", ")");
}
std::vector<std::pair<std::string, Tensor*>> RMSNorm::own_parameters() {
  return {{"weight", &weight_}};
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  if (num_embeddings < 0 || embedding_dim < 0)
    throw ShapeError(absl::StrCat("Embedding: negative size (num_embeddings=", num_embeddings,
                                  ", embedding_dim=", embedding_dim, ")"));
  weight_ = initial({num_embeddings, embedding_dim}, [&] {
    return randn({num_embeddings, embedding_dim});
  });
  compute_initial({weight_});
  weight_.requires_grad_();
}
Tensor Embedding::forward(const Tensor& input) { return functional::embedding(input, weight_); }
std::string Embedding::repr() const {
  return absl::StrCat("Embedding(", num_embeddings_, ", ", embedding_dim_, ")");
}
std::vector<std::pair<std::string, Tensor*>> Embedding::own_parameters() {
  return {{"weight", &weight_}};
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& child : children_) x = child.second->forward(x);
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  if (index >= children_.size())
    throw Error(absl::StrCat("index ", index, " is out of range for Sequential with ",
                             children_.size(), " modules"));
  return children_[index].second;
}

}  // namespace lazyfuse::nn
