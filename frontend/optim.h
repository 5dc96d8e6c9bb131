// Optimizers, as LibTorch's torch::optim: SGD, Adam, AdamW with their option classes, parameter
// groups with options of their own (OptimizerParamGroup), and gradient clipping.
//
// step() updates every parameter in place (Note [In-place updates]) and then evaluates, in one
// evaluation, the parameters' new values, their gradients, the optimizer's state and the outputs
// backward() started from: forward, backward and update run as one fused program, and a
// `loss.item()` after step() reads a computed value. Every number that changes from step to
// step lives in a tensor on the parameter's device — the step count behind Adam's bias
// corrections, and each group's learning rate, which a scheduler (lr_scheduler.h) may change every
// step — so each step is the same graph: its schedule and kernels are reused, never rebuilt
// (Note [Scalars that change between steps] in optim.cc).
#pragma once

#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse::optim {

using Betas = std::tuple<double, double>;

// What every optimizer's options have: a learning rate a scheduler reads and sets.
class OptimizerOptions {
 public:
  virtual ~OptimizerOptions() = default;
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
};

#define LF_OPTION(Options, type, name) \
  Options& name(type value) {          \
    name##_ = value;                   \
    return *this;                      \
  }                                    \
  type name() const { return name##_; }

#define LF_OPTIONS_BASE(Options)                             \
  double get_lr() const override { return lr_; }             \
  void set_lr(double lr) override { lr_ = lr; }              \
  std::unique_ptr<OptimizerOptions> clone() const override { \
    return std::make_unique<Options>(*this);                 \
  }

struct SGDOptions : OptimizerOptions {
  explicit SGDOptions(double lr) : lr_(lr) {}
  LF_OPTION(SGDOptions, double, lr)
  LF_OPTION(SGDOptions, double, momentum)
  LF_OPTION(SGDOptions, double, dampening)
  LF_OPTION(SGDOptions, double, weight_decay)
  LF_OPTION(SGDOptions, bool, nesterov)
  LF_OPTIONS_BASE(SGDOptions)

 private:
  double lr_;
  double momentum_ = 0, dampening_ = 0, weight_decay_ = 0;
  bool nesterov_ = false;
};

struct AdamOptions : OptimizerOptions {
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  LF_OPTION(AdamOptions, double, lr)
  LF_OPTION(AdamOptions, Betas, betas)
  LF_OPTION(AdamOptions, double, eps)
  LF_OPTION(AdamOptions, double, weight_decay)
  LF_OPTIONS_BASE(AdamOptions)

 private:
  double lr_;
  Betas betas_ = {0.9, 0.999};
  double eps_ = 1e-8, weight_decay_ = 0;
};

// Adam with decoupled weight decay (default 1e-2, as PyTorch's).
struct AdamWOptions : OptimizerOptions {
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  LF_OPTION(AdamWOptions, double, lr)
  LF_OPTION(AdamWOptions, Betas, betas)
  LF_OPTION(AdamWOptions, double, eps)
  LF_OPTION(AdamWOptions, double, weight_decay)
  LF_OPTIONS_BASE(AdamWOptions)

 private:
  double lr_;
  Betas betas_ = {0.9, 0.999};
  double eps_ = 1e-8, weight_decay_ = 1e-2;
};

#undef LF_OPTION
#undef LF_OPTIONS_BASE

// Parameters that share options: nanoGPT's two groups, weights decayed and biases and norms not.
// A group made without options takes the optimizer's defaults.
class OptimizerParamGroup {
 public:
  OptimizerParamGroup(std::vector<Tensor> params) : params_(std::move(params)) {}  // NOLINT
  OptimizerParamGroup(std::vector<Tensor> params, std::unique_ptr<OptimizerOptions> options)
      : params_(std::move(params)), options_(std::move(options)) {}
  OptimizerParamGroup(const OptimizerParamGroup& other);
  OptimizerParamGroup& operator=(const OptimizerParamGroup& other);
  OptimizerParamGroup(OptimizerParamGroup&&) = default;
  OptimizerParamGroup& operator=(OptimizerParamGroup&&) = default;

  bool has_options() const { return options_ != nullptr; }
  OptimizerOptions& options();  // a LogicError when it has none
  const OptimizerOptions& options() const;
  void set_options(std::unique_ptr<OptimizerOptions> options) { options_ = std::move(options); }
  std::vector<Tensor>& params() { return params_; }
  const std::vector<Tensor>& params() const { return params_; }
  // The rate the group had when the first scheduler took it (PyTorch's "initial_lr"): what every
  // scheduler of the optimizer scales, however an earlier one left the rate.
  std::optional<double>& initial_lr() { return initial_lr_; }
  const std::optional<double>& initial_lr() const { return initial_lr_; }

 private:
  std::vector<Tensor> params_;
  std::unique_ptr<OptimizerOptions> options_;
  std::optional<double> initial_lr_;
};

class Optimizer {
 public:
  Optimizer(std::vector<OptimizerParamGroup> param_groups,
            std::unique_ptr<OptimizerOptions> defaults);
  virtual ~Optimizer() = default;
  // Forgets every parameter's gradient (PyTorch's default, set_to_none).
  void zero_grad();
  // One update of every parameter that has a gradient, evaluated at once.
  void step();
  // A group more, with the defaults where it has no options (a parameter already in a group is a
  // ValueError, as PyTorch's).
  void add_param_group(OptimizerParamGroup group);
  std::vector<OptimizerParamGroup>& param_groups() { return param_groups_; }
  const std::vector<OptimizerParamGroup>& param_groups() const { return param_groups_; }
  OptimizerOptions& defaults() { return *defaults_; }
  // Every group's parameters, in order.
  std::vector<Tensor> parameters() const;

  // The optimizer's state as named tensors, PyTorch's state_dict() flattened: each group's rate
  // ("param_groups.0.lr", and "param_groups.0.initial_lr" once a scheduler took the group) as a
  // 0-d float64, and each parameter's state under its index over all groups ("state.3.exp_avg",
  // "state.3.step"), for parameters that have been stepped. The tensors are the optimizer's own,
  // as PyTorch's state_dict's are: the next step() updates them. save_safetensors writes it; a run
  // that loads it back, with the module's, the scheduler's epoch, get_rng_state() and the data's
  // position, takes the steps the uninterrupted run takes, bit for bit.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Sets the state from state_dict()'s names, as PyTorch's load_state_dict: every group's rate
  // and each parameter's state (converted to the parameter's dtype and device; a parameter the
  // state does not name starts afresh). A ValueError naming the key where a name is unknown, a
  // group's rate is missing, a parameter's state is partial, or a shape is not what it must be;
  // then nothing has changed.
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state);

 protected:
  // The in-place update of a parameter of `group` whose state is number `state_index` (counted
  // over all groups, in order); returns the state tensors it changed, which step() evaluates
  // with the parameters.
  virtual std::vector<Tensor> update(size_t group, size_t state_index, Tensor& parameter,
                                     const Tensor& grad) = 0;
  // Called by step() before the first update and after the evaluation.
  virtual void begin_step() {}
  virtual void end_step() {}
  // Group `group`'s learning rate as a 0-d float64 tensor on `device`, computed: a value its
  // kernels read, the same tensor while the rate stays (Note [Scalars that change between
  // steps] in optim.cc).
  const Tensor& lr_tensor(size_t group, const Device& device);
  // A number an update computes on the host that changes between steps (Adam's step size), as a
  // 0-d tensor of `dtype` on `device` that the kernels read: one buffer per (`name`, `group`,
  // `slot`, dtype, device), written anew where `value` changed (the same Note).
  const Tensor& changing_scalar(const char* name, size_t group, size_t slot, double value,
                                DType dtype, const Device& device);
  // How many parameters all groups hold: the number of states an optimizer keeps.
  size_t num_states() const { return num_states_; }
  // What state_dict() holds of a parameter: its state's names, each of the parameter's shape or
  // a 0-d scalar; parameter `index`'s state (empty before its first step); and setting it
  // (empty: as before a first step) from tensors of those names, checked and converted.
  struct StateName {
    const char* name;
    bool scalar;  // 0-d (a step count), else of the parameter's shape
  };
  virtual std::vector<StateName> state_names() const = 0;
  virtual std::vector<Tensor> parameter_state(size_t index) const = 0;
  virtual void set_parameter_state(size_t index, std::vector<Tensor> state) = 0;

 private:
  std::vector<OptimizerParamGroup> param_groups_;
  std::unique_ptr<OptimizerOptions> defaults_;
  size_t num_states_ = 0;
  struct ScalarBuffer {
    const char* name;
    size_t group, slot;
    DType dtype;
    Device device;
    double value;
    Tensor tensor;
  };
  std::vector<ScalarBuffer> changing_scalars_;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> parameters, SGDOptions options);
  SGD(std::vector<OptimizerParamGroup> param_groups, SGDOptions defaults);

 protected:
  std::vector<Tensor> update(size_t group, size_t state_index, Tensor& parameter,
                             const Tensor& grad) override;
  std::vector<StateName> state_names() const override { return {{"momentum_buffer", false}}; }
  std::vector<Tensor> parameter_state(size_t index) const override;
  void set_parameter_state(size_t index, std::vector<Tensor> state) override;

 private:
  std::vector<Tensor> momentum_buffers_;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> parameters, AdamOptions options = AdamOptions());
  Adam(std::vector<OptimizerParamGroup> param_groups, AdamOptions defaults = AdamOptions());

 protected:
  // `decoupled`: AdamW's weight decay, with AdamWOptions in every group.
  Adam(std::vector<OptimizerParamGroup> param_groups, std::unique_ptr<OptimizerOptions> defaults,
       bool decoupled);
  std::vector<Tensor> update(size_t group, size_t state_index, Tensor& parameter,
                             const Tensor& grad) override;
  void begin_step() override;
  void end_step() override;
  std::vector<StateName> state_names() const override {
    return {{"step", true}, {"exp_avg", false}, {"exp_avg_sq", false}};
  }
  std::vector<Tensor> parameter_state(size_t index) const override;
  void set_parameter_state(size_t index, std::vector<Tensor> state) override;

 private:
  bool decoupled_;
  struct State {
    int64_t step = 0;  // on the host, as PyTorch's (not capturable) Adam keeps it
    Tensor exp_avg, exp_avg_sq;
  };
  std::vector<State> state_;
  // What one step count gives every parameter of a group stepped from it: the bias corrections
  // and AdamW's decay factor, computed on the host and read by the kernels from buffers that
  // stay put. Parameters stepped together share them, so they are written once per group and
  // step (15 of the ~30 nodes of a parameter's update were these: docs/bench/
  // 2026-12-04-1001-h200-train.md). Kept for the current step() only.
  struct StepScalars {
    size_t group;
    int64_t count;  // the step they are for, from 1
    DType dtype;    // of step_size, bias_correction2_sqrt and decay
    Device device;
    Tensor step_size, bias_correction2_sqrt;
    Tensor decay;  // 1 - lr * weight_decay, for AdamW with a weight decay; undefined otherwise
  };
  const StepScalars& step_scalars(size_t group, int64_t count, DType dtype, const Device& device);
  std::vector<StepScalars> step_scalars_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> parameters, AdamWOptions options = AdamWOptions());
  AdamW(std::vector<OptimizerParamGroup> param_groups, AdamWOptions defaults = AdamWOptions());
};

}  // namespace lazyfuse::optim

namespace lazyfuse::nn::utils {
// Scales every gradient so that their norm together (over all of them, of type `norm_type`: 2,
// any p > 0, or infinity) is at most `max_norm`, as torch.nn.utils.clip_grad_norm_: by
// max_norm / (norm + 1e-6) where that is below 1. Returns the norm before clipping, a 0-d tensor,
// pending: nothing waits for the GPU, the scaling fuses into the optimizer's step, and the step
// computes the norm with it (reading it after the step is a read). With
// `error_if_nonfinite`, a norm that is NaN or infinite is a ValueError (this reads the norm).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);
}  // namespace lazyfuse::nn::utils
