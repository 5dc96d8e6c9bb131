// Note [Attention]
// An attention node is softmax(scores) . v computed without the scores in memory. Its kernels
// (runtime/cpu/cpu_attention.cc, codegen/cuda/cuda_attention.cc) walk the keys in blocks for
// each block of queries, keeping per query
// the running maximum m of its scores, the running sum l of exp(s - m) and the running
// sum of exp(s - m) v, rescaled by exp(m_old - m_new) when the maximum grows (the online
// softmax of Milakov and Gimelshein, as FlashAttention). At the end the result is the sum over
// l, and logsumexp = m + log l is what the backward needs: with it, each probability is
// p_ij = exp(s_ij - lse_i), recomputed from q and k rather than stored.
//
// The backward (attention_grad_q/k/v), for result o and its gradient do:
//   D_i   = do_i . o_i                   (= sum_j p_ij dp_ij)
//   dp_ij = do_i . v_j
//   ds_ij = p_ij (dp_ij - D_i)           (the softmax's gradient)
//   ds_ij *= 1 - tanh^2                  (through a softcap: s = c tanh(x / c))
//   dq_i  = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i,  dv_j = sum_i p_ij do_i
// summed over a key head's group of query heads for dk and dv.
//
// With dropout, the forward sums m_ij p_ij v_j, where m_ij is 0 for a dropped probability and
// 1 / (1 - dropout) for a kept one (attention_keeps in codegen/philox.h: element
// (head * T + i) * S + j of a rand over the scores at the node's seed and offset, the draw the
// unfused graph's dropout makes, so one seed drops the same probabilities on every device and
// in both forms); the logsumexp is the undropped one. The backward then takes
// dp_ij = m_ij do_i . v_j and dv_j = sum_i m_ij p_ij do_i, and D_i = do_i . o_i still equals
// sum_j p_ij dp_ij. A query that sees no key has
// lse = -infinity, a zero result and zero gradients, as the composite graph's softmax that
// gives zeros for such a row (frontend/attention.cc).
#include "lazyfuse/ir/attention.h"

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

AttentionOperands attention_operands(Op op, const Attrs& attrs) {
  AttentionOperands at;
  int next = 3;
  if (is_attention_gradient(op)) {
    at.out = next++;
    at.grad = next++;
    at.lse = next++;
  }
  if (attrs.has("mask") && attrs.get_bool("mask")) at.mask = next++;
  if (attrs.has("bias") && attrs.get_bool("bias")) at.bias = next++;
  at.count = next;
  return at;
}

ScoreModifiers score_modifiers(const Attrs& attrs) {
  ScoreModifiers m;
  m.scale = attrs.get_float("scale");
  m.causal = attrs.has("causal") && attrs.get_bool("causal");
  m.softcap = attrs.has("softcap") ? attrs.get_float("softcap") : 0.0;
  if (attrs.has("dropout")) {
    m.dropout = attrs.get_float("dropout");
    m.seed = static_cast<uint64_t>(attrs.get_int("seed"));
    m.offset = static_cast<uint64_t>(attrs.get_int("offset"));
  }
  return m;
}

Attrs attention_attrs(const ScoreModifiers& modifiers, bool mask, bool bias) {
  Attrs attrs;
  attrs.set("scale", modifiers.scale);
  if (modifiers.causal) attrs.set("causal", true);
  if (modifiers.softcap > 0) attrs.set("softcap", modifiers.softcap);
  if (modifiers.dropout > 0) {
    attrs.set("dropout", modifiers.dropout);
    attrs.set("seed", static_cast<int64_t>(modifiers.seed));
    attrs.set("offset", static_cast<int64_t>(modifiers.offset));
  }
  if (mask) attrs.set("mask", true);
  if (bias) attrs.set("bias", true);
  return attrs;
}

AttentionSizes attention_sizes(const Shape& q, const Shape& k, const Shape& v) {
  auto fail = [&](const std::string& why) {
    return ShapeError(absl::StrCat("attention: ", why, " (q ", shape_str(q), ", k ", shape_str(k),
                                   ", v ", shape_str(v), ")"));
  };
  const size_t rank = q.size();
  if (rank < 2 || k.size() != rank || v.size() != rank)
    throw fail("q, k and v must have one rank of at least 2");
  AttentionSizes s;
  s.queries = q[rank - 2];
  s.keys = k[rank - 2];
  s.head_dim = q[rank - 1];
  s.value_dim = v[rank - 1];
  if (k[rank - 1] != s.head_dim) throw fail("q and k must have one head dim");
  if (v[rank - 2] != s.keys) throw fail("k and v must have one length");
  if (rank >= 3) {
    s.heads = q[rank - 3];
    s.key_heads = k[rank - 3];
    if (v[rank - 3] != s.key_heads || s.key_heads == 0 || s.heads % s.key_heads != 0)
      throw fail("k's and v's heads must be equal and divide q's");
    for (size_t d = 0; d + 3 < rank; ++d) {
      if (k[d] != q[d] || v[d] != q[d]) throw fail("q, k and v must have one batch shape");
      s.batch *= q[d];
    }
  }
  s.scores = q;
  s.scores[rank - 1] = s.keys;
  return s;
}

Shape attention_shape(Op op, std::span<const Shape* const> inputs, const Attrs& attrs) {
  const AttentionOperands at = attention_operands(op, attrs);
  if (static_cast<int>(inputs.size()) != at.count)
    throw ShapeError(absl::StrCat(op_name(op), ": takes ", at.count,
                                  " operands with its attributes, has ", inputs.size()));
  const Shape &q = *inputs[at.q], &k = *inputs[at.k], &v = *inputs[at.v];
  const AttentionSizes sizes = attention_sizes(q, k, v);
  Shape out = q;
  out.back() = sizes.value_dim;
  Shape lse(q.begin(), q.end() - 1);
  for (int slot : {at.mask, at.bias})
    if (slot >= 0 && *inputs[slot] != sizes.scores)
      throw ShapeError(absl::StrCat(op_name(op), ": a ", slot == at.mask ? "mask" : "bias",
                                    " must have the scores' shape ", shape_str(sizes.scores),
                                    ", has ", shape_str(*inputs[slot])));
  if (at.out >= 0 && (*inputs[at.out] != out || *inputs[at.grad] != out || *inputs[at.lse] != lse))
    throw ShapeError(absl::StrCat(op_name(op), ": the result ", shape_str(*inputs[at.out]),
                                  ", its gradient ", shape_str(*inputs[at.grad]), " and logsumexp ",
                                  shape_str(*inputs[at.lse]), " should be ", shape_str(out), ", ",
                                  shape_str(out), " and ", shape_str(lse)));
  switch (op) {
    case Op::AttentionLse:
      return lse;
    case Op::AttentionGradQ:
      return q;
    case Op::AttentionGradK:
      return k;
    case Op::AttentionGradV:
      return v;
    default:
      return out;
  }
}

void check_attention_operand_dtypes(Op op, const Attrs& attrs, std::span<const DType> dtypes) {
  const AttentionOperands at = attention_operands(op, attrs);
  if (static_cast<int>(dtypes.size()) != at.count) return;  // the shape rule says so
  const DType q = dtypes[at.q];
  auto expect = [&](int slot, DType want, const char* what) {
    if (slot >= 0 && dtypes[slot] != want)
      throw DTypeError(absl::StrCat(op_name(op), ": its ", what, " must be ", dtype_ir_name(want),
                                    ", is ", dtype_ir_name(dtypes[slot])));
  };
  expect(at.mask, DType::Bool, "mask");
  expect(at.bias, q, "bias");
  expect(at.out, q, "result operand");
  expect(at.grad, q, "gradient operand");
  expect(at.lse, compute_dtype(q), "logsumexp");
}

bool same_attention(const Graph& graph, ValueId a, ValueId b) {
  const Node &x = graph.nodes[a], &y = graph.nodes[b];
  if (!is_attention(x.op) || !is_attention(y.op) || !(x.attrs == y.attrs) || x.device != y.device)
    return false;
  const AttentionOperands ax = attention_operands(x.op, x.attrs),
                          ay = attention_operands(y.op, y.attrs);
  // The forward's operands; a gradient's result, gradient and logsumexp too.
  for (auto slot : {&AttentionOperands::q, &AttentionOperands::k, &AttentionOperands::v,
                    &AttentionOperands::out, &AttentionOperands::grad, &AttentionOperands::lse,
                    &AttentionOperands::mask, &AttentionOperands::bias}) {
    const int i = ax.*slot, j = ay.*slot;
    if ((i < 0) != (j < 0)) {
      // A forward and its logsumexp pair; a gradient pairs only with gradients.
      if (slot == &AttentionOperands::out || slot == &AttentionOperands::grad ||
          slot == &AttentionOperands::lse)
        return false;
      continue;
    }
    if (i >= 0 && x.inputs[i] != y.inputs[j]) return false;
  }
  return is_attention_gradient(x.op) == is_attention_gradient(y.op);
}

}  // namespace lazyfuse
