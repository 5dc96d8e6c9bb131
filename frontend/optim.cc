// SGD, Adam and AdamW: each parameter's update written in tensor ops, all of them evaluated at
// once by Optimizer::step().
#include "lazyfuse/frontend/optim.h"

#include <algorithm>

#include "lazyfuse/frontend/autograd.h"

namespace lazyfuse::optim {

Optimizer::Optimizer(std::vector<Tensor> parameters) : parameters_(std::move(parameters)) {}

void Optimizer::zero_grad() {
  for (Tensor& parameter : parameters_)
    if (parameter.grad().defined()) parameter.mutable_grad() = Tensor();
}

void Optimizer::step() {
  NoGradGuard no_grad;
  begin_step();
  std::vector<Tensor> results;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& parameter = parameters_[i];
    const Tensor grad = parameter.grad();
    if (!grad.defined()) continue;
    for (Tensor& state : update(i, parameter, grad)) results.push_back(std::move(state));
    results.push_back(parameter);
    results.push_back(grad);
  }
  for (Tensor& root : take_backward_roots()) results.push_back(std::move(root));
  eval(results);
  end_step();
}

namespace {
// The dtype an update's 0-d scalars take: the parameter's, or float32 for half types (where
// PyTorch computes too).
DType scalar_dtype(const Tensor& parameter) {
  const DType dtype = parameter.dtype();
  return dtype == kFloat16 || dtype == kBFloat16 ? kFloat32 : dtype;
}
}  // namespace

SGD::SGD(std::vector<Tensor> parameters, SGDOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  momentum_buffers_.resize(this->parameters().size());
}

std::vector<Tensor> SGD::update(size_t index, Tensor& parameter, const Tensor& grad) {
  Tensor direction = grad;
  if (options_.weight_decay() != 0) direction = direction + parameter * options_.weight_decay();
  std::vector<Tensor> state;
  if (options_.momentum() != 0) {
    Tensor& buffer = momentum_buffers_[index];
    // A handle of its own from the first step (detach: the same value, another handle), then
    // updated in place as PyTorch's is, so that it is written into its own buffer (Note
    // [Writing an update into its own buffer] in runtime/lazy.cc); the same expression as the
    // update rule's, so the same bits.
    if (buffer.defined())
      buffer.mul_(options_.momentum()).add_(direction * (1 - options_.dampening()));
    else
      buffer = direction.detach();
    direction = options_.nesterov() ? direction + buffer * options_.momentum() : buffer;
    state.push_back(buffer);
  }
  parameter.sub_(direction, options_.lr());
  return state;
}

Adam::Adam(std::vector<Tensor> parameters, AdamOptions options)
    : Adam(std::move(parameters), options, false) {}

Adam::Adam(std::vector<Tensor> parameters, AdamOptions options, bool decoupled_weight_decay)
    : Optimizer(std::move(parameters)), options_(options), decoupled_(decoupled_weight_decay) {
  state_.resize(this->parameters().size());
}

void Adam::begin_step() {
  step_scalars_.clear();
  zero_counts_.clear();
}
void Adam::end_step() { begin_step(); }

const Adam::StepScalars& Adam::step_scalars(const Tensor& count, DType dtype) {
  for (const StepScalars& scalars : step_scalars_)
    if (scalars.count == count.value().get() && scalars.dtype == dtype) return scalars;
  const auto [beta1, beta2] = options_.betas();
  StepScalars scalars{count.value().get(), dtype, count + 1, {}, {}};
  // The next count replaces this one, as an in-place increment would.
  note_replaced(scalars.next_count.value(), count.value());
  // The bias corrections in float64 from the step count on the device, as PyTorch computes
  // them in Python floats; rounded once to the update's dtype.
  const TensorOptions wide = TensorOptions(kFloat64).device(count.device());
  const Tensor bias_correction1 = 1 - full({}, beta1, wide).pow(scalars.next_count);
  const Tensor bias_correction2 = 1 - full({}, beta2, wide).pow(scalars.next_count);
  scalars.step_size = (options_.lr() / bias_correction1).to(dtype);
  scalars.bias_correction2_sqrt = bias_correction2.sqrt().to(dtype);
  return step_scalars_.emplace_back(std::move(scalars));
}

std::vector<Tensor> Adam::update(size_t index, Tensor& parameter, const Tensor& grad) {
  const auto [beta1, beta2] = options_.betas();
  const double lr = options_.lr(), weight_decay = options_.weight_decay();
  State& s = state_[index];
  const TensorOptions like = TensorOptions(parameter.dtype()).device(parameter.device());
  if (!s.step.defined()) {
    // Parameters that start together share one count (step_scalars).
    auto it = std::find_if(zero_counts_.begin(), zero_counts_.end(), [&](const Tensor& count) {
      return count.device() == parameter.device();
    });
    s.step = it != zero_counts_.end()
                 ? *it
                 : zero_counts_.emplace_back(
                       zeros({}, TensorOptions(kFloat64).device(parameter.device())));
    s.exp_avg = zeros(parameter.sizes(), like);
    s.exp_avg_sq = zeros(parameter.sizes(), like);
  }
  const StepScalars& scalars = step_scalars(s.step, scalar_dtype(parameter));
  s.step = scalars.next_count;
  Tensor g = grad;
  if (weight_decay != 0) {
    if (decoupled_) {
      parameter.mul_(1 - lr * weight_decay);
    } else {
      g = g + parameter * weight_decay;
    }
  }
  // In place, as PyTorch's Adam updates its moments: each is then written into its own buffer
  // (Note [Writing an update into its own buffer] in runtime/lazy.cc). The same expressions as
  // the update rule's, so the same bits.
  s.exp_avg.add_((g - s.exp_avg) * (1 - beta1));
  s.exp_avg_sq.mul_(beta2).add_(g * g * (1 - beta2));
  const Tensor denominator = s.exp_avg_sq.sqrt() / scalars.bias_correction2_sqrt + options_.eps();
  parameter.sub_(s.exp_avg / denominator * scalars.step_size);
  return {s.step, s.exp_avg, s.exp_avg_sq};
}

AdamW::AdamW(std::vector<Tensor> parameters, AdamWOptions options)
    : Adam(std::move(parameters),
           AdamOptions(options.lr())
               .betas(options.betas())
               .eps(options.eps())
               .weight_decay(options.weight_decay()),
           true) {}

}  // namespace lazyfuse::optim
