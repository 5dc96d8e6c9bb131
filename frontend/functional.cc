// nn::functional and the row ops (softmax, logsumexp, argmax), composed from tensor.h's ops.
#include "lazyfuse/frontend/functional.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autocast.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

namespace {

[[noreturn]] void fail(const std::string& message, const Loc& where) {
  throw ShapeError(absl::StrCat(message, " (at ", SourceLoc::from(where).str(), ")"));
}

int64_t dim_of(const Tensor& x, int64_t dim, const char* what, const Loc& where) {
  try {
    return normalize_dim(dim, x.dim(), what);
  } catch (const Error&) {
    detail::rethrow_at(where);
  }
}

// The row maximum a stable softmax subtracts. It changes no result, so no gradient flows
// through it (which would sum to zero anyway).
Tensor row_max(const Tensor& x, int64_t dim, const Loc& where) {
  return x.max(dim, /*keepdim=*/true, where).detach();
}

Tensor reduce_loss(const Tensor& loss, Reduction reduction, const Loc& where) {
  switch (reduction) {
    case Reduction::None:
      return loss;
    case Reduction::Sum:
      return loss.sum(where);
    case Reduction::Mean:
      return loss.mean(where);
  }
  return loss;
}

// Indices 0..n-1 along `dim` of a tensor of rank `rank`, shaped to broadcast against it.
Tensor positions(int64_t n, int64_t dim, int64_t rank, Device device, const Loc& where) {
  Shape shape(static_cast<size_t>(rank - dim), 1);
  shape[0] = n;
  return arange(n, TensorOptions(kInt64).device(device), where).reshape(shape, where);
}

Tensor arg_extreme(const Tensor& x, int64_t dim, bool keepdim, bool largest, const Loc& where) {
  if (x.dim() == 0) return zeros({}, TensorOptions(kInt64).device(x.device()), where);
  dim = dim_of(x, dim, largest ? "argmax" : "argmin", where);
  const Tensor extreme =
      largest ? x.max(dim, true, where).detach() : x.min(dim, true, where).detach();
  // The first position that holds the extreme, or the first NaN (which is the extreme).
  const Tensor hit = lazyfuse::where(x == extreme, 1, (x != x).to(kInt64, where), where) > 0;
  const int64_t n = x.size(dim);
  return lazyfuse::where(hit, positions(n, dim, x.dim(), x.device(), where), n, where)
      .min(dim, keepdim, where);
}

}  // namespace

Tensor softmax(const Tensor& input, int64_t dim, Loc where) {
  const Tensor x = detail::autocast_float32(input);
  dim = dim_of(x, dim, "softmax", where);
  const Tensor e = (x - row_max(x, dim, where)).exp(where);
  // Times the sum's reciprocal, as torch.softmax computes it: one division a row rather than
  // one an element (a vector division costs about what the row's exp does), for at most one
  // more rounding.
  return e * (1.0 / e.sum({dim}, true, where));
}

Tensor log_softmax(const Tensor& input, int64_t dim, Loc where) {
  const Tensor x = detail::autocast_float32(input);
  dim = dim_of(x, dim, "log_softmax", where);
  const Tensor shifted = x - row_max(x, dim, where);
  return shifted - shifted.exp(where).sum({dim}, true, where).log(where);
}

Tensor logsumexp(const Tensor& input, std::vector<int64_t> dims, bool keepdim, Loc where) {
  const Tensor x = detail::autocast_float32(input);
  if (dims.empty())
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  Tensor m = x.detach();
  for (int64_t& d : dims) {
    d = dim_of(x, d, "logsumexp", where);
    m = m.max(d, true, where);
  }
  // A row of infinities (or of -inf alone) would give inf - inf: shift by 0 there instead.
  m = lazyfuse::where(m.abs(where) == std::numeric_limits<double>::infinity(), 0, m, where);
  Tensor result = (x - m).exp(where).sum(dims, true, where).log(where) + m;
  if (keepdim) return result;
  Shape shape;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) shape.push_back(x.size(d));
  return result.reshape(shape, where);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim, Loc where) {
  return arg_extreme(x, dim, keepdim, true, where);
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim, Loc where) {
  return arg_extreme(x, dim, keepdim, false, where);
}

Tensor one_hot(const Tensor& labels, int64_t num_classes, Loc where) {
  if (!is_integral(labels.dtype()))
    throw DTypeError(absl::StrCat("one_hot is only applicable to index tensors, got ",
                                  dtype_torch_name(labels.dtype()), " (at ",
                                  SourceLoc::from(where).str(), ")"));
  if (num_classes < 0) fail(absl::StrCat("one_hot: num_classes ", num_classes, " < 0"), where);
  const Tensor classes = arange(num_classes, TensorOptions(kInt64).device(labels.device()), where);
  return (labels.unsqueeze(-1, where) == classes).to(kInt64, where);
}

namespace nn::functional {

Tensor relu(const Tensor& x, Loc where) { return x.relu(where); }
Tensor sigmoid(const Tensor& x, Loc where) { return x.sigmoid(where); }
Tensor tanh(const Tensor& x, Loc where) { return x.tanh(where); }
Tensor softmax(const Tensor& x, int64_t dim, Loc where) { return lazyfuse::softmax(x, dim, where); }
Tensor log_softmax(const Tensor& x, int64_t dim, Loc where) {
  return lazyfuse::log_softmax(x, dim, where);
}

Tensor gelu(const Tensor& x, const std::string& approximate, Loc where) {
  if (approximate == "none") return x * ((x * M_SQRT1_2).erf(where) + 1) * 0.5;
  if (approximate == "tanh") {
    const double k = std::sqrt(2.0 / M_PI);
    return x * (((x + x * x * x * 0.044715) * k).tanh(where) + 1) * 0.5;
  }
  throw Error(absl::StrCat("gelu: approximate must be \"none\" or \"tanh\", got \"", approximate,
                           "\" (at ", SourceLoc::from(where).str(), ")"));
}

Tensor linear(const Tensor& input, const Tensor& weight_in, const Tensor& bias_in, Loc where) {
  using detail::autocast_lower;
  const Tensor x = autocast_lower(input), weight = autocast_lower(weight_in);
  const Tensor bias = autocast_lower(bias_in);
  Tensor out = matmul(x, weight.t(where), where);
  return bias.defined() ? operator+({out, where}, bias) : out;
}

namespace {

// The trailing dims of `x` that `normalized_shape` names, or a ShapeError naming `what`.
std::vector<int64_t> normalized_dims(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                                     const char* what, const Loc& where) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool matches = k <= x.dim();
  for (int64_t i = 0; matches && i < k; ++i)
    matches = x.size(x.dim() - k + i) == normalized_shape[i];
  if (!matches)
    fail(absl::StrCat(what, ": normalized_shape ",
                      shape_str(Shape(normalized_shape.begin(), normalized_shape.end())),
                      " is not the end of the input's shape ", shape_str(x.sizes())),
         where);
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// The difference between 1 and the next value of the dtype (torch.finfo(dtype).eps).
double machine_epsilon(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return std::numeric_limits<double>::epsilon();
    case DType::Float16:
      return 0x1p-10;
    case DType::BFloat16:
      return 0x1p-7;
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

}  // namespace

Tensor layer_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight_in, const Tensor& bias_in, double eps, Loc where) {
  using detail::autocast_float32;
  const Tensor x = autocast_float32(input);
  const Tensor weight = autocast_float32(weight_in), bias = autocast_float32(bias_in);
  const std::vector<int64_t> dims = normalized_dims(x, normalized_shape, "layer_norm", where);
  const Tensor centered = x - x.mean(dims, true, where);
  const Tensor variance = (centered * centered).mean(dims, true, where);  // biased, as PyTorch
  Tensor y = centered * (variance + eps).rsqrt(where);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

Tensor rms_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                const Tensor& weight_in, std::optional<double> eps, Loc where) {
  const Tensor x = detail::autocast_float32(input);
  const Tensor weight = detail::autocast_float32(weight_in);
  const std::vector<int64_t> dims = normalized_dims(x, normalized_shape, "rms_norm", where);
  const double epsilon = eps.value_or(machine_epsilon(x.dtype()));
  Tensor y = x * ((x * x).mean(dims, true, where) + epsilon).rsqrt(where);
  if (weight.defined()) y = y * weight;
  return y;
}

Tensor normalize(const Tensor& input, double p, int64_t dim, double eps, Loc where) {
  const Tensor x = detail::autocast_float32(input);
  if (!(p > 0) || !std::isfinite(p))
    fail(absl::StrCat("normalize: p must be positive and finite, got ", p), where);
  dim = dim_of(x, dim, "normalize", where);
  const Tensor norm = p == 2 ? (x * x).sum({dim}, true, where).sqrt(where)
                      : p == 1
                          ? x.abs(where).sum({dim}, true, where)
                          : x.abs(where).pow(p, where).sum({dim}, true, where).pow(1 / p, where);
  return x / norm.clamp_min(eps, where);
}

Tensor embedding(const Tensor& input, const Tensor& weight, Loc where) {
  if (weight.dim() != 2)
    fail(absl::StrCat("embedding: 'weight' must be 2-D, got shape ", shape_str(weight.sizes())),
         where);
  if (input.dtype() != kInt64 && input.dtype() != kInt32)
    throw DTypeError(
        absl::StrCat("embedding: expected indices of dtype int64 or int32 (Long, Int), got ",
                     dtype_torch_name(input.dtype()), " (at ", SourceLoc::from(where).str(), ")"));
  Shape shape = input.sizes();
  shape.push_back(weight.size(1));
  return index_select(weight, 0, input.reshape({-1}, where), where).reshape(shape, where);
}

Tensor dropout(const Tensor& x, double p, bool training, Loc where) {
  if (p < 0 || p > 1)
    throw Error(absl::StrCat("dropout probability has to be between 0 and 1, but got ", p, " (at ",
                             SourceLoc::from(where).str(), ")"));
  if (!training || p == 0) return x;
  if (p == 1) return x * 0;
  const Tensor keep = rand(x.sizes(), TensorOptions(x.dtype()).device(x.device()), where) >= p;
  return lazyfuse::where(keep, x * (1.0 / (1.0 - p)), 0, where);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction, Loc where) {
  const Tensor a = detail::autocast_float32(input), b = detail::autocast_float32(target);
  const Tensor diff = operator-({a, where}, b);
  return reduce_loss(diff * diff, reduction, where);
}

namespace {

// The class dim of cross_entropy's input ([C]: 0, else 1), after checking the input and target
// against each other as PyTorch does.
int64_t check_cross_entropy(const Tensor& input, const Tensor& target,
                            const CrossEntropyFuncOptions& options, const Loc& where) {
  if (input.dim() == 0)
    fail(
        "cross_entropy: input must have a dim of classes ([C], [N, C] or [N, C, d1, ...]), got "
        "a 0-d tensor",
        where);
  const int64_t class_dim = input.dim() == 1 ? 0 : 1;
  Shape expected = input.sizes();
  expected.erase(expected.begin() + class_dim);
  if (target.sizes() != expected)
    fail(absl::StrCat("cross_entropy: input of shape ", shape_str(input.sizes()),
                      " (classes along dim ", class_dim, ") needs a target of shape ",
                      shape_str(expected), ", got ", shape_str(target.sizes())),
         where);
  if (!is_integral(target.dtype()))
    throw DTypeError(
        absl::StrCat("cross_entropy: target must hold class indices (int64 or int32), "
                     "got ",
                     dtype_torch_name(target.dtype()), " (at ", SourceLoc::from(where).str(), ")"));
  if (!is_floating(input.dtype()))
    throw DTypeError(absl::StrCat("cross_entropy: input must be floating (logits), got ",
                                  dtype_torch_name(input.dtype()), " (at ",
                                  SourceLoc::from(where).str(), ")"));
  if (!(options.label_smoothing() >= 0 && options.label_smoothing() <= 1))
    throw ValueError(
        absl::StrCat("cross_entropy: label_smoothing must be between 0.0 and 1.0, got ",
                     options.label_smoothing(), " (at ", SourceLoc::from(where).str(), ")"));
  return class_dim;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyFuncOptions& options, Loc where) {
  const Tensor input = detail::autocast_float32(logits);
  const int64_t class_dim = check_cross_entropy(input, target, options, where);
  const int64_t classes = input.size(class_dim);
  const double smoothing = options.label_smoothing();
  const Tensor log_probabilities = lazyfuse::log_softmax(input, class_dim, where);
  // An ignored target is made -1, which no class matches, so its element's sum below is 0
  // without a select after it: per-element ops between the row sums and the loss would cut the
  // row kernel that computes the loss and its gradient with the softmax.
  const Tensor ignored = target == options.ignore_index();
  const Tensor label = lazyfuse::where(ignored, -1, target.to(kInt64, where), where);
  // The target's class picked by comparing it with each class's index: a select rather than a
  // gather, so that the loss and its gradient fuse with the softmax around them.
  const Tensor chosen = label.unsqueeze(class_dim, where) ==
                        positions(classes, class_dim, input.dim(), input.device(), where);
  // where, not a product with the one-hot: a -inf log-probability of another class stays out.
  Tensor loss =
      -lazyfuse::where(chosen, log_probabilities, 0, where).sum({class_dim}, false, where);
  if (smoothing > 0) {
    const Tensor uniform = -log_probabilities.sum({class_dim}, false, where);
    loss = loss * (1 - smoothing) +
           lazyfuse::where(ignored, 0, uniform, where) * (smoothing / static_cast<double>(classes));
  }
  if (options.reduction() != Reduction::Mean) return reduce_loss(loss, options.reduction(), where);
  // PyTorch's mean counts the targets not ignored (all ignored: 0 / 0). Each element is weighted
  // by 1 / count before the sum, rather than the sum divided: its gradient is then that
  // per-element weight, computed from the targets alone before the row kernel, which reads it
  // as it reads the labels, instead of a scalar computed after the forward sums.
  const Tensor kept = lazyfuse::where(ignored, 0, 1, where).to(loss.dtype(), where);
  return (loss * (kept / kept.sum(where))).sum(where);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, Loc where) {
  const Tensor input = detail::autocast_float32(logits);
  const int64_t class_dim = check_cross_entropy(input, target, CrossEntropyFuncOptions(), where);
  // No target ignored: the mean is over every element, whose gradient scale 1/numel is a
  // constant, so the passes fuse the loss, its gradient and the softmax into one row kernel.
  const Tensor log_probabilities = lazyfuse::log_softmax(input, class_dim, where);
  const Tensor chosen =
      target.unsqueeze(class_dim, where).to(kInt64, where) ==
      positions(input.size(class_dim), class_dim, input.dim(), input.device(), where);
  const Tensor loss =
      -lazyfuse::where(chosen, log_probabilities, 0, where).sum({class_dim}, false, where);
  return reduce_loss(loss, reduction, where);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target_in,
                                        Reduction reduction, Loc where) {
  const Tensor input = detail::autocast_float32(logits),
               target = detail::autocast_float32(target_in);
  // log(1 + exp(-x)) = relu(-x) + log1p(exp(-|x|)): no overflow for any x.
  const Tensor softplus_neg = (-input).relu(where) + (-input.abs(where)).exp(where).log1p(where);
  const Tensor loss = (1 - target) * input + softplus_neg;
  return reduce_loss(loss, reduction, where);
}

}  // namespace nn::functional
}  // namespace lazyfuse
