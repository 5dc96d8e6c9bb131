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

namespace nn {

// cross_entropy's options, as LibTorch's torch::nn::CrossEntropyLossOptions (defaults as
// PyTorch's): setters chain, CrossEntropyLossOptions().ignore_index(0).label_smoothing(0.1).
class CrossEntropyLossOptions {
 public:
  // Targets equal to it add nothing and are not counted by the mean.
  CrossEntropyLossOptions& ignore_index(int64_t value) {
    ignore_index_ = value;
    return *this;
  }
  // In [0, 1]: the target distribution is (1 - s) one-hot + s / C uniform.
  CrossEntropyLossOptions& label_smoothing(double value) {
    label_smoothing_ = value;
    return *this;
  }
  CrossEntropyLossOptions& reduction(Reduction value) {
    reduction_ = value;
    return *this;
  }
  int64_t ignore_index() const { return ignore_index_; }
  double label_smoothing() const { return label_smoothing_; }
  Reduction reduction() const { return reduction_; }

 private:
  int64_t ignore_index_ = -100;
  double label_smoothing_ = 0.0;
  Reduction reduction_ = kMean;
};

}  // namespace nn

namespace nn::functional {

using CrossEntropyFuncOptions = CrossEntropyLossOptions;

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
// Attention as PyTorch's F.scaled_dot_product_attention: softmax(q k^T * scale + mask) v over
// query [..., L, E], key [..., S, E], value [..., S, Ev], batch dims broadcasting, giving
// [..., L, Ev]. scale defaults to 1/sqrt(E). attn_mask, broadcasting to [..., L, S], is bool
// (true: the key is seen) or of query's dtype (added to the scores); is_causal lets query i see
// keys 0..i (with no attn_mask). dropout_p > 0 drops attention weights (always, as PyTorch's
// functional does) from lazyfuse's random stream. With enable_gqa, key and value heads (dim -3)
// dividing query's are each shared by consecutive query heads. A query that sees no key gives
// zeros (PyTorch's math backend). Shapes that do not line up are a ShapeError naming them,
// dtypes that differ a DTypeError. With a float mask that needs no gradient, it is one
// attention node (ir/attention.h) where fused_attention_enabled(), its dropout inside the
// kernel with the mask the written-out form draws from the same seed.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    bool enable_gqa = false, Loc where = Loc::current());
// Whether scaled_dot_product_attention (and a hand-written attention, recognised) runs as one
// attention step where the device's backend has one for its dtype and head dims (the CPU's for
// all; CUDA's up to 256), rather than as its matmuls and softmax. On by default;
// LAZYFUSE_ATTENTION=composite turns it off, as torch.backends.cuda.enable_flash_sdp(False) does
// PyTorch's.
void set_fused_attention_enabled(bool enabled);
bool fused_attention_enabled();
// The setting for one scope: FusedAttentionGuard composite(false);
class FusedAttentionGuard {
 public:
  explicit FusedAttentionGuard(bool enabled) : saved_(fused_attention_enabled()) {
    set_fused_attention_enabled(enabled);
  }
  ~FusedAttentionGuard() { set_fused_attention_enabled(saved_); }
  FusedAttentionGuard(const FusedAttentionGuard&) = delete;
  FusedAttentionGuard& operator=(const FusedAttentionGuard&) = delete;

 private:
  bool saved_;
};
// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Loc where = Loc::current());

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = kMean,
                Loc where = Loc::current());
// PyTorch's cross_entropy with class-index targets: input logits [N, C, d1, ..., dk] (the
// classes along dim 1; [N, C] and [C] too), target integer classes [N, d1, ..., dk] ([] for
// [C]). Each element's loss is -(1 - s) log p[target] - s/C sum_c log p[c] (s the label
// smoothing), 0 where target == ignore_index; kMean divides the sum by the number of targets
// not ignored (NaN when all are, as PyTorch). A target outside [0, C) that is not ignored
// matches no class and adds 0 (its smoothing term aside): PyTorch raises there, but the values
// are not known until computed.
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyFuncOptions& options, Loc where = Loc::current());
// The same with no target ignored (a target outside [0, C) adds 0) and no smoothing: the mean
// is over every element, a constant scale that lets a training step's loss, gradient and
// softmax fuse into one row kernel, where the mean over targets not ignored needs a count
// computed at run time and today costs several passes over [N, C].
Tensor cross_entropy(const Tensor& input, const Tensor& target, Reduction reduction = kMean,
                     Loc where = Loc::current());
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = kMean, Loc where = Loc::current());

}  // namespace nn::functional

}  // namespace lazyfuse
