// Runs a schedule on the host: fused elementwise programs on all cores (OpenMP), reductions,
// OpenBLAS matmul, views. Called by evaluate() for steps on the CPU.
#pragma once

#include <vector>

#include "ir/schedule.h"
#include "runtime/storage.h"

namespace lazyfuse {

// `values` holds a buffer for every param (by value id) on entry; on return it also holds the
// buffer of every step output that is a graph output. Intermediate buffers are released as
// soon as no later step reads them.
void run_cpu_schedule(const Schedule& schedule, std::vector<std::optional<BufferView>>& values);

// The library steps, also used on their own by tests.
BufferView cpu_reduce(const Node& node, const BufferView& input);
BufferView cpu_matmul(const Node& node, const BufferView& a, const BufferView& b);
BufferView cpu_view(const Node& node, const BufferView& input);
// A contiguous copy of any view.
BufferView cpu_contiguous(const BufferView& input);

}  // namespace lazyfuse
