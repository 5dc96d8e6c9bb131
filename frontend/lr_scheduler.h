// Learning-rate schedules, as torch.optim.lr_scheduler: each sets the rate of every parameter
// group of an optimizer from the group's initial rate and the number of step() calls so far.
//
// A scheduler is made after its optimizer and stepped after optimizer.step(), once per epoch or
// iteration, as PyTorch's. Making one sets the rates for step 0 (LinearLR starts at
// start_factor). The rates are computed in closed form from the step count, in double, so a
// long run does not drift. The optimizer reads each rate as a tensor its kernels take (Note
// [Scalars that change between steps] in optim.cc): a schedule that changes the rate every step
// keeps every step the same graph.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lazyfuse/frontend/optim.h"

namespace lazyfuse::optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  // One more epoch (or iteration): every group's rate for the new count.
  void step();
  // The rates set last, one per group.
  std::vector<double> get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }

  // The rate of a group whose initial rate is `base` at step `epoch` (the closed form).
  virtual double lr_at(double base, int64_t epoch) const = 0;
  // Sets every group's rate for step `epoch`.
  void set_epoch(int64_t epoch);

 protected:
  // Called by each scheduler's constructor, once it can compute lr_at: the rates of step 0.
  void start() { set_epoch(0); }
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;

 private:
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

// The rate times gamma every step_size steps.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(double base, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// The rate times lr_lambda(epoch).
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);
  double lr_at(double base, int64_t epoch) const override;

 private:
  std::function<double(int64_t)> lr_lambda_;
};

// From the rate down to eta_min along half a cosine over T_max steps (and back up after, as
// PyTorch's, which is periodic).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
  double lr_at(double base, int64_t epoch) const override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// The rate times a factor going linearly from start_factor to end_factor over total_iters
// steps, then staying there: warmup.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);
  double lr_at(double base, int64_t epoch) const override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// schedulers[0] until milestones[0], schedulers[1] from there (its count starting again at 0)
// until milestones[1], and so on: warmup then cosine. The schedulers must be of `optimizer`;
// milestones one fewer than schedulers, increasing.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(double base, int64_t epoch) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace lazyfuse::optim
