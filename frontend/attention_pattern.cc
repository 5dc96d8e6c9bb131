// Note [Attention written by hand]
// A model author writes attention as
//   scores = q.matmul(k.transpose(-2, -1)) * scale;         // or / sqrt(d), or no scale
//   scores = scores.masked_fill(~seen, -inf);               // or where(seen, scores, -inf), a
//                                                           // causal mask from two aranges,
//                                                           // an added bias, a tanh soft-cap
//   weights = softmax(scores, -1);                          // or exp(s - max) / sum, ...
//   weights = dropout(weights, p);                          // optional
//   out = weights.matmul(v);
// When the last product is made, Tensor::matmul asks attention_from_pattern whether its left
// operand is such a softmax, walking the pending values back from it (op by op, each with its
// autograd edge, so that gradients still reach the q, k, v and mask the author made). If it is,
// the product is made as one attention node over q, k = (k^T)^T, v and the modifiers found, as
// scaled_dot_product_attention makes it (frontend/attention.cc), with its gradient rule; the
// scores and weights stay pending values of their own, computed only if something else reads
// them (a model that returns its attention weights computes them apart, and the attention
// kernel recomputes them: that is the price of keeping the scores out of memory).
//
// Recognised, from the product inwards: dropout as nn::functional::dropout writes it
// (where(rand >= p, w * (1 / (1 - p)), 0), the rand over the weights' shape and dtype), whose
// draw the node takes over (its seed and offset: the same probabilities dropped); a softmax over
// the last dim spelled as the frontend's
// softmax (e * (1 / sum e)), e / sum e, or the zero-safe form of scaled_dot_product_attention,
// with or without the maximum subtracted; then, in this order from the outside, masks (where or
// masked_fill with -infinity; at most one tensor mask, and a comparison of a query position
// with a key position, two aranges, that is the causal mask), an added bias, a soft-cap
// c * tanh(s / c), and scalar factors, down to a product of two matrices. Anything else, or a
// value already computed, leaves the product a matmul: the graph is still right, just
// unfused. Decided: a query that sees no key gives zeros, where the unfused softmax of a row of
// -infinity gives NaN (the attention kernels' rule, as PyTorch's scaled_dot_product_attention).
#include <cmath>
#include <limits>
#include <optional>

#include "lazyfuse/frontend/attention.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/functional.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse::detail {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// A pending value walked back from the product, with the autograd edge its tensor had (null
// where it needs no gradient). `broken` where the walk passed a value whose gradient the fused
// node would not give as written: a leaf that requires grad, a tensor that retains its grad, a
// backward graph already released, or an edge that does not match the value.
struct Walked {
  LazyRef value;
  std::shared_ptr<AutogradMeta> edge;
  bool broken = false;

  const Node& node() const { return value->node; }
  bool is(Op op) const { return !is_computed(value) && value->node.op == op; }
  // Operand i, with the edge that the op's recorded gradient gives it.
  Walked input(size_t i) const {
    Walked in{value->inputs[i], nullptr, broken};
    if (edge == nullptr) return in;
    const std::shared_ptr<GradNode>& node = edge->grad_fn;
    if (node == nullptr || edge->retains_grad || node->released || i >= node->operands.size() ||
        node->operands[i].value != in.value) {
      in.broken = true;
      return in;
    }
    in.edge = node->operands[i].edge;
    return in;
  }
  // The same value with the same gradient.
  bool same(const Walked& other) const { return value == other.value && edge == other.edge; }
  Tensor tensor() const {
    auto impl = std::make_shared<TensorImpl>(value);
    impl->autograd = edge;
    return Tensor(std::move(impl));
  }
};

// The value of a one-element constant.
std::optional<double> constant(const Walked& x) {
  if (!x.is(Op::Const) || numel(x.node().shape) != 1) return std::nullopt;
  return x.node().attrs.get_float("value");
}

// Whether reduction `x` reduces the last dim alone, keeping it.
bool reduces_last_dim(const Walked& x) {
  const Node& node = x.node();
  const int64_t rank = static_cast<int64_t>(x.input(0).node().shape.size());
  const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
  return dims.size() == 1 && dims[0] == rank - 1 && node.attrs.has("keepdim") &&
         node.attrs.get_bool("keepdim");
}

// where(m == bad, fine, m) -> m: the zero-safe forms of the maximum and the sum.
Walked unguarded(const Walked& x, double bad, double fine) {
  if (!x.is(Op::Where)) return x;
  const Walked test = x.input(0), guarded = x.input(2);
  if (test.is(Op::Eq) && test.input(0).value == guarded.value && constant(test.input(1)) == bad &&
      constant(x.input(1)) == fine)
    return guarded;
  return x;
}

// The scores x of weights = softmax(x) over the last dim, in any of the spellings above.
std::optional<Walked> softmax_operand(const Walked& weights) {
  std::optional<Walked> e, total;
  if (weights.is(Op::Div)) {
    e = weights.input(0);
    total = unguarded(weights.input(1), 0, 1);
  } else if (weights.is(Op::Mul)) {
    for (int side : {0, 1}) {
      const Walked reciprocal = weights.input(1 - side);
      if (reciprocal.is(Op::Div) && constant(reciprocal.input(0)) == 1.0) {
        e = weights.input(side);
        total = unguarded(reciprocal.input(1), 0, 1);
      }
    }
  }
  // The sum is of the very exponentials divided (a detached one would change the gradient).
  if (!e || !e->is(Op::Exp) || !total->is(Op::Sum) || !total->input(0).same(*e) ||
      !reduces_last_dim(*total))
    return std::nullopt;
  const Walked shifted = e->input(0);
  if (!shifted.is(Op::Sub)) return shifted;  // exp(x) / sum exp(x)
  const Walked top = unguarded(shifted.input(1), -kInfinity, 0);
  // The maximum may be detached (the frontend's softmax detaches it): a shift of a row changes
  // neither its softmax nor its gradient.
  if (top.is(Op::Max) && top.input(0).value == shifted.input(0).value && reduces_last_dim(top))
    return shifted.input(0);
  return shifted;  // not the row's maximum: x - y as the scores, which parse_scores refuses
}

// The weights w of where(rand >= p, w * (1 / (1 - p)), 0), dropout as nn::functional::dropout
// writes it, with p and the rand's seed and offset in `modifiers`; x itself without dropout.
std::optional<Walked> undropped(const Walked& x, ScoreModifiers& modifiers) {
  if (!x.is(Op::Where)) return x;
  const Walked test = x.input(0), kept = x.input(1);
  if (!test.is(Op::Ge) || constant(x.input(2)) != 0.0 || !kept.is(Op::Mul)) return std::nullopt;
  const Walked draw = test.input(0);
  const std::optional<double> p = constant(test.input(1));
  if (!draw.is(Op::Rand) || !p || !(*p > 0 && *p < 1) || draw.node().shape != x.node().shape ||
      draw.node().dtype != x.node().dtype)
    return std::nullopt;
  for (int side : {0, 1}) {
    if (constant(kept.input(side)) != 1.0 / (1.0 - *p)) continue;
    modifiers.dropout = *p;
    modifiers.seed = static_cast<uint64_t>(draw.node().attrs.get_int("seed"));
    modifiers.offset = static_cast<uint64_t>(draw.node().attrs.get_int("offset"));
    return kept.input(1 - side);
  }
  return std::nullopt;
}

// Whether `view` is a position along one of the scores' last two dims: a view of arange(0, n)
// that varies along dim -2 (a query's position: returns 0) or dim -1 (a key's: returns 1).
std::optional<int> axis_of(const Walked& view) {
  Walked x = view;
  // Casts that keep every position (to int32, int64, float64, or float32 up to 2^24).
  auto exact_cast = [&](const Walked& c) {
    const DType to = c.node().dtype;
    return c.is(Op::Cast) && (to == DType::Int32 || to == DType::Int64 || to == DType::Float64 ||
                              (to == DType::Float32 && numel(c.node().shape) <= (1 << 24)));
  };
  while (x.is(Op::Reshape) || x.is(Op::Expand) || exact_cast(x)) x = x.input(0);
  if (!x.is(Op::Arange) || x.node().attrs.has("period") || x.node().attrs.get_float("start") != 0 ||
      x.node().attrs.get_float("step") != 1)
    return std::nullopt;
  const Shape& shape = view.node().shape;
  const int64_t n = x.node().shape.empty() ? 1 : x.node().shape[0];
  // The view's one dim of size other than 1 is the arange's.
  int varying = -1, count = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) varying = static_cast<int>(d), ++count;
  if (n <= 1 || count != 1 || shape[varying] != n) return std::nullopt;
  const int from_end = static_cast<int>(shape.size()) - varying;
  if (from_end == 2) return 0;
  if (from_end == 1) return 1;
  return std::nullopt;
}

// Whether a comparison c, where it is `seen_when` (true or false), lets query i see key j
// exactly when j <= i: the causal mask.
bool is_causal_mask(const Walked& c, bool seen_when) {
  const Op op = c.node().op;
  if (is_computed(c.value) || !(op == Op::Ge || op == Op::Le || op == Op::Gt || op == Op::Lt))
    return false;
  const std::optional<int> a = axis_of(c.input(0)), b = axis_of(c.input(1));
  if (!a || !b || *a == *b) return false;
  // Written as (query position) OP (key position).
  const Op as_query_first = *a == 0        ? op
                            : op == Op::Ge ? Op::Le
                            : op == Op::Le ? Op::Ge
                            : op == Op::Gt ? Op::Lt
                                           : Op::Gt;
  // seen: i >= j; masked: i < j.
  return seen_when ? as_query_first == Op::Ge : as_query_first == Op::Lt;
}

// What the scores were made of.
struct Scores {
  Tensor q, key_transposed, mask, bias;
  ScoreModifiers modifiers;
  bool broken = false;  // a value taken was reached past a gradient the node would not give
};

// The modifiers in the order they apply from the outside in.
enum class Stage { kMasks, kBias, kSoftcap, kScale };

// s where x = cap * tanh(s / cap) (or tanh(s * (1 / cap))), with the cap.
std::optional<std::pair<Walked, double>> softcap_operand(const Walked& x) {
  if (!x.is(Op::Mul)) return std::nullopt;
  for (int side : {0, 1}) {
    const std::optional<double> cap = constant(x.input(side));
    const Walked t = x.input(1 - side);
    if (!cap || *cap <= 0 || !t.is(Op::Tanh)) continue;
    const Walked inside = t.input(0);
    const bool divides = inside.is(Op::Div), multiplies = inside.is(Op::Mul);
    const std::optional<double> by =
        divides || multiplies ? constant(inside.input(1)) : std::nullopt;
    if (by && std::fabs((divides ? *by / *cap : *by * *cap) - 1) <= 1e-12)
      return std::pair{inside.input(0), *cap};
  }
  return std::nullopt;
}

// Peels the modifiers off scores x from stage `from` inwards, down to the product.
bool parse_scores(Walked x, Scores& s, Stage from) {
  Stage stage = from;
  for (;;) {
    if (x.is(Op::Matmul)) {
      const Walked a = x.input(0), b = x.input(1);
      if (a.node().shape.size() < 2 || b.node().shape.size() < 2) return false;
      s.q = a.tensor();
      s.key_transposed = b.tensor();
      s.broken |= a.broken || b.broken;
      return true;
    }
    if (stage <= Stage::kMasks && x.is(Op::Where)) {
      const Walked c = x.input(0);
      const bool keeps_true = constant(x.input(2)) == -kInfinity;
      if (!keeps_true && constant(x.input(1)) != -kInfinity) return false;
      if (is_causal_mask(c, keeps_true)) {
        s.modifiers.causal = true;
      } else {
        if (s.mask.defined() || c.node().dtype != DType::Bool) return false;
        s.mask = keeps_true ? c.tensor() : c.tensor() == false;
      }
      x = x.input(keeps_true ? 1 : 2);
      continue;
    }
    if (stage <= Stage::kBias && x.is(Op::Add)) {
      // The side that leads on to the product is the scores; the other, the bias.
      for (int side : {0, 1}) {
        Scores inner = s;
        const Walked bias = x.input(1 - side);
        inner.bias = bias.tensor();
        inner.broken |= bias.broken;
        // A bias of the scores' dtype that needs no gradient (the node has none for it).
        if (!constant(bias) && bias.node().dtype == x.node().dtype && !inner.bias.requires_grad() &&
            parse_scores(x.input(side), inner, Stage::kSoftcap)) {
          s = inner;
          return true;
        }
      }
      return false;
    }
    if (stage <= Stage::kSoftcap) {
      if (const std::optional<std::pair<Walked, double>> capped = softcap_operand(x)) {
        s.modifiers.softcap = capped->second;
        x = capped->first;
        stage = Stage::kScale;
        continue;
      }
    }
    if (x.is(Op::Mul) || x.is(Op::Div)) {
      const bool divides = x.is(Op::Div);
      const int side = !divides && constant(x.input(0)) ? 0 : 1;
      const std::optional<double> factor = constant(x.input(side));
      if (!factor || *factor == 0 || !std::isfinite(*factor)) return false;
      s.modifiers.scale *= divides ? 1 / *factor : *factor;
      stage = Stage::kScale;
      x = x.input(1 - side);
      continue;
    }
    return false;
  }
}

}  // namespace

Tensor attention_from_pattern(const Tensor& weights, const Tensor& values, const Loc& where) {
  const LazyRef& value = weights.value();
  const Op op = value->node.op;
  if (is_computed(value) || !(op == Op::Mul || op == Op::Div || op == Op::Where) ||
      !nn::functional::fused_attention_enabled() || weights.dim() < 2 || values.dim() < 2)
    return Tensor();
  Scores s;
  const std::optional<Walked> top = undropped(Walked{value, weights.impl()->autograd}, s.modifiers);
  if (!top || top->broken) return Tensor();
  const std::optional<Walked> scores = softmax_operand(*top);
  if (!scores || !parse_scores(*scores, s, Stage::kMasks) || s.broken) return Tensor();
  // One floating dtype, as written: the product's operands and the values.
  const DType dtype = weights.dtype();
  if (!is_floating(dtype) || s.q.dtype() != dtype || s.key_transposed.dtype() != dtype ||
      values.dtype() != dtype)
    return Tensor();
  // Only where the node computes what the product would: the same shape (no broadcast the
  // node does not make) and dtype. Where not, the product is made as written, and any error is
  // its own, with its location.
  try {
    const Tensor key = s.key_transposed.transpose(-2, -1, where);
    const Tensor out = attention_node(s.q, key, values, s.mask, s.bias, s.modifiers,
                                      /*enable_gqa=*/false, where, /*drawn=*/true);
    const Shape& w = weights.sizes();
    const Shape& v = values.sizes();
    if (out.defined() && out.dtype() == weights.dtype() &&
        out.sizes() == infer_shape(Op::Matmul, std::vector<const Shape*>{&w, &v}, {}, {}))
      return out;
  } catch (const ShapeError&) {
  } catch (const DTypeError&) {
  }
  return Tensor();
}

}  // namespace lazyfuse::detail
