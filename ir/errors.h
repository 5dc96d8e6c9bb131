// The typed errors of lazyfuse. Every message says what was wrong and where: the op, the values
// involved, and the file:line of the user's code that made them.
#pragma once

#include <stdexcept>
#include <string>

namespace lazyfuse {

// Base of every error lazyfuse raises on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Operands of one op live on different devices (raised by the placement pass).
class DeviceMismatchError : public Error {
  using Error::Error;
};
// Shapes that do not broadcast, bad dims, views that cannot be expressed.
class ShapeError : public Error {
  using Error::Error;
};
// An op applied to a dtype it does not support.
class DTypeError : public Error {
  using Error::Error;
};
// A device string that does not parse ("cuda:x", "tpu").
class DeviceStringError : public Error {
  using Error::Error;
};
// A device that does not exist on this machine ("cuda:1" with one GPU, any CUDA without one).
class DeviceIndexError : public Error {
  using Error::Error;
};
// IR text that does not parse; the message begins with "LINE:COL: ".
class ParseError : public Error {
 public:
  ParseError(const std::string& message, int line, int column)
      : Error(message), line_(line), column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_;
  int column_;
};
// A graph that breaks an IR invariant: a bug in a pass or a hand-written IR file.
class VerifierError : public Error {
  using Error::Error;
};
// A CUDA driver call failed; the message names the call and the driver's description.
class CudaError : public Error {
  using Error::Error;
};
// Device memory ran out even after the cache was emptied; the message gives the request, the
// free and total memory and what the cache held.
class OutOfMemoryError : public Error {
  using Error::Error;
};
// NVRTC rejected generated source; the message holds NVRTC's log and where the source was saved.
class CompileError : public Error {
  using Error::Error;
};
// Autograd misused: backward() from a tensor that does not require grad, twice through a
// freed graph, through a value changed in place since an op saved it; messages as PyTorch's.
class GradError : public Error {
  using Error::Error;
};
// An index outside the dim it indexes, found when an index op (gather, scatter_add) runs, since
// only then are the index's values known. The message names the op and where it was made, the
// index and the bound, as PyTorch's: "gather(): index 5 is out of bounds for dimension 1 with
// size 3". The evaluation it ends changes no tensor.
class IndexError : public Error {
  using Error::Error;
};
// A name that may not be registered, or that is not held: an empty or dotted module name, a
// name already held as another kind (a parameter's name for a buffer), a ModuleDict key that is
// missing. The message names the name, as PyTorch's KeyError does.
class KeyError : public Error {
  using Error::Error;
};
// An argument outside the values it may take, where no other type says more (PyTorch's
// ValueError): a label smoothing above 1, a negative learning rate, a parameter given to an
// optimizer twice, a scheduler's milestones out of order.
class ValueError : public Error {
  using Error::Error;
};
// Something valid that this build cannot do (for example a backend it was built without).
class UnsupportedError : public Error {
  using Error::Error;
};
// A safetensors file that cannot be read or written; the message begins with the file's path
// and says what was wrong ("model.safetensors: tensor 'w': data_offsets [0, 10] hold 10 bytes,
// dtype F32 shape [3] needs 12").
class SerializationError : public Error {
  using Error::Error;
};
// A collective or a job's rendezvous that could not complete: a process of the job left or
// never arrived, the processes disagree on a collective's dtype or shape, or it timed out. The
// message names the collective, this process's rank and the processes at fault where known
// ("all_reduce #3 (f32[4]) on rank 0 of 2: rank 1 has left the job").
class DistributedError : public Error {
  using Error::Error;
};

}  // namespace lazyfuse
