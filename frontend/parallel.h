// Data-parallel training across a job's processes: LibTorch's name,
// nn::parallel::DistributedDataParallel, wrapping a module. Each process runs the module on its
// share of the data (distributed::DistributedSampler); the wrapper makes every process's
// parameters rank 0's when it is made, and after each backward() replaces every gradient with
// its average over the processes, a bucket of gradients per all_reduce. The all_reduces are lazy
// ops like the rest: the optimizer's step() evaluates forward, backward, the averaging and the
// update as one evaluation on each process.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lazyfuse/frontend/nn.h"

namespace lazyfuse::nn::parallel {

struct DistributedDataParallelOptions {
  // Gradients per all_reduce, as PyTorch's bucket_cap_mb: fewer, larger messages.
  double bucket_cap_mb = 25;
  // Whether construction copies rank 0's parameters to every process.
  bool broadcast_parameters = true;
};

class DistributedDataParallel : public Module {
 public:
  explicit DistributedDataParallel(std::shared_ptr<Module> module,
                                   DistributedDataParallelOptions options = {});
  template <typename M>
  requires std::derived_from<M, Module>
  explicit DistributedDataParallel(M module, DistributedDataParallelOptions options = {})
      : DistributedDataParallel(std::make_shared<M>(std::move(module)), options) {}
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Tensor forward(const Tensor& input) override { return module_->forward(input); }
  std::string repr() const override;
  Module& module() { return *module_; }

  // Replaces each parameter's gradient that changed since the last call with its average over
  // the processes (what backward() calls at its end, for every backward() of the process).
  // Every process must have new gradients for the same parameters. Without distributed::init(),
  // nothing.
  void average_gradients();

  // While it lives, backward() leaves the gradients as this process computed them, as PyTorch's
  // no_sync(): the micro-batches of gradient accumulation before the last one, whose backward()
  // then averages what they accumulated, one all_reduce a bucket per optimizer step.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), was_(ddp.sync_) {
      ddp.sync_ = false;
    }
    ~NoSync() { ddp_.sync_ = was_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool was_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

 private:
  std::shared_ptr<Module> module_;
  DistributedDataParallelOptions options_;
  int64_t callback_ = -1;
  bool sync_ = true;  // whether backward() averages (no_sync() turns it off)
  // Per parameter, the gradient average_gradients() last gave it.
  std::map<const TensorImpl*, std::weak_ptr<TensorImpl>> averaged_;
};

}  // namespace lazyfuse::nn::parallel
