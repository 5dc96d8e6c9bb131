// nn::functional: activations, normalizations and losses, as LibTorch's torch::nn::functional.
// Each is written in the ops of tensor.h, so it is lazy, fuses with what surrounds it, and has
// its gradient from the ops' rules.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse {

// How a loss reduces over the batch (LibTorch's torch::kMean, kSum, kNone).
enum class Reduction { None, Mean, Sum };
inline constexpr Reduction kNone = Reduction::None;
inline constexpr Reduction kMean = Reduction::Mean;
inline constexpr Reduction kSum = Reduction::Sum;

// Rows made into probabilities along `dim`, and their logarithms, computed stably (the row's
// maximum subtracted first). softmax multiplies by the reciprocal of the row's sum, as
// torch.softmax does, rather than dividing each element by it.
Tensor softmax(const Tensor& x, int64_t dim, Loc where = Loc::current());
Tensor log_softmax(const Tensor& x, int64_t dim, Loc where = Loc::current());
Tensor logsumexp(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false,
                 Loc where = Loc::current());
// The index of the first maximum (minimum) along `dim`, as int64; NaN counts as the maximum
// (and the minimum), as in PyTorch.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false, Loc where = Loc::current());
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false, Loc where = Loc::current());
// [..., num_classes] int64 with a 1 at each label.
Tensor one_hot(const Tensor& labels, int64_t num_classes, Loc where = Loc::current());

namespace nn::functional {

Tensor relu(const Tensor& x, Loc where = Loc::current());
// Exact GELU, x * Phi(x) (approximate = "none"), or its tanh approximation ("tanh").
Tensor gelu(const Tensor& x, const std::string& approximate = "none", Loc where = Loc::current());
Tensor sigmoid(const Tensor& x, Loc where = Loc::current());
Tensor tanh(const Tensor& x, Loc where = Loc::current());
Tensor softmax(const Tensor& x, int64_t dim, Loc where = Loc::current());
Tensor log_softmax(const Tensor& x, int64_t dim, Loc where = Loc::current());
// x W^T + b.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              Loc where = Loc::current());
// Normalizes over the trailing dims `normalized_shape`, then scales and shifts (each optional).
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight = {}, const Tensor& bias = {}, double eps = 1e-5,
                  Loc where = Loc::current());
// Divides by the root mean square over the trailing dims `normalized_shape` (after adding eps,
// by default the dtype's machine epsilon, as PyTorch's), then scales by weight (optional).
Tensor rms_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                const Tensor& weight = {}, std::optional<double> eps = std::nullopt,
                Loc where = Loc::current());
// x over its p-norm along dim, the norm at least eps (PyTorch's normalize). p > 0.
Tensor normalize(const Tensor& x, double p = 2.0, int64_t dim = 1, double eps = 1e-12,
                 Loc where = Loc::current());
// The rows of `weight` ([num_embeddings, embedding_dim]) that `input` (int64 or int32 indices,
// any shape) names, shaped as input with embedding_dim appended. An index outside the table is
// an IndexError when the value is computed. Its gradient sums into the rows looked up.
Tensor embedding(const Tensor& input, const Tensor& weight, Loc where = Loc::current());
// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Loc where = Loc::current());

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = kMean,
                Loc where = Loc::current());
// input [N, C] logits (or [C]), target [N] (or []) int64 class indices.
Tensor cross_entropy(const Tensor& input, const Tensor& target, Reduction reduction = kMean,
                     Loc where = Loc::current());
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = kMean, Loc where = Loc::current());

}  // namespace nn::functional

}  // namespace lazyfuse
