// Activation checkpointing, as torch.utils.checkpoint.checkpoint (use_reentrant=False): memory
// for compute. What a checkpointed function computes inside is not kept for backward; backward
// computes it again from the function's inputs when its gradient reaches them (Note [Activation
// checkpointing] in checkpoint.cc).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse {

struct GradNode;
struct CheckpointTape;

namespace nn::utils {

// `function(inputs)`, with the values it makes inside recomputed in backward rather than kept
// from the forward. The inputs are kept; so are the tensors the function reads besides them
// (parameters, and values made from no input, such as a dropout's draws, so that the recomputed
// dropout keeps the forward's mask). Outside grad mode, or inside another checkpoint, it is
// `function(inputs)` (the inner function is then recorded with the outer one).
std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& function,
    const std::vector<Tensor>& inputs, const Loc& where = Loc::current());
// One input, one result: a block of a model, `checkpoint([&](const Tensor& x) { return
// block->forward(x); }, x)`.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& function, const Tensor& input,
                  const Loc& where = Loc::current());

}  // namespace nn::utils

namespace detail {

// Called by record_gradient for each op it records while a checkpointed function runs: puts
// `node` on that function's tape. Does nothing outside one.
void record_on_tape(const std::shared_ptr<GradNode>& node, const Tensor& result,
                    std::span<const Tensor> operands);

// The values of a tape recomputed by one backward walk: its inputs (read through `after`),
// then its entries' results.
struct TapeReplay {
  std::vector<LazyRef> inputs, entries;
};
// Recomputes `tape` once `gradient` (the gradient that reached one of its nodes) is computed.
// A GradError if backward already freed the tape.
TapeReplay replay_tape(const CheckpointTape& tape, const Tensor& gradient);
// Operand `i` of `node`'s op, and its result, in `replay`.
LazyRef replayed_operand(const GradNode& node, size_t i, const TapeReplay& replay);
LazyRef replayed_result(const GradNode& node, const TapeReplay& replay);
// Frees what the tape keeps (backward without retain_graph).
void release_tape(CheckpointTape& tape);

}  // namespace detail
}  // namespace lazyfuse
