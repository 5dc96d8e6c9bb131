// Loss scaling for float16 training, as torch.amp.GradScaler: float16's gradients underflow
// where bfloat16's and float32's do not, so the loss is multiplied by a large power of two
// before backward() and the gradients divided by it before the step. A step whose gradients
// hold an infinity or a NaN is skipped and the scale halved; after growth_interval steps in a
// row without one, the scale doubles.
//
//   GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);   // unscales, then steps unless a gradient is not finite
//   scaler.update();
//
// Whether the gradients are finite is read on the host before the step, as PyTorch's scaler
// reads it: the backward is then an evaluation of its own, before the step's.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lazyfuse/frontend/optim.h"

namespace lazyfuse {

class GradScaler {
 public:
  explicit GradScaler(double init_scale = 65536.0, double growth_factor = 2.0,
                      double backoff_factor = 0.5, int64_t growth_interval = 2000,
                      bool enabled = true);
  // The loss times the scale (the loss itself when disabled).
  Tensor scale(const Tensor& loss) const;
  // Divides `optimizer`'s gradients by the scale, in place, and notes whether all are finite
  // (evaluating them). At most once per optimizer between two update() calls (a ValueError).
  void unscale_(optim::Optimizer& optimizer);
  // Unscales (unless unscale_ did) and steps when every gradient is finite; returns whether it
  // stepped. At most once per optimizer between two update() calls (a ValueError).
  bool step(optim::Optimizer& optimizer);
  // The scale for the next step: halved where any optimizer's step was skipped, doubled after
  // growth_interval steps in a row. A ValueError where no optimizer was unscaled since the last.
  void update();
  double get_scale() const { return enabled_ ? scale_ : 1.0; }
  bool is_enabled() const { return enabled_; }

  // PyTorch's state_dict() as named 0-d tensors for save_safetensors: "scale", "growth_factor"
  // and "backoff_factor" (float64), "growth_interval" and "_growth_tracker" (int64); empty when
  // disabled. A resumed float16 run loads it with the optimizer's, so that it skips, backs off
  // and grows where the uninterrupted run does.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Sets the five from state_dict()'s names (nothing when disabled). A ValueError naming the key
  // where one is missing, unknown, not a 0-d number or out of the constructor's bounds; then
  // nothing has changed.
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state);

 private:
  double scale_, growth_factor_, backoff_factor_;
  int64_t growth_interval_, growth_tracker_ = 0;
  bool enabled_;
  // Each optimizer's state since the last update(), as PyTorch's per-optimizer state.
  struct PerOptimizer {
    bool found_inf = false, stepped = false;
  };
  std::map<const optim::Optimizer*, PerOptimizer> unscaled_;
};

}  // namespace lazyfuse
