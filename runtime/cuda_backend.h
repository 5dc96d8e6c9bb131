// The CUDA backend (runtime/backend.h): generated kernels (elementwise, reductions with what
// is fused around them, row kernels) compiled by NVRTC on first use, cuBLAS matmul, device
// memory through the caching allocator, and copies between the host and GPUs.
#pragma once

#include "runtime/storage.h"

namespace lazyfuse {

// A contiguous copy of `source` (any strides, broadcast included) on its GPU.
BufferView cuda_contiguous(const BufferView& source);

}  // namespace lazyfuse
