// Optimizers, as LibTorch's torch::optim: SGD, Adam, AdamW with their option classes.
//
// step() updates every parameter in place (Note [In-place updates]) and then evaluates, in one
// evaluation, the parameters' new values, their gradients, the optimizer's state and the outputs
// backward() started from: forward, backward and update run as one fused program, and a
// `loss.item()` after step() reads a computed value. Every number that changes from step to
// step (the step count behind Adam's bias corrections) lives in a tensor on the parameter's
// device, so each step is the same graph: its schedule and kernels are reused, never rebuilt.
#pragma once

#include <memory>
#include <tuple>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse::optim {

using Betas = std::tuple<double, double>;

#define LF_OPTION(Options, type, name) \
  Options& name(type value) {          \
    name##_ = value;                   \
    return *this;                      \
  }                                    \
  type name() const { return name##_; }

struct SGDOptions {
  explicit SGDOptions(double lr) : lr_(lr) {}
  LF_OPTION(SGDOptions, double, lr)
  LF_OPTION(SGDOptions, double, momentum)
  LF_OPTION(SGDOptions, double, dampening)
  LF_OPTION(SGDOptions, double, weight_decay)
  LF_OPTION(SGDOptions, bool, nesterov)

 private:
  double lr_;
  double momentum_ = 0, dampening_ = 0, weight_decay_ = 0;
  bool nesterov_ = false;
};

struct AdamOptions {
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  LF_OPTION(AdamOptions, double, lr)
  LF_OPTION(AdamOptions, Betas, betas)
  LF_OPTION(AdamOptions, double, eps)
  LF_OPTION(AdamOptions, double, weight_decay)

 private:
  double lr_;
  Betas betas_ = {0.9, 0.999};
  double eps_ = 1e-8, weight_decay_ = 0;
};

// Adam with decoupled weight decay (default 1e-2, as PyTorch's).
struct AdamWOptions {
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  LF_OPTION(AdamWOptions, double, lr)
  LF_OPTION(AdamWOptions, Betas, betas)
  LF_OPTION(AdamWOptions, double, eps)
  LF_OPTION(AdamWOptions, double, weight_decay)

 private:
  double lr_;
  Betas betas_ = {0.9, 0.999};
  double eps_ = 1e-8, weight_decay_ = 1e-2;
};

#undef LF_OPTION

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> parameters);
  virtual ~Optimizer() = default;
  // Forgets every parameter's gradient (PyTorch's default, set_to_none).
  void zero_grad();
  // One update of every parameter that has a gradient, evaluated at once.
  void step();
  const std::vector<Tensor>& parameters() const { return parameters_; }

 protected:
  // The in-place update of parameter `index`; returns the state tensors it changed, which step()
  // evaluates with the parameters.
  virtual std::vector<Tensor> update(size_t index, Tensor& parameter, const Tensor& grad) = 0;
  // Called by step() before the first update and after the evaluation.
  virtual void begin_step() {}
  virtual void end_step() {}

 private:
  std::vector<Tensor> parameters_;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> parameters, SGDOptions options);
  SGDOptions& options() { return options_; }

 protected:
  std::vector<Tensor> update(size_t index, Tensor& parameter, const Tensor& grad) override;

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_buffers_;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> parameters, AdamOptions options = AdamOptions());
  AdamOptions& options() { return options_; }

 protected:
  Adam(std::vector<Tensor> parameters, AdamOptions options, bool decoupled_weight_decay);
  std::vector<Tensor> update(size_t index, Tensor& parameter, const Tensor& grad) override;
  void begin_step() override;
  void end_step() override;

 private:
  AdamOptions options_;
  bool decoupled_;
  struct State {
    Tensor step, exp_avg, exp_avg_sq;
  };
  std::vector<State> state_;
  // What one step count gives every parameter stepped from it: the next count and the bias
  // corrections. Parameters stepped together share their count tensor, so these are written
  // once per optimizer step, not once per parameter (15 of the ~30 nodes of a parameter's
  // update, and nodes are most of a small model's step on the host: docs/bench/
  // 2026-12-04-1001-h200-train.md). Kept for the current step() only.
  struct StepScalars {
    // The count they follow from, by identity. Not held: the pending next count holds it for
    // the step, and holding it here would keep the next count out of its buffer (Note [Writing
    // an update into its own buffer] in runtime/lazy.cc).
    const LazyValue* count;
    DType dtype;  // of step_size and bias_correction2_sqrt
    Tensor next_count, step_size, bias_correction2_sqrt;
  };
  const StepScalars& step_scalars(const Tensor& count, DType dtype);
  std::vector<StepScalars> step_scalars_;
  std::vector<Tensor> zero_counts_;  // this step's new counts, one per device
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> parameters, AdamWOptions options = AdamWOptions());
};

}  // namespace lazyfuse::optim
