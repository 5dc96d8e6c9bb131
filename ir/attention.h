// What an attention node's operands and attributes mean (ops.def's attention rows), for every
// layer that reads one: shape inference, fusion, the kernels and the gradient rule.
#pragma once

#include <span>

#include "lazyfuse/ir/graph.h"

namespace lazyfuse {

// Where each operand of an attention node sits; -1 where the node has none. Every attention op
// starts with q, k, v; the gradients follow with the forward's result, its gradient and its
// logsumexp; a mask and then a bias come last when the attributes say the node has them.
struct AttentionOperands {
  int q = 0, k = 1, v = 2;
  int out = -1, grad = -1, lse = -1;
  int mask = -1, bias = -1;
  int count = 3;  // how many operands the node must have
};
AttentionOperands attention_operands(Op op, const Attrs& attrs);

// How a score is made from q.k (the attributes): see ops.def.
struct ScoreModifiers {
  double scale = 1;
  bool causal = false;  // query i sees keys 0..i (the top left corner, as PyTorch's is_causal)
  double softcap = 0;   // > 0: softcap * tanh(s / softcap)
  // > 0: each probability is dropped with this probability and the kept ones scaled by
  // 1 / (1 - dropout), by the mask of attention_keeps (codegen/philox.h) from the Philox
  // stream's `seed` at `offset`.
  double dropout = 0;
  uint64_t seed = 0, offset = 0;
};
ScoreModifiers score_modifiers(const Attrs& attrs);
Attrs attention_attrs(const ScoreModifiers& modifiers, bool mask, bool bias);

// The sizes an attention node works over, from q [..., Hq, T, E], k [..., Hk, S, E] and
// v [..., Hk, S, Ev] (a rank-2 operand is one head).
struct AttentionSizes {
  int64_t batch = 1;  // the product of the dims before the heads
  int64_t heads = 1, key_heads = 1;
  int64_t queries = 0, keys = 0;
  int64_t head_dim = 0, value_dim = 0;
  // The scores' shape [..., Hq, T, S] (a mask's or bias's).
  Shape scores;
};
// Throws ShapeError naming the operands when they do not line up.
AttentionSizes attention_sizes(const Shape& q, const Shape& k, const Shape& v);

// The result's shape (infer_shape's rule for the attention kind).
Shape attention_shape(Op op, std::span<const Shape* const> inputs, const Attrs& attrs);

// Throws DTypeError where an operand's dtype is not its slot's: a mask bool; a bias, result and
// gradient q's dtype; a logsumexp q's compute dtype (the op's dtype rule sees dtypes alone).
void check_attention_operand_dtypes(Op op, const Attrs& attrs, std::span<const DType> dtypes);

// Whether attention nodes a and b compute over the same operands and attributes, so that one
// kernel computes both (a forward and its logsumexp; the three gradients).
bool same_attention(const Graph& graph, ValueId a, ValueId b);

}  // namespace lazyfuse
