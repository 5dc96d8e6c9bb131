// SGD, Adam and AdamW: each parameter's update written in tensor ops, all of them evaluated at
// once by Optimizer::step(); parameter groups; gradient clipping.
#include "lazyfuse/frontend/optim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/executor.h"

namespace lazyfuse::optim {

OptimizerParamGroup::OptimizerParamGroup(const OptimizerParamGroup& other)
    : params_(other.params_),
      options_(other.options_ ? other.options_->clone() : nullptr),
      initial_lr_(other.initial_lr_) {}

OptimizerParamGroup& OptimizerParamGroup::operator=(const OptimizerParamGroup& other) {
  if (this != &other) *this = OptimizerParamGroup(other);
  return *this;
}

OptimizerOptions& OptimizerParamGroup::options() {
  if (options_ == nullptr) throw ValueError("optimizer parameter group has no options");
  return *options_;
}
const OptimizerOptions& OptimizerParamGroup::options() const {
  return const_cast<OptimizerParamGroup*>(this)->options();
}

Optimizer::Optimizer(std::vector<OptimizerParamGroup> param_groups,
                     std::unique_ptr<OptimizerOptions> defaults)
    : defaults_(std::move(defaults)) {
  for (OptimizerParamGroup& group : param_groups) add_param_group(std::move(group));
}

void Optimizer::add_param_group(OptimizerParamGroup group) {
  absl::flat_hash_set<const LazyValue*> seen;
  for (const OptimizerParamGroup& other : param_groups_)
    for (const Tensor& parameter : other.params()) seen.insert(parameter.value().get());
  for (const Tensor& parameter : group.params()) {
    if (!parameter.defined()) throw ValueError("optimizer got an undefined parameter");
    if (!seen.insert(parameter.value().get()).second)
      throw ValueError("some parameters appear in more than one parameter group (or twice in one)");
  }
  if (!group.has_options()) group.set_options(defaults_->clone());
  if (group.options().get_lr() < 0)
    throw ValueError(absl::StrCat("Invalid learning rate: ", group.options().get_lr()));
  num_states_ += group.params().size();
  param_groups_.push_back(std::move(group));
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> all;
  for (const OptimizerParamGroup& group : param_groups_)
    all.insert(all.end(), group.params().begin(), group.params().end());
  return all;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> state;
  const TensorOptions float64(kFloat64);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const OptimizerParamGroup& group = param_groups_[g];
    state.emplace_back(absl::StrCat("param_groups.", g, ".lr"),
                       scalar_tensor(group.options().get_lr(), float64));
    if (group.initial_lr())
      state.emplace_back(absl::StrCat("param_groups.", g, ".initial_lr"),
                         scalar_tensor(*group.initial_lr(), float64));
  }
  const std::vector<StateName> names = state_names();
  for (size_t i = 0; i < num_states_; ++i) {
    const std::vector<Tensor> tensors = parameter_state(i);
    for (size_t n = 0; n < tensors.size(); ++n)
      state.emplace_back(absl::StrCat("state.", i, ".", names[n].name), tensors[n]);
  }
  return state;
}

namespace {
// "prefix.<index>.<name>" split, where it has that form.
bool split_key(absl::string_view key, absl::string_view prefix, size_t& index, std::string& name) {
  if (!absl::ConsumePrefix(&key, prefix)) return false;
  const size_t dot = key.find('.');
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(key.substr(0, dot), &index)) return false;
  name = std::string(key.substr(dot + 1));
  return true;
}
}  // namespace

void Optimizer::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state) {
  const std::vector<StateName> names = state_names();
  const std::vector<Tensor> params = parameters();
  std::vector<std::optional<double>> lrs(param_groups_.size()), initial_lrs(param_groups_.size());
  std::vector<std::vector<Tensor>> states(num_states_, std::vector<Tensor>(names.size()));
  auto bad = [](const std::string& key, const std::string& what) {
    return ValueError(absl::StrCat("load_state_dict: '", key, "' ", what));
  };
  for (const auto& [key, value] : state) {
    size_t index = 0;
    std::string name;
    if (!value.defined()) throw bad(key, "is an undefined tensor");
    if (split_key(key, "param_groups.", index, name) && (name == "lr" || name == "initial_lr")) {
      if (index >= param_groups_.size())
        throw bad(key, absl::StrCat("names a group past the ", param_groups_.size(), " there are"));
      if (value.dim() != 0) throw bad(key, "is not a 0-d tensor");
      (name == "lr" ? lrs : initial_lrs)[index] = value.item<double>();
      continue;
    }
    if (!split_key(key, "state.", index, name))
      throw bad(key, "is not a name of this optimizer's state");
    if (index >= num_states_)
      throw bad(key, absl::StrCat("names a parameter past the ", num_states_, " there are"));
    const auto it = std::find_if(names.begin(), names.end(),
                                 [&](const StateName& n) { return name == n.name; });
    if (it == names.end()) throw bad(key, "is not a name of this optimizer's state");
    const Shape want = it->scalar ? Shape{} : params[index].sizes();
    if (value.sizes() != want)
      throw bad(key, absl::StrCat("has shape ", shape_str(value.sizes()), ", expected ",
                                  shape_str(want)));
    if (it->scalar) {  // a step count: a whole number, not negative
      const double count = value.item<double>();
      if (!(count >= 0) || count != std::floor(count))
        throw bad(key, absl::StrCat("is ", count, ", not a step count"));
    }
    states[index][it - names.begin()] = value;
  }
  for (size_t g = 0; g < param_groups_.size(); ++g)
    if (!lrs[g]) throw bad(absl::StrCat("param_groups.", g, ".lr"), "is missing");
  for (size_t i = 0; i < num_states_; ++i) {
    const size_t present = std::count_if(states[i].begin(), states[i].end(),
                                         [](const Tensor& t) { return t.defined(); });
    if (present != 0 && present != names.size())
      throw bad(absl::StrCat("state.", i), "holds only part of a parameter's state");
    // Converted before anything changes: the parameter's dtype and device (a step count stays
    // as it is, read on the host).
    for (size_t n = 0; n < names.size() && present != 0; ++n)
      if (!names[n].scalar)
        states[i][n] = states[i][n].to(params[i].dtype()).to(params[i].device()).detach();
    if (present != 0) eval(states[i]);
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].options().set_lr(*lrs[g]);
    param_groups_[g].initial_lr() = initial_lrs[g];
  }
  for (size_t i = 0; i < num_states_; ++i)
    set_parameter_state(i, states[i][0].defined() ? std::move(states[i]) : std::vector<Tensor>{});
}

void Optimizer::zero_grad() {
  for (OptimizerParamGroup& group : param_groups_)
    for (Tensor& parameter : group.params())
      if (parameter.grad().defined()) parameter.mutable_grad() = Tensor();
}

void Optimizer::step() {
  NoGradGuard no_grad;
  begin_step();
  std::vector<Tensor> results;
  size_t state_index = 0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (Tensor& parameter : param_groups_[g].params()) {
      const size_t index = state_index++;
      const Tensor grad = parameter.grad();
      if (!grad.defined()) continue;
      for (Tensor& state : update(g, index, parameter, grad)) results.push_back(std::move(state));
      results.push_back(parameter);
      results.push_back(grad);
    }
  }
  for (Tensor& root : take_backward_roots()) results.push_back(std::move(root));
  eval(results);
  end_step();
}

// Note [Scalars that change between steps]
// A number written into an expression is a constant node, and a constant's value is part of the
// graph's structure: the schedule cache's key, the kernels' source. A learning rate a scheduler
// changes every step would then make every step a new graph, run the passes again, compile new
// kernels and capture no CUDA graph. So the numbers that change between steps are tensors the
// kernels read: each group's learning rate (float64, rounded once to the update's dtype in the
// step, as the constant was), and Adam's step size, bias correction and decay factor, computed
// on the host from a host step count as PyTorch's Adam computes them in Python floats. Each is a
// 0-d tensor on the device whose buffer stays put: a new value is copied into the buffer of the
// last, outside any evaluation. A param matches the schedule cache on its type and device alone,
// so step 2 and step 10,000 are the same graph, and a CUDA graph recorded from one step reads
// every later step's numbers where it recorded them. (A step count kept on the device and
// incremented by the step itself would be a new buffer each step: its update is not the step's
// last kernel, so Note [Writing an update into its own buffer] in runtime/lazy.cc cannot write it
// in place.) The copy waits for the device's queued work, which may still read the last value.
const Tensor& Optimizer::changing_scalar(const char* name, size_t group, size_t slot, double value,
                                         DType dtype, const Device& device) {
  auto it =
      std::find_if(changing_scalars_.begin(), changing_scalars_.end(), [&](const ScalarBuffer& b) {
        return std::string_view(b.name) == name && b.group == group && b.slot == slot &&
               b.dtype == dtype && b.device == device;
      });
  if (it == changing_scalars_.end()) {
    changing_scalars_.push_back(
        {name, group, slot, dtype, device, std::numeric_limits<double>::quiet_NaN(), Tensor()});
    it = std::prev(changing_scalars_.end());
  }
  if (!(it->value == value)) {
    it->value = value;
    // Rounded to `dtype` on the host, as a cast on the device rounds (to nearest, even).
    const Tensor host = from_vector({value}, {}, TensorOptions(dtype));
    if (it->tensor.defined())
      copy_into(*host.value()->buffer, *it->tensor.value()->buffer);
    else
      it->tensor = Tensor(make_leaf(copy_to_device(*host.value()->buffer, resolve_device(device)),
                                    host.value()->node.where));
  }
  return it->tensor;
}

const Tensor& Optimizer::lr_tensor(size_t group, const Device& device) {
  return changing_scalar("lr", group, 0, param_groups_[group].options().get_lr(), kFloat64, device);
}

namespace {
// The dtype an update's 0-d scalars take: the parameter's, or float32 for half types (where
// PyTorch computes too).
DType scalar_dtype(const Tensor& parameter) {
  const DType dtype = parameter.dtype();
  return dtype == kFloat16 || dtype == kBFloat16 ? kFloat32 : dtype;
}

template <typename Options>
const Options& options_of(const OptimizerParamGroup& group, const char* optimizer) {
  const auto* options = dynamic_cast<const Options*>(&group.options());
  if (options == nullptr)
    throw ValueError(
        absl::StrCat(optimizer, ": a parameter group's options are not its option type"));
  return *options;
}
}  // namespace

SGD::SGD(std::vector<Tensor> parameters, SGDOptions options)
    : SGD(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(parameters))}, options) {}

SGD::SGD(std::vector<OptimizerParamGroup> param_groups, SGDOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<SGDOptions>(defaults)) {}

std::vector<Tensor> SGD::update(size_t group, size_t state_index, Tensor& parameter,
                                const Tensor& grad) {
  const SGDOptions& options = options_of<SGDOptions>(param_groups()[group], "SGD");
  if (momentum_buffers_.size() < num_states()) momentum_buffers_.resize(num_states());
  Tensor direction = grad;
  if (options.weight_decay() != 0) direction = direction + parameter * options.weight_decay();
  std::vector<Tensor> state;
  if (options.momentum() != 0) {
    Tensor& buffer = momentum_buffers_[state_index];
    // A handle of its own from the first step (detach: the same value, another handle), then
    // updated in place as PyTorch's is, so that it is written into its own buffer (Note
    // [Writing an update into its own buffer] in runtime/lazy.cc); the same expression as the
    // update rule's, so the same bits.
    if (buffer.defined())
      buffer.mul_(options.momentum()).add_(direction * (1 - options.dampening()));
    else
      buffer = direction.detach();
    direction = options.nesterov() ? direction + buffer * options.momentum() : buffer;
    state.push_back(buffer);
  }
  parameter.sub_(direction * lr_tensor(group, parameter.device()).to(scalar_dtype(parameter)));
  return state;
}

std::vector<Tensor> SGD::parameter_state(size_t index) const {
  if (index >= momentum_buffers_.size() || !momentum_buffers_[index].defined()) return {};
  return {momentum_buffers_[index]};
}

void SGD::set_parameter_state(size_t index, std::vector<Tensor> state) {
  if (momentum_buffers_.size() < num_states()) momentum_buffers_.resize(num_states());
  momentum_buffers_[index] = state.empty() ? Tensor() : std::move(state[0]);
}

Adam::Adam(std::vector<Tensor> parameters, AdamOptions options)
    : Adam(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(parameters))}, options) {}

Adam::Adam(std::vector<OptimizerParamGroup> param_groups, AdamOptions defaults)
    : Adam(std::move(param_groups), std::make_unique<AdamOptions>(defaults), false) {}

Adam::Adam(std::vector<OptimizerParamGroup> param_groups,
           std::unique_ptr<OptimizerOptions> defaults, bool decoupled)
    : Optimizer(std::move(param_groups), std::move(defaults)), decoupled_(decoupled) {}

void Adam::begin_step() { step_scalars_.clear(); }
void Adam::end_step() { begin_step(); }

namespace {
// Adam's and AdamW's hyperparameters, from either option type.
struct AdamHyper {
  Betas betas;
  double eps, weight_decay;
};
AdamHyper adam_hyper(const OptimizerParamGroup& group, bool decoupled) {
  if (decoupled) {
    const AdamWOptions& o = options_of<AdamWOptions>(group, "AdamW");
    return {o.betas(), o.eps(), o.weight_decay()};
  }
  const AdamOptions& o = options_of<AdamOptions>(group, "Adam");
  return {o.betas(), o.eps(), o.weight_decay()};
}
}  // namespace

const Adam::StepScalars& Adam::step_scalars(size_t group, int64_t count, DType dtype,
                                            const Device& device) {
  // Parameters of the group at other counts (one that had no gradient for a step) take the next
  // slot of buffers.
  size_t slot = 0;
  for (const StepScalars& scalars : step_scalars_) {
    if (scalars.group != group || scalars.dtype != dtype || scalars.device != device) continue;
    if (scalars.count == count) return scalars;
    ++slot;
  }
  const AdamHyper hyper = adam_hyper(param_groups()[group], decoupled_);
  const auto [beta1, beta2] = hyper.betas;
  const double lr = param_groups()[group].options().get_lr();
  // In float64, as PyTorch computes them in Python floats; rounded once to the update's dtype.
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(count));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(count));
  StepScalars scalars{group, count, dtype, device, {}, {}, {}};
  scalars.step_size =
      changing_scalar("step_size", group, slot, lr / bias_correction1, dtype, device);
  scalars.bias_correction2_sqrt = changing_scalar("bias_correction2_sqrt", group, slot,
                                                  std::sqrt(bias_correction2), dtype, device);
  if (decoupled_ && hyper.weight_decay != 0)
    scalars.decay =
        changing_scalar("decay", group, slot, 1 - lr * hyper.weight_decay, dtype, device);
  return step_scalars_.emplace_back(std::move(scalars));
}

std::vector<Tensor> Adam::update(size_t group, size_t state_index, Tensor& parameter,
                                 const Tensor& grad) {
  const AdamHyper hyper = adam_hyper(param_groups()[group], decoupled_);
  const auto [beta1, beta2] = hyper.betas;
  if (state_.size() < num_states()) state_.resize(num_states());
  State& s = state_[state_index];
  const TensorOptions like = TensorOptions(parameter.dtype()).device(parameter.device());
  if (!s.exp_avg.defined()) {
    s.exp_avg = zeros(parameter.sizes(), like);
    s.exp_avg_sq = zeros(parameter.sizes(), like);
  }
  ++s.step;
  const StepScalars& scalars =
      step_scalars(group, s.step, scalar_dtype(parameter), parameter.device());
  Tensor g = grad;
  if (hyper.weight_decay != 0) {
    if (decoupled_) {
      parameter.mul_(scalars.decay);
    } else {
      g = g + parameter * hyper.weight_decay;
    }
  }
  // In place, as PyTorch's Adam updates its moments: each is then written into its own buffer
  // (Note [Writing an update into its own buffer] in runtime/lazy.cc). The same expressions as
  // the update rule's, so the same bits.
  s.exp_avg.add_((g - s.exp_avg) * (1 - beta1));
  s.exp_avg_sq.mul_(beta2).add_(g * g * (1 - beta2));
  const Tensor denominator = s.exp_avg_sq.sqrt() / scalars.bias_correction2_sqrt + hyper.eps;
  parameter.sub_(s.exp_avg / denominator * scalars.step_size);
  return {s.exp_avg, s.exp_avg_sq};
}

std::vector<Tensor> Adam::parameter_state(size_t index) const {
  if (index >= state_.size() || !state_[index].exp_avg.defined()) return {};
  const State& s = state_[index];
  return {scalar_tensor(s.step, TensorOptions(kInt64)), s.exp_avg, s.exp_avg_sq};
}

void Adam::set_parameter_state(size_t index, std::vector<Tensor> state) {
  if (state_.size() < num_states()) state_.resize(num_states());
  if (state.empty()) {
    state_[index] = State();
    return;
  }
  state_[index] = {state[0].item<int64_t>(), std::move(state[1]), std::move(state[2])};
}

AdamW::AdamW(std::vector<Tensor> parameters, AdamWOptions options)
    : AdamW(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(parameters))}, options) {
}

AdamW::AdamW(std::vector<OptimizerParamGroup> param_groups, AdamWOptions defaults)
    : Adam(std::move(param_groups), std::make_unique<AdamWOptions>(defaults), true) {}

}  // namespace lazyfuse::optim

namespace lazyfuse::nn::utils {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  if (!(norm_type > 0))
    throw ValueError(absl::StrCat("clip_grad_norm_: norm_type must be positive, got ", norm_type));
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& parameter : parameters)
    if (parameter.grad().defined()) grads.push_back(parameter.grad());
  if (grads.empty()) return scalar_tensor(0.0);
  const bool infinite = std::isinf(norm_type);
  // Each gradient's norm in float32 or wider (half types widened, as PyTorch's foreach norms
  // compute them), then the norm of those, on the first gradient's device.
  const Device device = grads.front().device();
  Tensor total;
  for (const Tensor& g : grads) {
    const Tensor wide = is_half(g.dtype()) ? g.to(kFloat32) : g;
    const Tensor part = (infinite         ? wide.abs().max()
                         : norm_type == 2 ? (wide * wide).sum()
                                          : wide.abs().pow(norm_type).sum())
                            .to(device);
    total = !total.defined() ? part : infinite ? maximum(total, part) : total + part;
  }
  if (!infinite) total = norm_type == 2 ? total.sqrt() : total.pow(1.0 / norm_type);
  if (error_if_nonfinite && !std::isfinite(total.item<double>()))
    throw ValueError(absl::StrCat("The total norm of order ", norm_type,
                                  " for gradients from `parameters` is non-finite, so it cannot "
                                  "be clipped. To disable this error and scale the gradients by "
                                  "the non-finite norm anyway, set `error_if_nonfinite=False`"));
  const Tensor coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (Tensor parameter : parameters) {
    if (!parameter.grad().defined()) continue;
    Tensor& g = parameter.mutable_grad();  // the parameter's own, shared by every handle
    g.mul_(coefficient.to(g.dtype()).to(g.device()));
  }
  // The step computes the norm to scale the gradients: it keeps it too, for the caller's print.
  evaluate_with_next_step(total);
  return total;
}

}  // namespace lazyfuse::nn::utils
