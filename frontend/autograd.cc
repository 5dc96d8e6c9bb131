// The autograd engine: recording GradNodes as ops are made, and backward()/grad() as a reverse
// topological walk that applies each op's gradient rule from ir/ops.def.
#include "lazyfuse/frontend/autograd.h"

#include <algorithm>
#include <array>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/checkpoint.h"
#include "lazyfuse/frontend/distributed.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {

namespace {

thread_local bool grad_mode_enabled = true;

// Which ops have a gradient rule in ops.def.
constexpr std::array<bool, kNumOps> ops_with_gradients() {
  std::array<bool, kNumOps> has{};
#define LF_GRADIENT1(Name, da) has[static_cast<int>(Op::Name)] = true;
#define LF_GRADIENT2(Name, da, db) has[static_cast<int>(Op::Name)] = true;
#define LF_GRADIENT3(Name, da, db, dc) has[static_cast<int>(Op::Name)] = true;
#define LF_GRADIENTN(Name, di) has[static_cast<int>(Op::Name)] = true;
#include "lazyfuse/ir/ops.def"
  return has;
}
constexpr std::array<bool, kNumOps> kHasGradient = ops_with_gradients();

// PyTorch's names for its backward nodes are the op's name and a variant number.
const char* grad_fn_name_of(Op op) {
  switch (op) {
#define LF_GRADIENT1(Name, da) \
  case Op::Name:               \
    return #Name "Backward0";
#define LF_GRADIENT2(Name, da, db) LF_GRADIENT1(Name, da)
#define LF_GRADIENT3(Name, da, db, dc) LF_GRADIENT1(Name, da)
#define LF_GRADIENTN(Name, di) LF_GRADIENT1(Name, di)
#include "lazyfuse/ir/ops.def"
    default:
      return "";
  }
}

// Sums `x` over the dims along which a tensor of `shape` was broadcast to x's shape.
Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && x.size(d) != 1)) dims.push_back(d);
  Tensor summed = dims.empty() ? x : x.sum(dims, /*keepdim=*/true);
  return summed.sizes() == shape ? summed : summed.reshape(shape);
}

// Operands and flags per operand of a recorded op, inline for all but a long cat.
using OperandTensors = absl::InlinedVector<Tensor, 3>;
using OperandFlags = absl::InlinedVector<bool, 3>;

// One application of an op's gradient rule. The members a, b, c, out, g and the helpers are the
// vocabulary the rules in ops.def are written in, hence their short names.
class GradientRule {
 public:
  GradientRule(const GradNode& node, Tensor gradient, OperandTensors operands, Tensor result,
               OperandFlags needed)
      : a(operand(operands, 0)),
        b(operand(operands, 1)),
        c(operand(operands, 2)),
        out(std::move(result)),
        g(std::move(gradient)),
        a_shape(node.operands[0].shape),
        a_device(node.operands[0].device),
        c_shape(node.operands.size() > 2 ? node.operands[2].shape : Shape()),
        dim(node.attrs.has("dim")
                ? normalize_dim(node.attrs.get_int("dim"),
                                static_cast<int64_t>(node.operands[0].shape.size()), "dim")
                : 0),
        node_(node),
        operands_(std::move(operands)),
        needed_(std::move(needed)) {}

  absl::InlinedVector<Tensor, 3> apply() const {
    switch (node_.op) {
#define LF_GRADIENT1(Name, da) \
  case Op::Name:               \
    return {needed_[0] ? Tensor(da) : Tensor()};
#define LF_GRADIENT2(Name, da, db) \
  case Op::Name:                   \
    return {needed_[0] ? Tensor(da) : Tensor(), needed_[1] ? Tensor(db) : Tensor()};
#define LF_GRADIENT3(Name, da, db, dc)                                              \
  case Op::Name:                                                                    \
    return {needed_[0] ? Tensor(da) : Tensor(), needed_[1] ? Tensor(db) : Tensor(), \
            needed_[2] ? Tensor(dc) : Tensor()};
#define LF_GRADIENTN(Name, di)                             \
  case Op::Name: {                                         \
    absl::InlinedVector<Tensor, 3> grads;                  \
    for (size_t i = 0; i < needed_.size(); ++i)            \
      grads.push_back(needed_[i] ? Tensor(di) : Tensor()); \
    return grads;                                          \
  }
#include "lazyfuse/ir/ops.def"
      default:
        throw VerifierError(absl::StrCat(op_name(node_.op), " has no gradient rule"));
    }
  }

 private:
  const Tensor a, b, c, out, g;
  const Tensor none;
  const Shape a_shape;
  const Device a_device;
  const Shape c_shape;
  // The node's dim attribute (narrow, gather, scatter_add, cat), normalized; 0 without one.
  const int64_t dim;
  const GradNode& node_;
  const OperandTensors operands_;
  const OperandFlags needed_;
  // The forward's logsumexp, made once for the gradients of q, k and v.
  mutable Tensor attention_lse_;

  static Tensor operand(const OperandTensors& operands, size_t i) {
    return i < operands.size() ? operands[i] : Tensor();
  }

  // sign(x), and NaN where x is NaN.
  static Tensor sgn(const Tensor& x) { return where(x > 0, 1, where(x < 0, -1, x * 0)); }

  std::vector<int64_t> reduced_dims() const {
    return reduction_dims(node_.attrs, static_cast<int64_t>(a_shape.size()));
  }
  // A reduction's result (or its gradient) spread back over the operand's shape.
  Tensor unreduce(const Tensor& x) const {
    const bool keepdim = node_.attrs.has("keepdim") && node_.attrs.get_bool("keepdim");
    Tensor kept = x;
    if (!keepdim) {
      Shape shape = a_shape;
      for (int64_t d : reduced_dims()) shape[d] = 1;
      kept = x.reshape(shape);
    }
    return kept.expand(a_shape);
  }
  Scalar reduced_count() const {
    int64_t count = 1;
    for (int64_t d : reduced_dims()) count *= a_shape[d];
    return count;
  }
  // max and min: every element equal to the result (NaN where the result is NaN) gets an
  // equal share of the gradient.
  Tensor share_among_ties(const Tensor& x) const {
    const Tensor result = unreduce(out);
    const Tensor tie =
        (a == result).to(a.dtype()) + (a != a).to(a.dtype()) * (result != result).to(a.dtype());
    return tie * unreduce(x) / tie.sum(reduced_dims(), /*keepdim=*/true);
  }

  // matmul as PyTorch defines it for 1-d operands: a 1-d `a` is a row [1, k] whose row dim is
  // dropped from the result, a 1-d `b` a column [k, 1] whose column dim is dropped.
  Tensor as_matrix_a(const Tensor& x) const { return x.dim() == 1 ? x.unsqueeze(0) : x; }
  Tensor as_matrix_b(const Tensor& x) const { return x.dim() == 1 ? x.unsqueeze(-1) : x; }
  Tensor as_matrix_result(const Tensor& x) const {
    Tensor r = b.dim() == 1 ? x.unsqueeze(-1) : x;
    return a.dim() == 1 ? r.unsqueeze(-2) : r;
  }
  Tensor matmul_grad_a(const Tensor& x) const {
    const Tensor a2 = as_matrix_a(a);
    Tensor grad = matmul(as_matrix_result(x), as_matrix_b(b).transpose(-1, -2));
    return sum_to(grad, a2.sizes()).reshape(a.sizes());
  }
  Tensor matmul_grad_b(const Tensor& x) const {
    const Tensor a2 = as_matrix_a(a), b2 = as_matrix_b(b);
    if (b2.dim() == 2 && a2.dim() > 2) {
      // A batch of matrices times one (a Linear layer over [B, T, C]): the batch folds into the
      // rows, so the gradient is one product over B * T rows, not B products summed after (a
      // reduction over leading dims, and B times the memory).
      const Tensor r = as_matrix_result(x);
      return matmul(a2.reshape({-1, a2.size(-1)}).transpose(0, 1), r.reshape({-1, r.size(-1)}))
          .reshape(b.sizes());
    }
    Tensor grad = matmul(a2.transpose(-1, -2), as_matrix_result(x));
    return sum_to(grad, b2.sizes()).reshape(b.sizes());
  }

  std::vector<int64_t> inverse_permutation() const {
    const std::vector<int64_t>& dims = node_.attrs.get_ints("dims");
    const int64_t rank = static_cast<int64_t>(dims.size());
    std::vector<int64_t> inverse(dims.size());
    for (int64_t i = 0; i < rank; ++i) inverse[normalize_dim(dims[i], rank, "permute")] = i;
    return inverse;
  }

  // narrow's gradient: x where the narrowed part was, zeros before and after it along dim.
  Tensor unnarrow(const Tensor& x) const {
    const int64_t start = node_.attrs.get_int("start");
    const int64_t after = a_shape[dim] - start - x.size(dim);
    std::vector<Tensor> parts;
    for (int64_t length : {start, int64_t{-1}, after}) {
      if (length == 0) continue;
      if (length < 0) {
        parts.push_back(x);
        continue;
      }
      Shape shape = x.sizes();
      shape[dim] = length;
      parts.push_back(zeros(shape, TensorOptions(x.dtype()).device(x.device())));
    }
    return parts.size() == 1 ? x : cat(parts, dim);
  }

  // Zeros of a's shape (the result's dtype, a's device).
  Tensor zeros_like_a() const { return zeros(a_shape, TensorOptions(g.dtype()).device(a_device)); }

  // x grown with zeros at the end of each dim to `shape` (at least x's sizes).
  static Tensor zero_extend(Tensor x, const Shape& shape) {
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (x.size(d) == shape[d]) continue;
      Shape pad = x.sizes();
      pad[d] = shape[d] - x.size(d);
      x = cat({x, zeros(pad, TensorOptions(x.dtype()).device(x.device()))}, d);
    }
    return x;
  }

  // Collectives (frontend/distributed.h): what the processes' gradients make of each other.
  ReduceOp reduce_op() const { return static_cast<ReduceOp>(node_.attrs.get_int("reduce_op")); }
  // all_reduce: every process's result reads every x, so x's gradient is the processes'
  // gradients summed (averaged for AVG); a max or min reaches only where x holds the result,
  // shared among the ties of every process.
  Tensor all_reduce_grad(const Tensor& x) const {
    const ReduceOp op = reduce_op();
    if (op == ReduceOp::SUM || op == ReduceOp::AVG) return distributed::all_reduce(x, op);
    const Tensor tie = (a == out).to(x.dtype());
    return tie * distributed::all_reduce(x) / distributed::all_reduce(tie);
  }
  // all_gather: part r of every process's gradient belongs to process r's x.
  Tensor reduce_scatter_sum(const Tensor& x) const {
    return distributed::reduce_scatter(x, ReduceOp::SUM, dim);
  }
  // reduce_scatter: process r's result reads part r of every x.
  Tensor reduce_scatter_grad(const Tensor& x) const {
    const ReduceOp op = reduce_op();
    const Tensor gathered = distributed::all_gather(x, dim);
    if (op == ReduceOp::SUM) return gathered;
    if (op == ReduceOp::AVG) return gathered / distributed::world_size();
    const Tensor tie = (a == distributed::all_gather(out, dim)).to(x.dtype());
    return tie * gathered /
           distributed::all_gather(distributed::reduce_scatter(tie, ReduceOp::SUM, dim), dim);
  }
  // broadcast: only the root's x reaches the results, each process's.
  Tensor broadcast_grad(const Tensor& x) const {
    const Tensor summed = distributed::all_reduce(x);
    return distributed::rank() == node_.attrs.get_int("root") ? summed : summed * 0;
  }

  // Attention (Note [Attention] in ir/attention.cc): the gradient of operand i (q, k or v) as an
  // attention_grad node, which reads the forward's logsumexp (recomputed by an attention_lse
  // node, which fusion gives the forward's kernel when both are pending). A mask has none; a
  // bias is a constant of the fused form.
  Tensor attention_grad(size_t i) const {
    const AttentionOperands at = attention_operands(node_.op, node_.attrs);
    const Loc where = Loc::current();
    if (static_cast<int>(i) == at.mask) return Tensor();
    if (static_cast<int>(i) == at.bias)
      throw GradError(
          "attention: its bias has no gradient in the fused form (scaled_dot_product_attention "
          "writes an attention whose mask needs a gradient as its composite graph)");
    std::vector<Tensor> forward(operands_.begin(), operands_.end());
    if (!attention_lse_.defined()) {
      NoGradGuard no_grad;
      attention_lse_ = detail::make_op(Op::AttentionLse, forward, node_.attrs, where);
    }
    std::vector<Tensor> inputs = {forward[at.q], forward[at.k], forward[at.v], out, g,
                                  attention_lse_};
    for (int slot : {at.mask, at.bias})
      if (slot >= 0) inputs.push_back(forward[slot]);
    const Op op = i == 0 ? Op::AttentionGradQ : i == 1 ? Op::AttentionGradK : Op::AttentionGradV;
    return detail::make_op(op, inputs, node_.attrs, where);
  }

  // The fused attention's gradients have no gradient of their own yet.
  [[noreturn]] Tensor no_second_derivative() const {
    throw GradError(absl::StrCat(
        op_name(node_.op),
        ": fused attention has no second derivative; differentiate the composite graph instead "
        "(nn::functional::FusedAttentionGuard(false) or LAZYFUSE_ATTENTION=composite)"));
  }

  // cat: operand i's shape, and where its part of the result starts along dim.
  const Shape& operand_shape(size_t i) const { return node_.operands[i].shape; }
  int64_t cat_offset(size_t i) const {
    int64_t offset = 0;
    for (size_t k = 0; k < i; ++k) offset += node_.operands[k].shape[dim];
    return offset;
  }
};

std::string describe(const SavedOperand& operand) {
  return absl::StrCat("[", dtype_torch_name(operand.dtype), " ", shape_str(operand.shape), "]");
}

// A tensor for a rule to read: the saved value, carrying its autograd edge so that the rule's
// own ops record gradients when create_graph asks for them.
Tensor saved_tensor(const LazyRef& value, const std::shared_ptr<AutogradMeta>& edge) {
  if (value == nullptr) return Tensor();
  auto impl = make_pooled<TensorImpl>(value);
  impl->autograd = edge;
  return Tensor(std::move(impl));
}

struct BackwardRoots {
  std::mutex mutex;
  std::vector<std::weak_ptr<TensorImpl>> roots;
};
BackwardRoots& backward_roots() {
  static BackwardRoots r;
  return r;
}

// The walk itself. `targets` are the metas whose gradients grad() returns; backward() passes
// none and accumulates into leaves instead.
class Engine {
 public:
  Engine(bool retain_graph, bool create_graph)
      : retain_graph_(retain_graph), create_graph_(create_graph) {}

  void seed(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
    if (!grad_outputs.empty() && grad_outputs.size() != outputs.size())
      throw GradError(absl::StrCat("grad can be implicitly created only for scalar outputs; got ",
                                   grad_outputs.size(), " gradients for ", outputs.size(),
                                   " outputs"));
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& output = outputs[i];
      if (!output.requires_grad())
        throw GradError(absl::StrCat("element ", i,
                                     " of tensors does not require grad and does not have a "
                                     "grad_fn"));
      Tensor gradient = grad_outputs.empty() ? Tensor() : grad_outputs[i];
      if (!gradient.defined()) {
        if (output.numel() != 1)
          throw GradError(
              absl::StrCat("grad can be implicitly created only for scalar outputs (output ", i,
                           " has shape ", shape_str(output.sizes()), ")"));
        gradient = ones(output.sizes(), TensorOptions(output.dtype()).device(output.device()));
      } else if (gradient.sizes() != output.sizes()) {
        throw GradError(absl::StrCat("Mismatch in shape: grad_output[", i, "] has a shape of ",
                                     shape_str(gradient.sizes()), " and output[", i,
                                     "] has a shape of ", shape_str(output.sizes()), "."));
      } else if (gradient.device() != output.device()) {
        throw GradError(absl::StrCat("grad_output[", i, "] is on ", gradient.device().str(),
                                     " but output[", i, "] is on ", output.device().str()));
      }
      AutogradMeta* meta = output.impl()->autograd.get();
      roots_.push_back(meta);
      accumulate(meta, gradient.to(output.dtype()));
    }
  }

  void add_target(AutogradMeta* meta) { targets_.insert(meta); }

  // Runs the walk: accumulates into leaves in backward() mode; in grad() mode the targets'
  // gradients are then read with gradient_of().
  void run() {
    const std::vector<AutogradMeta*> order = topological_order();
    AutoGradMode mode(create_graph_);
    // The leaves' new gradients, given to them once the walk is done: a rule that fails part way
    // (a graph already freed, a value changed in place) leaves every gradient as it was.
    std::vector<std::pair<AutogradMeta*, Tensor>> accumulated;
    for (AutogradMeta* meta : order) {
      add_narrowed_parts(meta);
      auto found = grads_.find(meta);
      if (found == grads_.end() || !found->second.defined()) continue;
      Tensor gradient = found->second;
      if (targets_.empty() && (meta->grad_fn == nullptr || meta->retains_grad)) {
        Tensor add = create_graph_ ? gradient : gradient.detach();
        accumulated.emplace_back(meta, meta->grad.defined() ? meta->grad + add : add);
      }
      if (meta->grad_fn != nullptr) propagate(*meta, gradient);
    }
    for (auto& [meta, sum] : accumulated) meta->grad = std::move(sum);
    if (!retain_graph_)
      for (AutogradMeta* meta : order)
        if (meta->grad_fn != nullptr) release(*meta->grad_fn);
  }

  Tensor gradient_of(AutogradMeta* meta) const {
    auto found = grads_.find(meta);
    return found == grads_.end() ? Tensor() : found->second;
  }

 private:
  bool retain_graph_, create_graph_;
  std::vector<AutogradMeta*> roots_;
  absl::flat_hash_set<AutogradMeta*> targets_;
  absl::flat_hash_map<AutogradMeta*, Tensor> grads_;
  // Whether a meta's gradient is wanted: every reached meta in backward(), those with a path to
  // a target in grad(). Also the walk's visited set.
  absl::flat_hash_map<AutogradMeta*, bool> matters_;

  void accumulate(AutogradMeta* meta, const Tensor& gradient) {
    Tensor& slot = grads_[meta];
    slot = slot.defined() ? slot + gradient : gradient;
  }

  // Note [The gradients of narrowed parts]
  // A tensor read in parts (a fused q, k, v projection split three ways; chunk, split) gets a
  // gradient from each part: by narrow's rule, the part's gradient with zeros before and after
  // it. Summed as they arrived, three parts made three full-size cats, mostly of zeros, and two
  // additions (the tiny GPT's step spent more on them than on its attention's products). The
  // engine keeps a part's gradient apart instead, and when the tensor's gradient is read sums
  // the parts along one dim that do not overlap as one cat, zeros only in the gaps: the sum of
  // the rule's results, without adding zeros (so a -0 stays -0, as in PyTorch's split
  // backward, where the sum of zeros made it +0).
  struct NarrowedPart {
    int64_t dim = 0, start = 0;
    Tensor gradient;  // the part's, of its shape and the operand's dtype
    Shape whole;      // the operand's shape
  };
  absl::flat_hash_map<AutogradMeta*, std::vector<NarrowedPart>> narrowed_parts_;

  // Adds the gradients of `meta`'s narrowed parts to its gradient: parts along one dim that do
  // not overlap as one cat, each run of such parts its own.
  void add_narrowed_parts(AutogradMeta* meta) {
    auto found = narrowed_parts_.find(meta);
    if (found == narrowed_parts_.end()) return;
    std::vector<NarrowedPart> parts = std::move(found->second);
    narrowed_parts_.erase(found);
    std::stable_sort(parts.begin(), parts.end(), [](const NarrowedPart& a, const NarrowedPart& b) {
      return a.dim != b.dim ? a.dim < b.dim : a.start < b.start;
    });
    for (size_t first = 0; first < parts.size();) {
      const int64_t dim = parts[first].dim;
      std::vector<Tensor> pieces;
      int64_t at = 0;  // along dim, where the pieces so far end
      size_t next = first;
      for (; next < parts.size() && parts[next].dim == dim && parts[next].start >= at; ++next) {
        const NarrowedPart& part = parts[next];
        if (part.start > at) pieces.push_back(zeros_along(part, dim, part.start - at));
        pieces.push_back(part.gradient);
        at = part.start + part.gradient.size(dim);
      }
      const NarrowedPart& last = parts[next - 1];
      if (at < last.whole[dim]) pieces.push_back(zeros_along(last, dim, last.whole[dim] - at));
      accumulate(meta, pieces.size() == 1 ? pieces[0] : cat(pieces, dim));
      first = next;
    }
  }
  static Tensor zeros_along(const NarrowedPart& like, int64_t dim, int64_t length) {
    Shape shape = like.whole;
    shape[dim] = length;
    return zeros(shape, TensorOptions(like.gradient.dtype()).device(like.gradient.device()));
  }

  // Every meta the roots reach whose gradient matters, each after every meta that feeds it.
  // In grad() mode only paths that end at a target matter.
  std::vector<AutogradMeta*> topological_order() {
    auto& matters = matters_;
    std::vector<AutogradMeta*> post_order;
    std::vector<std::pair<AutogradMeta*, size_t>> stack;  // meta, next operand to visit
    for (AutogradMeta* root : roots_) {
      if (matters.contains(root)) continue;
      matters[root] = false;
      stack.push_back({root, 0});
      while (!stack.empty()) {
        auto& [meta, next] = stack.back();
        const GradNode* node = meta->grad_fn.get();
        if (node != nullptr && next < node->operands.size()) {
          AutogradMeta* operand = node->operands[next++].edge.get();
          if (operand != nullptr && !matters.contains(operand)) {
            matters[operand] = false;
            stack.push_back({operand, 0});
          }
          continue;
        }
        bool m = targets_.empty() || targets_.contains(meta);
        if (node != nullptr)
          for (const SavedOperand& operand : node->operands)
            if (operand.edge != nullptr && matters[operand.edge.get()]) m = true;
        matters[meta] = m;
        if (m) post_order.push_back(meta);
        stack.pop_back();
      }
    }
    std::reverse(post_order.begin(), post_order.end());
    return post_order;
  }

  void propagate(AutogradMeta& meta, const Tensor& gradient) {
    GradNode& node = *meta.grad_fn;
    OperandTensors operands(node.operands.size());
    OperandFlags needed(node.operands.size(), false);
    // A checkpointed function's op, once the function has returned, reads recomputed values
    // (Note [Activation checkpointing] in frontend/checkpoint.cc); a released one reads nothing,
    // as any released node.
    const detail::TapeReplay* replay =
        node.tape != nullptr && !node.released && node.result == nullptr
            ? &replay_of(*node.tape, gradient)
            : nullptr;
    std::string stale;  // why a saved value cannot be read, if one cannot
    for (size_t i = 0; i < node.operands.size(); ++i) {
      const SavedOperand& operand = node.operands[i];
      needed[i] = operand.edge != nullptr && matters_.at(operand.edge.get());
      auto impl = operand.impl.lock();
      if (impl != nullptr && impl->version != operand.version) {
        if (stale.empty())
          stale = absl::StrCat(
              "one of the variables needed for gradient computation has been modified by an "
              "inplace operation: ",
              describe(operand), ", which is operand ", i, " of ", grad_fn_name_of(node.op),
              " (made at ", node.where.str(), "), is at version ", impl->version,
              "; expected version ", operand.version, " instead.");
        continue;  // the rule must not read it
      }
      operands[i] = saved_tensor(
          replay != nullptr ? detail::replayed_operand(node, i, *replay) : operand.value,
          create_graph_ ? operand.edge : nullptr);
    }
    if (node.op == Op::Narrow) {
      // Kept apart until the operand's gradient is read (Note [The gradients of narrowed
      // parts]).
      const SavedOperand& operand = node.operands[0];
      if (needed[0]) {
        const int64_t rank = static_cast<int64_t>(operand.shape.size());
        const int64_t dim = node.attrs.get_int("dim");
        narrowed_parts_[operand.edge.get()].push_back({dim < 0 ? dim + rank : dim,
                                                       node.attrs.get_int("start"),
                                                       gradient.to(operand.dtype), operand.shape});
      }
      return;
    }
    Tensor result =
        saved_tensor(replay != nullptr ? detail::replayed_result(node, *replay) : node.result,
                     create_graph_ ? meta.shared_from_this() : nullptr);
    absl::InlinedVector<Tensor, 3> grads;
    try {
      grads = GradientRule(node, gradient, std::move(operands), std::move(result), needed).apply();
    } catch (const Error&) {
      // A rule that reads a value it cannot have: freed, or changed in place since.
      if (node.released)
        throw GradError(absl::StrCat(
            "Trying to backward through the graph a second time (or directly access saved "
            "tensors after they have already been freed). Saved intermediate values of the graph "
            "are freed when you call .backward() or autograd.grad(). Specify retain_graph=True "
            "if you need to backward through the graph a second time or if you need to access "
            "saved tensors after calling backward. (",
            grad_fn_name_of(node.op), " made at ", node.where.str(), ")"));
      if (!stale.empty()) throw GradError(stale);
      throw;
    }
    for (size_t i = 0; i < node.operands.size(); ++i) {
      if (!needed[i] || !grads[i].defined()) continue;
      const SavedOperand& operand = node.operands[i];
      Tensor flow = sum_to(grads[i], operand.shape).to(operand.dtype);
      accumulate(operand.edge.get(), flow);
    }
  }

  // The replay of `tape` in this walk, made when the walk first reaches one of its nodes (node
  // storage: a replay stays where it is while others are added).
  const detail::TapeReplay& replay_of(const CheckpointTape& tape, const Tensor& gradient) {
    auto found = replays_.find(&tape);
    if (found == replays_.end())
      found = replays_.emplace(&tape, detail::replay_tape(tape, gradient)).first;
    return found->second;
  }
  absl::node_hash_map<const CheckpointTape*, detail::TapeReplay> replays_;

  static void release(GradNode& node) {
    if (node.tape != nullptr && !node.released) detail::release_tape(*node.tape);
    node.released = true;
    for (SavedOperand& operand : node.operands) operand.value = nullptr;
    node.result = nullptr;
  }
};

}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph,
                         bool create_graph, bool allow_unused) {
  Engine engine(retain_graph.value_or(create_graph), create_graph);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad())
      throw GradError(
          absl::StrCat("One of the differentiated Tensors (input ", i, ") does not require grad"));
    engine.add_target(inputs[i].impl()->autograd.get());
  }
  engine.seed(outputs, grad_outputs);
  engine.run();
  std::vector<Tensor> result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor gradient = engine.gradient_of(inputs[i].impl()->autograd.get());
    if (!gradient.defined() && !allow_unused)
      throw GradError(absl::StrCat(
          "One of the differentiated Tensors (input ", i,
          ") appears to not have been used in the graph. Set allow_unused=True if this is the "
          "desired behavior."));
    result.push_back(gradient);
  }
  return result;
}

namespace autograd {
namespace {

struct BackwardCallbacks {
  std::mutex mutex;
  int64_t next = 0;
  std::vector<std::pair<int64_t, std::function<void()>>> callbacks;
};

BackwardCallbacks& backward_callbacks() {
  static auto* callbacks = new BackwardCallbacks;
  return *callbacks;
}

void run_backward_callbacks() {
  std::vector<std::function<void()>> now;
  {
    BackwardCallbacks& all = backward_callbacks();
    std::lock_guard lock(all.mutex);
    for (const auto& entry : all.callbacks) now.push_back(entry.second);
  }
  for (const auto& callback : now) callback();
}

}  // namespace

void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors,
              std::optional<bool> retain_graph, bool create_graph) {
  Engine engine(retain_graph.value_or(create_graph), create_graph);
  engine.seed(tensors, grad_tensors);
  engine.run();
  run_backward_callbacks();
  BackwardRoots& roots = backward_roots();
  std::lock_guard lock(roots.mutex);
  // Outputs gone since (a loop of backward() without a step()) are dropped, so the list holds
  // at most the outputs still alive.
  std::erase_if(roots.roots, [](const std::weak_ptr<TensorImpl>& root) { return root.expired(); });
  for (const Tensor& t : tensors) roots.roots.push_back(t.impl());
}
}  // namespace autograd

int64_t add_backward_callback(std::function<void()> callback) {
  auto& all = autograd::backward_callbacks();
  std::lock_guard lock(all.mutex);
  all.callbacks.emplace_back(all.next, std::move(callback));
  return all.next++;
}

void remove_backward_callback(int64_t handle) {
  auto& all = autograd::backward_callbacks();
  std::lock_guard lock(all.mutex);
  std::erase_if(all.callbacks, [&](const auto& entry) { return entry.first == handle; });
}

void evaluate_with_next_step(const Tensor& value) {
  BackwardRoots& roots = backward_roots();
  std::lock_guard lock(roots.mutex);
  std::erase_if(roots.roots, [](const std::weak_ptr<TensorImpl>& root) { return root.expired(); });
  roots.roots.push_back(value.impl());
}

std::vector<Tensor> take_backward_roots() {
  BackwardRoots& roots = backward_roots();
  std::lock_guard lock(roots.mutex);
  std::vector<Tensor> alive;
  for (const auto& weak : roots.roots)
    if (auto impl = weak.lock()) alive.push_back(Tensor(std::move(impl)));
  roots.roots.clear();
  return alive;
}

namespace detail {

void record_gradient(Op op, const Tensor& result, std::span<const Tensor> operands) {
  if (!grad_mode_enabled || !kHasGradient[static_cast<int>(op)] || !is_floating(result.dtype()))
    return;
  bool any = false;
  for (const Tensor& operand : operands) any = any || operand.requires_grad();
  if (!any) return;
  auto node = make_pooled<GradNode>();
  node->op = op;
  node->attrs = result.value()->node.attrs;
  node->where = result.value()->node.where;
  for (const Tensor& operand : operands) {
    SavedOperand saved;
    saved.value = operand.value();
    if (operand.requires_grad()) saved.edge = operand.impl()->autograd;
    saved.impl = operand.impl();
    saved.version = operand.impl()->version;
    saved.dtype = operand.dtype();
    saved.shape = operand.sizes();
    saved.device = operand.device();
    node->operands.push_back(std::move(saved));
  }
  node->result = result.value();
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  result.impl()->autograd = std::move(meta);
}

}  // namespace detail

// ---- Tensor's autograd methods ----

bool Tensor::requires_grad() const {
  const auto& meta = impl()->autograd;
  return meta != nullptr && meta->requires_grad;
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  auto& meta = impl()->autograd;
  if (meta != nullptr && meta->grad_fn != nullptr) {
    if (!requires_grad)
      throw GradError(
          "you can only change requires_grad flags of leaf variables. If you want to use a "
          "computed variable in a subgraph that doesn't require differentiation use "
          "var_no_grad = var.detach().");
    return *this;
  }
  if (requires_grad && !is_floating(dtype()))
    throw GradError(absl::StrCat("only Tensors of floating point dtype can require gradients (got ",
                                 dtype_torch_name(dtype()), ")"));
  if (meta == nullptr) {
    if (!requires_grad) return *this;
    meta = std::make_shared<AutogradMeta>();
  }
  meta->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto& meta = impl()->autograd;
  return meta == nullptr || meta->grad_fn == nullptr;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const auto& meta = impl()->autograd;
  return meta == nullptr ? kUndefined : meta->grad;
}

Tensor& Tensor::mutable_grad() {
  auto& meta = impl()->autograd;
  if (meta == nullptr) {
    meta = std::make_shared<AutogradMeta>();
    meta->requires_grad = false;
  }
  return meta->grad;
}

void Tensor::retain_grad() {
  if (!requires_grad()) throw GradError("can't retain_grad on Tensor that has requires_grad=False");
  if (!is_leaf()) impl()->autograd->retains_grad = true;
}

std::string Tensor::grad_fn_name() const {
  const auto& meta = impl()->autograd;
  return meta == nullptr || meta->grad_fn == nullptr ? "" : grad_fn_name_of(meta->grad_fn->op);
}

Tensor Tensor::detach() const { return Tensor(value()); }

void Tensor::backward(const Tensor& gradient, std::optional<bool> retain_graph,
                      bool create_graph) const {
  autograd::backward({*this},
                     gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{},
                     retain_graph, create_graph);
}

}  // namespace lazyfuse
