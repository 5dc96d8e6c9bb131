// Runs a schedule: each step on its device (cpu_executor.cc, cuda_executor.cc), transfers
// between devices, and the release of intermediate buffers once no later step reads them.
#pragma once

#include <optional>
#include <vector>

#include "ir/schedule.h"
#include "runtime/storage.h"

namespace lazyfuse {

// `values` holds a buffer for every param (by value id) on entry; on return it also holds the
// buffer of every graph output.
void run_schedule(const Schedule& schedule, std::vector<std::optional<BufferView>>& values);

// A contiguous copy of `source` on `device` (host to GPU, GPU to host, GPU to GPU through
// peer copies where the driver can, host to host). Returns `source` itself when it is already
// contiguous there.
BufferView copy_to_device(const BufferView& source, const Device& device);
// A view step on any device: the operand's storage with the view's sizes, strides and offset.
BufferView apply_view(const Node& node, const BufferView& input);
// A contiguous copy on the same device, or `source` when it is contiguous.
BufferView contiguous(const BufferView& source);

}  // namespace lazyfuse
