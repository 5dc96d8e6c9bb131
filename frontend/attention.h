// What scaled_dot_product_attention (attention.cc) and Tensor::matmul's recognition of attention
// written by hand (attention_pattern.cc) share: making one attention node.
#pragma once

#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/attention.h"

namespace lazyfuse::detail {

// softmax(modified q k^T) v as one attention node (Note [Attention] in ir/attention.cc): `mask`
// (bool, true where a key is seen) and `bias` (added to the scores) broadcast to the scores.
// Undefined where the node does not apply: fused attention off, no attention step in the
// device's backend, a bias that needs a gradient, or heads that neither match, broadcast from
// 1 nor (with enable_gqa) group. Throws ShapeError when a mask does not broadcast. With dropout,
// the node takes the draws of a rand over the scores from the global generator, unless `drawn`:
// then `modifiers` holds the seed and offset of draws already taken (a dropout written out).
Tensor attention_node(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      const Tensor& bias, const ScoreModifiers& modifiers, bool enable_gqa,
                      const Loc& where, bool drawn = false);

// weights.matmul(values) as one attention node when `weights` is a softmax of scores written by
// hand (Note [Attention written by hand] in attention_pattern.cc); undefined otherwise.
Tensor attention_from_pattern(const Tensor& weights, const Tensor& values, const Loc& where);

}  // namespace lazyfuse::detail
