// A job's processes as the runtime sees them: the process group that runs collective steps
// (ir/ops.def's Collective ops) and the point-to-point sends and receives. Its engines are the
// ones the field trusts, never a layer of lazyfuse's own: Gloo over TCP for CPU tensors, NCCL
// (loaded at run time, runtime/distributed/nccl.h) for CUDA tensors. Process 0 serves the
// rendezvous (runtime/distributed/tcp_store.h).
//
// Before every collective the processes exchange what each is about to run (which collective,
// how many it has run, dtype, shape, root), so that processes that disagree get a
// DistributedError naming both sides rather than exchanging the wrong bytes. A collective that
// fails (a process left, or the timeout passed) throws DistributedError naming the collective
// and the processes at fault; the group is then broken, and every later collective throws at
// once until the job makes a new one. Tensors are untouched by a failure. Making a group ignores
// SIGPIPE where the program left it at its default (Gloo's writes to a dead peer would raise it).
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "lazyfuse/ir/graph.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

struct ProcessGroupOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // "gloo": every tensor through Gloo (CUDA tensors staged through the host); "nccl": CUDA
  // tensors through NCCL (an error if it does not load); empty: NCCL for CUDA tensors where it
  // loads, else Gloo.
  std::string backend;
  // How long a rendezvous or a collective waits for the other processes before it throws.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

class ProcessGroup {
 public:
  // Meets the other processes (blocks until all arrive, or throws DistributedError naming those
  // that did not within the timeout) and connects Gloo among them.
  static std::shared_ptr<ProcessGroup> create(const ProcessGroupOptions& options);
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Runs collective `node` (ir/ops.def) on `input`, dense on the node's device; returns the
  // node's value, a new buffer on that device.
  virtual BufferView run_collective(const Node& node, const BufferView& input) = 0;
  // The same, after every collective started before it: on the group's communication thread
  // when `in_background` and the tensor is on the CPU, so that the caller's work goes on
  // meanwhile (Note [Overlapped collectives] in runtime/executor.cc); else on the calling thread
  // once those are done (the future is then ready). A CUDA collective runs on the caller's stream.
  virtual std::future<BufferView> start_collective(Node node, BufferView input,
                                                   bool in_background) = 0;
  virtual void barrier() = 0;
  // Point to point: `input` (dense) to process `dst`; a buffer of `dtype` and `shape` on `device`
  // from `src`. A sender's dtype or shape that differs from the receiver's is a DistributedError
  // on the receiver.
  virtual void send(const BufferView& input, int dst) = 0;
  virtual BufferView recv(DType dtype, const Shape& shape, const Device& device, int src) = 0;
};

// The job's group, once frontend/distributed.h's init() made it; null before and after.
std::shared_ptr<ProcessGroup> default_process_group();
void set_default_process_group(std::shared_ptr<ProcessGroup> group);

// The executor's entry for a Collective step: the default group starts it (DistributedError if
// there is none).
std::future<BufferView> start_collective_step(const Node& node, const BufferView& input,
                                              bool in_background);

}  // namespace lazyfuse
