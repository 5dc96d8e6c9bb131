// The learning-rate schedules of lr_scheduler.h, each a closed form of the step count.
#include "lazyfuse/frontend/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (OptimizerParamGroup& group : optimizer_.param_groups()) {
    if (!group.initial_lr()) group.initial_lr() = group.options().get_lr();
    base_lrs_.push_back(*group.initial_lr());
  }
}

void LRScheduler::set_epoch(int64_t epoch) {
  last_epoch_ = epoch;
  std::vector<OptimizerParamGroup>& groups = optimizer_.param_groups();
  if (groups.size() != base_lrs_.size())
    throw ValueError(absl::StrCat("lr scheduler: the optimizer has ", groups.size(),
                                  " parameter groups, the scheduler was made for ",
                                  base_lrs_.size()));
  last_lr_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    last_lr_.push_back(lr_at(base_lrs_[g], epoch));
    groups[g].options().set_lr(last_lr_.back());
  }
}

void LRScheduler::step() { set_epoch(last_epoch_ + 1); }

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0)
    throw ValueError(absl::StrCat("StepLR: step_size must be positive, got ", step_size));
  start();
}
double StepLR::lr_at(double base, int64_t epoch) const {
  return base * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : LRScheduler(optimizer), lr_lambda_(std::move(lr_lambda)) {
  if (!lr_lambda_) throw ValueError("LambdaLR: lr_lambda is empty");
  start();
}
double LambdaLR::lr_at(double base, int64_t epoch) const { return base * lr_lambda_(epoch); }

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), T_max_(T_max), eta_min_(eta_min) {
  if (T_max <= 0)
    throw ValueError(absl::StrCat("CosineAnnealingLR: T_max must be positive, got ", T_max));
  start();
}
double CosineAnnealingLR::lr_at(double base, int64_t epoch) const {
  return eta_min_ + (base - eta_min_) *
                        (1 + std::cos(std::numbers::pi * static_cast<double>(epoch) /
                                      static_cast<double>(T_max_))) /
                        2;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  if (!(start_factor > 0 && start_factor <= 1))
    throw ValueError(
        "Starting multiplicative factor expected to be greater than 0 and less or equal to 1.");
  if (!(end_factor >= 0 && end_factor <= 1))
    throw ValueError("Ending multiplicative factor expected to be between 0 and 1.");
  if (total_iters <= 0)
    throw ValueError(absl::StrCat("LinearLR: total_iters must be positive, got ", total_iters));
  start();
}
double LinearLR::lr_at(double base, int64_t epoch) const {
  const double done =
      static_cast<double>(std::min(epoch, total_iters_)) / static_cast<double>(total_iters_);
  return base * (start_factor_ + (end_factor_ - start_factor_) * done);
}

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  if (schedulers_.empty()) throw ValueError("SequentialLR expects at least one scheduler");
  if (milestones_.size() + 1 != schedulers_.size())
    throw ValueError(absl::StrCat(
        "Sequential Schedulers expects number of schedulers provided to be one more than the "
        "number of milestone points, but got number of schedulers ",
        schedulers_.size(), " and the number of milestones to be equal to ", milestones_.size()));
  for (size_t i = 1; i < milestones_.size(); ++i)
    if (milestones_[i] <= milestones_[i - 1])
      throw ValueError("SequentialLR: milestones must increase");
  start();
}
double SequentialLR::lr_at(double base, int64_t epoch) const {
  // The scheduler whose span holds `epoch`, counting from its own start.
  const size_t index = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  const int64_t start = index == 0 ? 0 : milestones_[index - 1];
  return schedulers_[index]->lr_at(base, epoch - start);
}

}  // namespace lazyfuse::optim
