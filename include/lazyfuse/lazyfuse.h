// lazyfuse: lazy tensors whose elementwise chains run as fused kernels.
// The one header users include: #include <lazyfuse/lazyfuse.h>
#pragma once

#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/distributed.h"
#include "lazyfuse/frontend/functional.h"
#include "lazyfuse/frontend/interop.h"
#include "lazyfuse/frontend/nn.h"
#include "lazyfuse/frontend/optim.h"
#include "lazyfuse/frontend/parallel.h"
#include "lazyfuse/frontend/serialize.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/device.h"
#include "lazyfuse/ir/dtype.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cublas.h"
#include "lazyfuse/runtime/cuda_graphs.h"
#include "lazyfuse/runtime/cuda_memory.h"
#include "lazyfuse/runtime/cuda_stream.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/host_memory.h"
#include "lazyfuse/runtime/stats.h"
#include "lazyfuse/runtime/storage.h"
