// The steps of a schedule that run on a GPU: fused elementwise kernels generated and compiled
// on first use, views, and (to come) reductions and cuBLAS matmul.
#pragma once

#include <optional>
#include <vector>

#include "ir/schedule.h"
#include "runtime/executor.h"
#include "runtime/storage.h"

namespace lazyfuse {

// `memo`, when given, is the step's LaunchMemo from earlier runs of the same schedule.
void run_cuda_step(const Graph& graph, const Step& step, ValueBuffers& values,
                   LaunchMemo* memo = nullptr);
BufferView cuda_contiguous(const BufferView& source);

}  // namespace lazyfuse
