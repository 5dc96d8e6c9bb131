// nn::functional::scaled_dot_product_attention and nn::MultiheadAttention, as PyTorch's. Where
// the device's backend runs attention steps, the attention is one attention node (detail::
// attention_node; Note [Attention] in ir/attention.cc) with its gradient rule in ir/ops.def;
// elsewhere, and for a mask that needs its own gradient, it is written in the ops of
// tensor.h, in the form a model author writes by hand (scores, a mask through where or an added
// bias, a softmax over the keys, a product with the values), lazy and differentiated by the
// ops' rules.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/attention.h"
#include "lazyfuse/frontend/autocast.h"
#include "lazyfuse/frontend/functional.h"
#include "lazyfuse/frontend/nn.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse::nn::functional {
namespace {

[[noreturn]] void shape_error(const std::string& message, const Loc& where) {
  throw ShapeError(absl::StrCat("scaled_dot_product_attention: ", message, " (at ",
                                SourceLoc::from(where).str(), ")"));
}

// Checks what PyTorch checks, naming the argument and the shapes.
void check_operands(const Tensor& query, const Tensor& key, const Tensor& value,
                    const Tensor& attn_mask, double dropout_p, bool is_causal, bool enable_gqa,
                    const Loc& where) {
  for (const auto& [name, t] : {std::pair{"query", &query}, {"key", &key}, {"value", &value}}) {
    if (!t->defined()) shape_error(absl::StrCat(name, " is undefined"), where);
    if (t->dim() < 2)
      shape_error(absl::StrCat(name, " must have at least 2 dims ([..., length, head dim]), got ",
                               shape_str(t->sizes())),
                  where);
  }
  if (key.dtype() != query.dtype() || value.dtype() != query.dtype() || !is_floating(query.dtype()))
    throw DTypeError(absl::StrCat(
        "scaled_dot_product_attention: query, key and value must have one floating dtype, got ",
        dtype_torch_name(query.dtype()), ", ", dtype_torch_name(key.dtype()), " and ",
        dtype_torch_name(value.dtype()), " (at ", SourceLoc::from(where).str(), ")"));
  if (query.size(-1) != key.size(-1))
    shape_error(absl::StrCat("query's head dim (its last) must equal key's: query ",
                             shape_str(query.sizes()), ", key ", shape_str(key.sizes())),
                where);
  if (key.size(-2) != value.size(-2))
    shape_error(absl::StrCat("key and value must have one length (dim -2): key ",
                             shape_str(key.sizes()), ", value ", shape_str(value.sizes())),
                where);
  if (enable_gqa && query.dim() >= 3) {
    const int64_t heads = query.size(-3), key_heads = key.size(-3);
    if (key.dim() < 3 || value.dim() < 3 || value.size(-3) != key_heads || key_heads == 0 ||
        heads % key_heads != 0)
      shape_error(absl::StrCat("with enable_gqa, key's and value's heads (dim -3) must be equal "
                               "and divide query's: query ",
                               shape_str(query.sizes()), ", key ", shape_str(key.sizes()),
                               ", value ", shape_str(value.sizes())),
                  where);
  }
  if (attn_mask.defined()) {
    if (is_causal)
      throw ValueError(absl::StrCat(
          "scaled_dot_product_attention: attn_mask must not be given with is_causal=true (at ",
          SourceLoc::from(where).str(), ")"));
    if (attn_mask.dtype() != DType::Bool && attn_mask.dtype() != query.dtype())
      throw DTypeError(absl::StrCat(
          "scaled_dot_product_attention: attn_mask must be bool or query's dtype (",
          dtype_torch_name(query.dtype()), "), got ", dtype_torch_name(attn_mask.dtype()), " (at ",
          SourceLoc::from(where).str(), ")"));
  }
  if (!(dropout_p >= 0 && dropout_p < 1))
    throw ValueError(absl::StrCat("scaled_dot_product_attention: dropout_p must be in [0, 1), got ",
                                  dropout_p, " (at ", SourceLoc::from(where).str(), ")"));
}

// Key or value heads [..., H_kv, S, E] each repeated `groups` times in a row ([..., H_kv *
// groups, S, E]), as repeat_interleave along dim -3 gives them.
Tensor repeat_heads(const Tensor& t, int64_t groups, const Loc& where) {
  if (groups == 1) return t;
  Shape expanded = t.sizes();
  expanded.insert(expanded.end() - 2, groups);
  Shape merged = t.sizes();
  merged[merged.size() - 3] *= groups;
  return t.unsqueeze(-3, where).expand(expanded, where).reshape(merged, where);
}

// A softmax over the keys (the last dim) in which a row that sees no key gives zeros, as
// PyTorch's math backend (its _safe_softmax) does, rather than NaN: such a row's max is taken
// as 0 and its sum of exponentials (0) as 1.
Tensor softmax_over_keys(const Tensor& scores, const Loc& where) {
  const double minus_infinity = -std::numeric_limits<double>::infinity();
  const Tensor top = scores.amax({-1}, true, where);
  const Tensor shifted = scores - lazyfuse::where(top == minus_infinity, 0.0, top, where);
  const Tensor e = shifted.exp(where);
  const Tensor total = e.sum({-1}, true, where);
  return e / lazyfuse::where(total == 0.0, 1.0, total, where);
}

std::atomic<bool>& fused_attention_setting() {
  static std::atomic<bool> enabled{env_config().fused_attention};
  return enabled;
}

// `t` with `rank` dims, size-1 dims put in front.
Tensor with_rank(const Tensor& t, int64_t rank, const Loc& where) {
  Tensor r = t;
  while (r.dim() < rank) r = r.unsqueeze(0, where);
  return r;
}

// q, k and v as one attention node takes them (one rank; the dims before the heads broadcast
// to one batch shape, as views), or nullopt where the fused form does not apply: heads that
// neither match, broadcast from 1, nor (with enable_gqa) group; the composite graph then says
// what is wrong.
std::optional<std::array<Tensor, 3>> attention_operands(const Tensor& query, const Tensor& key,
                                                        const Tensor& value, bool enable_gqa,
                                                        const Loc& where) {
  const int64_t rank = std::max({query.dim(), key.dim(), value.dim()});
  std::array<Tensor, 3> t = {with_rank(query, rank, where), with_rank(key, rank, where),
                             with_rank(value, rank, where)};
  if (rank < 3) return t;
  Shape batch;
  for (int64_t d = 0; d < rank - 3; ++d) {
    int64_t size = 1;
    for (const Tensor& x : t) {
      if (x.size(d) != 1 && size != 1 && x.size(d) != size) return std::nullopt;
      if (x.size(d) != 1) size = x.size(d);
    }
    batch.push_back(size);
  }
  int64_t heads = t[0].size(-3);
  const int64_t key_heads = t[1].size(-3);
  if (t[2].size(-3) != key_heads) return std::nullopt;
  if (heads == 1 && key_heads > 1) heads = key_heads;  // q broadcast over the heads
  if (heads != key_heads && !(enable_gqa || key_heads == 1)) return std::nullopt;
  if (key_heads == 0 || heads % key_heads != 0) return std::nullopt;
  for (size_t i = 0; i < t.size(); ++i) {
    Shape shape = batch;
    shape.push_back(i == 0 ? heads : key_heads);
    shape.push_back(t[i].size(-2));
    shape.push_back(t[i].size(-1));
    if (t[i].sizes() != shape) t[i] = t[i].expand(shape, where);
  }
  return t;
}

}  // namespace

void set_fused_attention_enabled(bool enabled) { fused_attention_setting().store(enabled); }
bool fused_attention_enabled() { return fused_attention_setting().load(); }

Tensor scaled_dot_product_attention(const Tensor& query_in, const Tensor& key_in,
                                    const Tensor& value_in, const Tensor& mask_in, double dropout_p,
                                    bool is_causal, std::optional<double> scale, bool enable_gqa,
                                    Loc where) {
  // Under autocast, every floating operand in its lower dtype before the checks, as PyTorch's
  // autocast casts before the op sees them.
  using lazyfuse::detail::autocast_lower;
  const Tensor query = autocast_lower(query_in), key = autocast_lower(key_in),
               value = autocast_lower(value_in);
  const Tensor attn_mask = autocast_lower(mask_in);
  check_operands(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, where);
  const double factor = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  {
    const bool bias = attn_mask.defined() && attn_mask.dtype() != DType::Bool;
    const Tensor fused = lazyfuse::detail::attention_node(
        query, key, value, bias ? Tensor() : attn_mask, bias ? attn_mask : Tensor(),
        {.scale = factor, .causal = is_causal, .dropout = dropout_p}, enable_gqa, where);
    if (fused.defined()) return fused;
  }
  Tensor k = key, v = value;
  if (enable_gqa && query.dim() >= 3) {
    const int64_t groups = query.size(-3) / key.size(-3);
    k = repeat_heads(key, groups, where);
    v = repeat_heads(value, groups, where);
  }
  Tensor scores = query.matmul(k.transpose(-2, -1, where), where) * factor;
  const double minus_infinity = -std::numeric_limits<double>::infinity();
  if (is_causal) {
    // Query i sees keys 0..i (the mask's top left corner, as PyTorch's is_causal).
    const int64_t queries = query.size(-2), keys = k.size(-2);
    const TensorOptions positions = TensorOptions(DType::Int64).device(query.device());
    const Tensor seen = arange(queries, positions, where).unsqueeze(1, where) >=
                        arange(keys, positions, where).unsqueeze(0, where);
    scores = lazyfuse::where(seen, scores, minus_infinity, where);
  } else if (attn_mask.defined()) {
    Shape broadcast;
    if (!broadcast_shapes(attn_mask.sizes(), scores.sizes(), &broadcast) ||
        broadcast != scores.sizes())
      shape_error(absl::StrCat("attn_mask ", shape_str(attn_mask.sizes()),
                               " does not broadcast to the scores ", shape_str(scores.sizes())),
                  where);
    scores = attn_mask.dtype() == DType::Bool
                 ? lazyfuse::where(attn_mask, scores, minus_infinity, where)
                 :
                 operator+({scores, where}, attn_mask);
  }
  Tensor weights = softmax_over_keys(scores, where);
  if (dropout_p > 0) weights = dropout(weights, dropout_p, /*training=*/true, where);
  return weights.matmul(v, where);
}

}  // namespace lazyfuse::nn::functional

namespace lazyfuse::nn {

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout,
                                       bool bias)
    : embed_dim_(embed_dim), num_heads_(num_heads), dropout_(dropout) {
  if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads != 0)
    throw ShapeError(absl::StrCat("MultiheadAttention: embed_dim (", embed_dim,
                                  ") must be a positive multiple of num_heads (", num_heads, ")"));
  // Xavier-uniform over [3E, E], as PyTorch's _reset_parameters; zero biases.
  const double bound = std::sqrt(6.0 / static_cast<double>(embed_dim + 3 * embed_dim));
  in_proj_weight_ = detail::initial({3 * embed_dim, embed_dim}, [&] {
    return rand({3 * embed_dim, embed_dim}) * (2 * bound) - bound;
  });
  if (bias) in_proj_bias_ = zeros({3 * embed_dim});
  out_proj_ = register_module("out_proj", Linear(embed_dim, embed_dim, bias));
  if (bias) out_proj_->bias() = zeros({embed_dim});
  std::vector<Tensor> made = {in_proj_weight_};
  if (bias) made.insert(made.end(), {in_proj_bias_, out_proj_->bias()});
  detail::compute_initial(made);
  in_proj_weight_.requires_grad_();
  if (bias) {
    in_proj_bias_.requires_grad_();
    out_proj_->bias().requires_grad_();
  }
}

std::vector<std::pair<std::string, Tensor*>> MultiheadAttention::own_parameters() {
  return {{"in_proj_weight", &in_proj_weight_}, {"in_proj_bias", &in_proj_bias_}};
}

std::string MultiheadAttention::repr() const {
  return absl::StrCat("MultiheadAttention(embed_dim=", embed_dim_, ", num_heads=", num_heads_,
                      ", dropout=", dropout_, ")");
}

std::tuple<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                       const Tensor& value,
                                                       const Tensor& key_padding_mask,
                                                       bool need_weights, const Tensor& attn_mask,
                                                       bool average_attn_weights) {
  const Loc where = Loc::current();
  for (const Tensor* t : {&query, &key, &value})
    if (t->dim() != 3 || t->size(2) != embed_dim_)
      throw ShapeError(absl::StrCat("MultiheadAttention(embed_dim=", embed_dim_,
                                    "): query, key and value must be [length, batch, ", embed_dim_,
                                    "], got ", shape_str(query.sizes()), ", ",
                                    shape_str(key.sizes()), ", ", shape_str(value.sizes())));
  const int64_t length = query.size(0), batch = query.size(1), keys = key.size(0);
  const int64_t head_dim = embed_dim_ / num_heads_;
  // Projected and split into heads: [N, H, length, head_dim].
  auto project = [&](const Tensor& x, int64_t part) {
    const Tensor w = in_proj_weight_.narrow(0, part * embed_dim_, embed_dim_);
    const Tensor b =
        in_proj_bias_.defined() ? in_proj_bias_.narrow(0, part * embed_dim_, embed_dim_) : Tensor();
    const int64_t n = x.size(0);
    return functional::linear(x, w, b)
        .reshape({n, batch, num_heads_, head_dim})
        .permute({1, 2, 0, 3});
  };
  const Tensor q = project(query, 0), k = project(key, 1), v = project(value, 2);
  // One additive mask [N or 1, H or 1, L, S] from both masks, true marking what is not seen.
  const double minus_infinity = -std::numeric_limits<double>::infinity();
  Tensor mask;
  auto add = [&](Tensor m) { mask = mask.defined() ? mask + m : m; };
  if (attn_mask.defined()) {
    if (attn_mask.sizes() != Shape{length, keys} &&
        attn_mask.sizes() != Shape{batch * num_heads_, length, keys})
      throw ShapeError(absl::StrCat("MultiheadAttention: attn_mask must be [", length, ", ", keys,
                                    "] or [", batch * num_heads_, ", ", length, ", ", keys,
                                    "], got ", shape_str(attn_mask.sizes())));
    Tensor m =
        attn_mask.dim() == 3 ? attn_mask.reshape({batch, num_heads_, length, keys}) : attn_mask;
    add(m.dtype() == DType::Bool ? lazyfuse::where(m, minus_infinity, 0.0).to(q.dtype())
                                 : m.to(q.dtype()));
  }
  if (key_padding_mask.defined()) {
    if (key_padding_mask.sizes() != Shape{batch, keys})
      throw ShapeError(absl::StrCat("MultiheadAttention: key_padding_mask must be [", batch, ", ",
                                    keys, "], got ", shape_str(key_padding_mask.sizes())));
    const Tensor padded = key_padding_mask.reshape({batch, 1, 1, keys});
    add(padded.dtype() == DType::Bool ? lazyfuse::where(padded, minus_infinity, 0.0).to(q.dtype())
                                      : padded.to(q.dtype()));
  }
  const double p = is_training() ? dropout_ : 0.0;
  Tensor heads, weights;
  if (need_weights) {
    Tensor scores = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(double(head_dim)));
    if (mask.defined()) scores = scores + mask;
    weights = functional::softmax_over_keys(scores, where);
    const Tensor dropped = p > 0 ? functional::dropout(weights, p, true) : weights;
    heads = dropped.matmul(v);
    if (average_attn_weights) weights = weights.mean({1});
  } else {
    heads = functional::scaled_dot_product_attention(q, k, v, mask, p);
  }
  const Tensor merged = heads.permute({2, 0, 1, 3}).reshape({length, batch, embed_dim_});
  return {(*out_proj_)(merged), weights};
}

}  // namespace lazyfuse::nn

namespace lazyfuse::detail {

Tensor attention_node(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      const Tensor& bias, const ScoreModifiers& modifiers, bool enable_gqa,
                      const Loc& where, bool drawn) {
  if (!nn::functional::fused_attention_enabled() || (bias.defined() && bias.requires_grad()) ||
      q.dim() < 2 || v.dim() < 2)
    return Tensor();
  if (!backend_for(q.device()).runs_attention(q.dtype(), q.size(-1), v.size(-1))) {
    if (env_config().debug > 0)
      std::fprintf(stderr,
                   "[lazyfuse] attention at %s: %s has no attention kernel for %s with head dims "
                   "%lld and %lld; it runs as matmuls and a softmax\n",
                   SourceLoc::from(where).str().c_str(), q.device().str().c_str(),
                   std::string(dtype_torch_name(q.dtype())).c_str(),
                   static_cast<long long>(q.size(-1)), static_cast<long long>(v.size(-1)));
    return Tensor();
  }
  const std::optional<std::array<Tensor, 3>> qkv =
      nn::functional::attention_operands(q, k, v, enable_gqa, where);
  if (!qkv) return Tensor();
  std::vector<Tensor> operands(qkv->begin(), qkv->end());
  Shape scores = (*qkv)[0].sizes();
  scores.back() = (*qkv)[1].size(-2);
  for (const Tensor* t : {&mask, &bias}) {
    if (!t->defined()) continue;
    Shape broadcast;
    if (!broadcast_shapes(t->sizes(), scores, &broadcast) || broadcast != scores)
      throw ShapeError(absl::StrCat("attention: the ", t == &mask ? "mask " : "bias ",
                                    shape_str(t->sizes()), " does not broadcast to the scores ",
                                    shape_str(scores), " (at ", SourceLoc::from(where).str(), ")"));
    operands.push_back(t->sizes() == scores ? *t : t->expand(scores, where));
  }
  ScoreModifiers with_draws = modifiers;
  if (with_draws.dropout > 0 && !drawn) {
    // The draws the unfused graph's dropout over the scores would take (Note [Attention]).
    const RandomDraws draws = take_random_draws(numel(scores));
    with_draws.seed = draws.seed;
    with_draws.offset = draws.offset;
  }
  return make_op(Op::Attention, operands,
                 attention_attrs(with_draws, mask.defined(), bias.defined()), where);
}

}  // namespace lazyfuse::detail
