// Autograd: gradients built as lazy IR. While grad mode is on, every op over a tensor that
// requires grad records a GradNode; backward() walks those nodes from the outputs back to the
// leaves, applying each op's rule from ir/ops.def (LF_GRADIENT*), and the gradients it returns
// are pending tensors like any other: they fuse with each other, with the forward pass and with
// whatever consumes them (an optimizer's update), and evaluate when their value is needed.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/graph.h"

namespace lazyfuse {

// Whether ops record gradients (on by default; per thread, as PyTorch's).
class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Sets grad mode for its scope and restores it after.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(enabled);
  }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// No gradients recorded in its scope: what optimizers and evaluation loops run under.
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

// The gradients of `outputs` with respect to `inputs`, as pending tensors; grad() of the inputs
// is left alone. `grad_outputs` may be empty when every output has one element (the gradient
// is then 1). With create_graph the gradients record their own graph, for gradients of
// gradients; retain_graph defaults to create_graph. An input the outputs do not depend on is an
// error unless allow_unused, when its gradient is undefined.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                         bool allow_unused = false);

namespace autograd {
using lazyfuse::grad;
// Accumulates the gradients of `tensors` into grad() of the leaves they depend on.
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors = {},
              std::optional<bool> retain_graph = std::nullopt, bool create_graph = false);
}  // namespace autograd

// Called at the end of every backward(), once the leaves' gradients are accumulated, in the
// order they were added (not by grad()): how DistributedDataParallel averages the gradients
// across processes. Returns a handle for remove_backward_callback.
int64_t add_backward_callback(std::function<void()> callback);
void remove_backward_callback(int64_t handle);

// The outputs backward() started from since the last call, still alive: an optimizer's step()
// evaluates them together with the parameters' new values, so that the forward pass, the
// backward pass and the update are one evaluation and `loss.item()` after step() is a read.
std::vector<Tensor> take_backward_roots();
// Adds `value` to what the next step() evaluates with the roots: a value made from the
// gradients that the step computes anyway and that the caller reads after it (clip_grad_norm_'s
// norm, which a progress line prints). Left out, it stays pending after the step, and reading
// it evaluates the forward and backward passes again. Held weakly, as the roots are.
void evaluate_with_next_step(const Tensor& value);

// ---- The recorded graph (frontend/autograd.cc) ----

struct GradNode;
struct CheckpointTape;  // frontend/checkpoint.cc

// Per tensor that requires grad (or that was given a grad() of its own).
struct AutogradMeta : std::enable_shared_from_this<AutogradMeta> {
  std::shared_ptr<GradNode> grad_fn;  // null for a leaf
  Tensor grad;                        // what backward() accumulated (leaves, retained non-leaves)
  bool requires_grad = true;
  bool retains_grad = false;
};

// One operand of a recorded op.
struct SavedOperand {
  LazyRef value;                       // the operand's value when the op was made
  std::shared_ptr<AutogradMeta> edge;  // null when the operand needs no gradient
  std::weak_ptr<TensorImpl> impl;      // to see whether it was updated in place since
  uint32_t version = 0;
  DType dtype = DType::Float32;
  Shape shape;
  Device device = Device::cpu();
};

// How one op's gradient flows to its operands: the op's rule (ir/ops.def) and what it needs.
struct GradNode {
  Op op;
  Attrs attrs;
  SourceLoc where;
  absl::InlinedVector<SavedOperand, 3> operands;
  LazyRef result;         // the op's own value, which some rules use (exp, sqrt, tanh, ...)
  bool released = false;  // backward() without retain_graph freed the saved values
  // An op recorded inside nn::utils::checkpoint keeps no values once its function has returned
  // (operands' values and result are null): its entry on the function's tape says how backward
  // recomputes them (Note [Activation checkpointing] in frontend/checkpoint.cc).
  std::shared_ptr<CheckpointTape> tape;
  int tape_entry = -1;
};

namespace detail {
// Records the op that made `result` from `operands` when grad mode is on and an operand
// requires grad (called by make_op for every op).
void record_gradient(Op op, const Tensor& result, std::span<const Tensor> operands);
}  // namespace detail

}  // namespace lazyfuse
