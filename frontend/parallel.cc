// DistributedDataParallel (frontend/parallel.h).
#include "lazyfuse/frontend/parallel.h"

#include <map>
#include <tuple>
#include <vector>

#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/distributed.h"
#include "lazyfuse/frontend/functional.h"

namespace lazyfuse::nn::parallel {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                 DistributedDataParallelOptions options)
    : module_(std::move(module)), options_(options) {
  children_.emplace_back("module", module_);
  training_ = module_->is_training();
  // A job of one process takes the same path (one process's collectives), as PyTorch's does.
  if (options_.broadcast_parameters && distributed::is_initialized()) {
    std::vector<Tensor> parameters = module_->parameters();
    {
      NoGradGuard no_grad;
      for (Tensor& p : parameters) p.copy_(distributed::broadcast(p, 0));
    }
    lazyfuse::eval(parameters);
  }
  callback_ = add_backward_callback([this] {
    if (sync_) average_gradients();
  });
}

DistributedDataParallel::~DistributedDataParallel() { remove_backward_callback(callback_); }

std::string DistributedDataParallel::repr() const {
  return "DistributedDataParallel(\n  (module): " + module_->repr() + "\n)";
}

void DistributedDataParallel::average_gradients() {
  if (!distributed::is_initialized()) return;
  // Last parameters first, as backward() produces their gradients; a bucket per dtype and
  // device, closed when it holds bucket_cap_mb.
  std::vector<Tensor> parameters = module_->parameters();
  const int64_t cap = static_cast<int64_t>(options_.bucket_cap_mb * 1024 * 1024);
  using Key = std::tuple<DType, std::string>;
  std::map<Key, std::vector<Tensor>> open;
  std::map<Key, int64_t> open_bytes;
  NoGradGuard no_grad;
  auto flush = [&](const Key& key) {
    std::vector<Tensor>& bucket = open[key];
    if (bucket.empty()) return;
    std::vector<Tensor> flat;
    for (const Tensor& p : bucket) flat.push_back(p.grad().reshape({-1}));
    const Tensor averaged =
        distributed::all_reduce(flat.size() == 1 ? flat[0] : cat(flat, 0), ReduceOp::AVG);
    int64_t offset = 0;
    for (Tensor& p : bucket) {
      const int64_t n = p.numel();
      p.mutable_grad() = averaged.narrow(0, offset, n).reshape(p.sizes());
      averaged_[p.impl().get()] = p.grad().impl();
      offset += n;
    }
    bucket.clear();
    open_bytes[key] = 0;
  };
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    if (!it->grad().defined()) continue;
    // A gradient this backward() did not touch (another model's backward ran) is the average
    // already.
    if (auto found = averaged_.find(it->impl().get());
        found != averaged_.end() && found->second.lock() == it->grad().impl())
      continue;
    const Key key{it->grad().dtype(), it->grad().device().str()};
    open[key].push_back(*it);
    open_bytes[key] += it->numel() * dtype_size(it->grad().dtype());
    if (open_bytes[key] >= cap) flush(key);
  }
  for (const auto& [key, bucket] : open) flush(key);
}

}  // namespace lazyfuse::nn::parallel
