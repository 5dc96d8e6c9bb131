// Many processes, one job: lazyfuse::distributed, after torch.distributed and MLX's
// mx.distributed. init() meets the job's other processes; the collectives are lazy ops like any
// other (ir/ops.def's Collective ops): each is a node on its tensor's device that fuses with
// nothing, runs where its value is needed, and has its gradient, so a data-parallel training
// step is still one evaluation. They return their result, as MLX's and PyTorch's functional
// collectives do, rather than overwrite their operand.
//
// Every process must evaluate the same collectives in the same order: a value that only one
// process reads (a loss printed by rank 0 alone) must not be the only reader of a collective.
// Processes that disagree get a DistributedError naming both sides; a process that dies or never
// arrives gives the others a DistributedError naming it within the timeout.
//
// Engines: Gloo over TCP for CPU tensors, NCCL (loaded at run time) for CUDA tensors.
// A job starts with `lazyfuse launch --nproc=N PROGRAM ARGS...`, `torchrun --nproc-per-node=N
// PROGRAM ARGS...` or `mpirun -n N PROGRAM ARGS...`; init() reads what each of them sets.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse::distributed {

using lazyfuse::ReduceOp;

struct InitOptions {
  // Empty (the default): NCCL for CUDA tensors where libnccl.so.2 loads, else Gloo on a copy in
  // host memory; Gloo for CPU tensors. "gloo": Gloo for every tensor. "nccl": NCCL for CUDA
  // tensors, an UnsupportedError if it does not load.
  std::string backend;
  // How long the rendezvous and each collective wait for the other processes.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Unset: from the environment. torchrun's and `lazyfuse launch`'s RANK, WORLD_SIZE, LOCAL_RANK,
  // MASTER_ADDR and MASTER_PORT; else Open MPI's OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE and
  // OMPI_COMM_WORLD_LOCAL_RANK (with MASTER_ADDR and MASTER_PORT, default 127.0.0.1:29500);
  // else a job of one process. Rank 0 serves the rendezvous on MASTER_PORT, or on
  // LAZYFUSE_STORE_PORT where set; under torchrun, whose agent serves its own store on
  // MASTER_PORT, on MASTER_PORT + 1.
  std::optional<int> rank, world_size, local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

// Meets the job's other processes; DistributedError if some do not arrive within the timeout,
// or if the job is already initialized.
void init(const InitOptions& options = {});
bool is_initialized();
// This process's rank, the number of processes, and the rank among this machine's processes:
// 0, 1 and 0 before init().
int rank();
int world_size();
int local_rank();
// Returns when every process has called it.
void barrier();
// Leaves the job's process group (after a barrier, so that no process is still waiting on this
// one); init() may be called again.
void destroy_process_group();

// On every process, `op` over the processes' `tensor`.
Tensor all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::SUM, Loc where = Loc::current());
// The processes' tensors one after another along `dim`, in rank order.
Tensor all_gather(const Tensor& tensor, int64_t dim = 0, Loc where = Loc::current());
// `op` over the processes' tensors, split into world_size() equal parts along `dim`: process r
// gets part r.
Tensor reduce_scatter(const Tensor& tensor, ReduceOp op = ReduceOp::SUM, int64_t dim = 0,
                      Loc where = Loc::current());
// Process `root`'s tensor, on every process.
Tensor broadcast(const Tensor& tensor, int root = 0, Loc where = Loc::current());

// Point to point, run at the call (as torch.distributed's): send evaluates `tensor` and returns
// once process `dst` has it; recv returns what process `src` sends, which must have the dtype
// and shape asked for (else DistributedError). No gradients flow through them.
void send(const Tensor& tensor, int dst, Loc where = Loc::current());
Tensor recv(Shape shape, TensorOptions options, int src, Loc where = Loc::current());
// LibTorch's form: fills `tensor` (its dtype, shape and device) with what `src` sends.
void recv(Tensor& tensor, int src, Loc where = Loc::current());

// Which samples of a dataset of `size` this process takes in an epoch, as
// torch.utils.data.DistributedSampler: with shuffle, one permutation of all samples per
// (seed, epoch), the same on every process; padded by repeating its start (or, with drop_last,
// cut) so that every process gets the same count; process r takes every world_size-th from r.
class DistributedSampler {
 public:
  explicit DistributedSampler(int64_t size, std::optional<int> num_replicas = std::nullopt,
                              std::optional<int> rank = std::nullopt, bool shuffle = true,
                              uint64_t seed = 0, bool drop_last = false);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }

 private:
  int64_t size_;
  int num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace lazyfuse::distributed
