// lazyfuse: lazy tensors whose elementwise chains run as fused kernels.
// The one header users include: #include <lazyfuse/lazyfuse.h>
#pragma once

#include "frontend/autograd.h"
#include "frontend/functional.h"
#include "frontend/interop.h"
#include "frontend/nn.h"
#include "frontend/optim.h"
#include "frontend/serialize.h"
#include "frontend/tensor.h"
#include "ir/device.h"
#include "ir/dtype.h"
#include "ir/errors.h"
#include "runtime/cublas.h"
#include "runtime/cuda_graphs.h"
#include "runtime/cuda_memory.h"
#include "runtime/devices.h"
#include "runtime/host_memory.h"
#include "runtime/stats.h"
#include "runtime/storage.h"
