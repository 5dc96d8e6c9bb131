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
#include "lazyfuse/ir/op.h"

namespace lazyfuse {

struct GradNode;
struct CheckpointTape;

namespace nn::utils {

// `function(inputs)`, with the values it makes from its inputs recomputed in backward rather
// than kept from the forward. The inputs are kept, and so are the tensors the function reads
// besides them (parameters). A dropout inside draws the forward's mask again (the same seed and
// offset). The gradients are those without checkpointing; float16 and bfloat16 values may round
// in other places, since the recomputation fuses into backward's kernels (the same bits under
// LAZYFUSE_HALF_ROUNDING=each_op). Outside grad mode, or inside another checkpoint, it is
// `function(inputs)` (an inner function is then recorded with the outer one).
std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& function,
    const std::vector<Tensor>& inputs, const Loc& where = Loc::current());
// One input, one result: a block of a model, `checkpoint([&](const Tensor& x) { return
// block->forward(x); }, x)`.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& function, const Tensor& input,
                  const Loc& where = Loc::current());

}  // namespace nn::utils

namespace detail {

// Called by make_op for each op it makes while a checkpointed function runs (after
// record_gradient): puts the op on the function's tape, with its GradNode where it has one, if
// it needs a gradient, reads a value of the tape or is a source. Does nothing outside one.
void record_on_tape(Op op, const Tensor& result, std::span<const Tensor> operands);

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
// Called as backward without retain_graph releases each of the tape's nodes: frees what the
// tape keeps once all are.
void release_tape(CheckpointTape& tape);

}  // namespace detail
}  // namespace lazyfuse
