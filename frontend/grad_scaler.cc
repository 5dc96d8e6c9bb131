// GradScaler (frontend/grad_scaler.h).
#include "lazyfuse/frontend/grad_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

namespace {

void check_settings(const char* who, double scale, double growth_factor, double backoff_factor,
                    int64_t growth_interval) {
  if (!(scale > 0) || !std::isfinite(scale) || !(growth_factor > 1) ||
      !(backoff_factor > 0 && backoff_factor < 1) || growth_interval < 1)
    throw ValueError(absl::StrCat(who, ": scale ", scale, ", growth_factor ", growth_factor,
                                  ", backoff_factor ", backoff_factor, ", growth_interval ",
                                  growth_interval,
                                  ": a positive finite scale, a growth above 1, a backoff in "
                                  "(0, 1) and a positive interval"));
}

}  // namespace

GradScaler::GradScaler(double init_scale, double growth_factor, double backoff_factor,
                       int64_t growth_interval, bool enabled)
    : scale_(init_scale),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      enabled_(enabled) {
  check_settings("GradScaler", init_scale, growth_factor, backoff_factor, growth_interval);
}

std::vector<std::pair<std::string, Tensor>> GradScaler::state_dict() const {
  if (!enabled_) return {};
  return {{"scale", scalar_tensor(scale_, TensorOptions(kFloat64))},
          {"growth_factor", scalar_tensor(growth_factor_, TensorOptions(kFloat64))},
          {"backoff_factor", scalar_tensor(backoff_factor_, TensorOptions(kFloat64))},
          {"growth_interval", scalar_tensor(growth_interval_, TensorOptions(kInt64))},
          {"_growth_tracker", scalar_tensor(growth_tracker_, TensorOptions(kInt64))}};
}

void GradScaler::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state) {
  if (!enabled_) return;
  const std::vector<std::string> names = {"scale", "growth_factor", "backoff_factor",
                                          "growth_interval", "_growth_tracker"};
  std::map<std::string, double> values;
  for (const auto& [key, value] : state) {
    if (std::find(names.begin(), names.end(), key) == names.end())
      throw ValueError(absl::StrCat("GradScaler.load_state_dict: '", key,
                                    "' is not a name of GradScaler's state"));
    if (!value.defined() || value.dim() != 0 || value.dtype() == kBool)
      throw ValueError(absl::StrCat("GradScaler.load_state_dict: '", key, "' is not a 0-d number"));
    values[key] = value.item<double>();
  }
  for (const std::string& name : names)
    if (!values.contains(name))
      throw ValueError(absl::StrCat("GradScaler.load_state_dict: '", name, "' is missing"));
  const double interval = values["growth_interval"], tracker = values["_growth_tracker"];
  if (interval != std::floor(interval) || tracker != std::floor(tracker) || tracker < 0 ||
      tracker >= interval || interval > 1e18)
    throw ValueError(absl::StrCat("GradScaler.load_state_dict: '_growth_tracker' ", tracker,
                                  " and 'growth_interval' ", interval,
                                  " are not whole numbers with 0 <= tracker < interval"));
  check_settings("GradScaler.load_state_dict", values["scale"], values["growth_factor"],
                 values["backoff_factor"], static_cast<int64_t>(interval));
  scale_ = values["scale"];
  growth_factor_ = values["growth_factor"];
  backoff_factor_ = values["backoff_factor"];
  growth_interval_ = static_cast<int64_t>(interval);
  growth_tracker_ = static_cast<int64_t>(tracker);
}

Tensor GradScaler::scale(const Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!enabled_) return;
  if (unscaled_.contains(&optimizer))
    throw ValueError(
        "GradScaler: unscale_ was already called on this optimizer since the last update()");
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  Tensor finite;  // the sum of every gradient's probe
  for (optim::OptimizerParamGroup& group : optimizer.param_groups())
    for (Tensor& parameter : group.params()) {
      if (!parameter.grad().defined()) continue;
      // Times the reciprocal, in float32 or wider, as PyTorch's _amp_foreach_non_finite_check_
      // _and_unscale_ multiplies.
      Tensor& grad = parameter.mutable_grad();
      const Tensor wide = grad.to(is_half(grad.dtype()) ? kFloat32 : grad.dtype()) * (1.0 / scale_);
      grad = wide.to(grad.dtype());
      // 0 where every element is finite, NaN otherwise (an infinity or NaN times 0 is NaN), in
      // the unscaled gradient's own width (a float64 one is not narrowed to float32 for it).
      const Tensor probe = (wide * 0).sum().to(kFloat64);
      finite = finite.defined() ? finite + probe : probe;
      grads.push_back(grad);
    }
  PerOptimizer& state = unscaled_[&optimizer];
  if (finite.defined()) {
    grads.push_back(finite);
    eval(grads);
    state.found_inf = !(finite.item<double>() == 0);
  }
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  if (!unscaled_.contains(&optimizer)) unscale_(optimizer);
  PerOptimizer& state = unscaled_[&optimizer];
  if (state.stepped)
    throw ValueError(
        "GradScaler: step() was already called on this optimizer since the last "
        "update()");
  state.stepped = true;
  if (state.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!enabled_) return;
  if (unscaled_.empty())
    throw ValueError("GradScaler: update() with no optimizer unscaled or stepped since the last");
  bool found_inf = false;
  for (const auto& [optimizer, state] : unscaled_) found_inf |= state.found_inf;
  unscaled_.clear();
  if (found_inf) {
    scale_ *= backoff_factor_;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == growth_interval_) {
    scale_ *= growth_factor_;
    growth_tracker_ = 0;
  }
}

}  // namespace lazyfuse
