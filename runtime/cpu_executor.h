// The steps that run on the host: fused elementwise programs on all cores (OpenMP),
// reductions, OpenBLAS matmul, views.
#pragma once

#include <optional>
#include <vector>

#include "ir/schedule.h"
#include "runtime/storage.h"

namespace lazyfuse {

// Runs one step whose device is the host, reading and writing buffers in `values` by value id.
void run_cpu_step(const Graph& graph, const Step& step,
                  std::vector<std::optional<BufferView>>& values);

// The library steps, also used on their own by tests.
BufferView cpu_reduce(const Node& node, const BufferView& input);
BufferView cpu_matmul(const Node& node, const BufferView& a, const BufferView& b);
BufferView cpu_view(const Node& node, const BufferView& input);
// A contiguous copy of any view.
BufferView cpu_contiguous(const BufferView& input);

}  // namespace lazyfuse
