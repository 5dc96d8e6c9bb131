// NCCL, the collectives among GPUs, loaded at run time (dlopen of libnccl.so.2, as the driver and
// cuBLAS are) so that one binary runs with and without it. A communicator per CUDA device, made
// when the job's first collective on that device runs (every process makes it at the same
// collective, with the unique id rank 0 put in the rendezvous store). Collectives run on the
// device's current stream (runtime/cuda/cuda_stream.h), in order with lazyfuse's kernels; the host
// then waits for them within the job's timeout, and aborts the communicator if it passes, so that
// a process that died gives the others an error rather than a hang.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>

#include "lazyfuse/ir/graph.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

// Whether libnccl.so.2 loaded (with the entry points lazyfuse uses); if not, why; if so, the file.
bool nccl_available();
std::string nccl_unavailable_reason();
std::string nccl_library_path();

using NcclUniqueId = std::array<char, 128>;
NcclUniqueId nccl_unique_id();

class NcclCommunicator {
 public:
  // This process's communicator on CUDA device `device`: a collective call, every rank at once.
  NcclCommunicator(int device, int rank, int world_size, const NcclUniqueId& id,
                   std::chrono::milliseconds timeout);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Collective `node` (ir/ops.def) of `input` (dense, on the device) into `out` (node's shape).
  // Throws DistributedError, having aborted the communicator, if it fails or does not finish
  // within the timeout.
  void run(const Node& node, const BufferView& input, const BufferView& out);

 private:
  void wait(const char* what);

  int device_, rank_, world_size_;
  std::chrono::milliseconds timeout_;
  void* comm_ = nullptr;
};

}  // namespace lazyfuse
