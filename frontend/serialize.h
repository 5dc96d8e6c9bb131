// Saving and loading tensors in the safetensors format
// (https://github.com/huggingface/safetensors), which PyTorch reads and writes with
// safetensors.torch.save_file / load_file:
//
//   8 bytes    N, the header's length, little-endian
//   N bytes    JSON: {"name": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}, ...,
//              "__metadata__": {"key": "value"}} (optional), padded with spaces
//   the rest   every tensor's bytes, little-endian, row-major, back to back
//
// lazyfuse's dtypes are BOOL, I32, I64, F16, BF16, F32 and F64; a file holding another
// safetensors dtype (U8, I8, F8_E4M3, ...) is a SerializationError naming the tensor.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lazyfuse/frontend/nn.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/device.h"

namespace lazyfuse {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Evaluates the tensors (one evaluation), copies those on a GPU to the host, and writes their
// values to `path`: a view is saved as the values it shows, contiguous. The layout is the one
// safetensors itself writes (widest dtype first, then by name; the header padded to 8 bytes),
// so every tensor's data is aligned to its element size and the file is byte for byte what
// safetensors.torch.save_file writes for the same tensors and metadata. The file is written
// beside `path` under a temporary name and renamed over it, so a save that fails leaves any
// previous file as it was and no partial one. Throws SerializationError for a duplicate or
// reserved name ("__metadata__"), an undefined tensor, names or metadata that are not UTF-8, or
// a file that cannot be written.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The bytes save_safetensors writes to a file.
std::string save_safetensors_to_memory(const NamedTensors& tensors,
                                       const std::map<std::string, std::string>& metadata = {});

// Reads a safetensors file: the tensors in the order of their data in the file, each a computed
// tensor holding exactly the file's bytes, on `device` (made on the CPU and copied there), whose
// origin in messages is `where`. The
// header is checked as the format asks before any tensor is made: its length within the file
// (and at most 100 MB), a JSON object in UTF-8 without duplicate keys, known dtypes, sizes that
// do not overflow, data_offsets that cover the data exactly in order and that hold
// numel * itemsize bytes each; a BOOL byte must be 0 or 1. Anything else is a
// SerializationError, and nothing is returned.
NamedTensors load_safetensors(const std::string& path, Device device = Device::cpu(),
                              Loc where = Loc::current());

// The same for a file's bytes already in memory; `source` names them in messages.
NamedTensors load_safetensors_from_memory(std::string_view bytes, Device device = Device::cpu(),
                                          const std::string& source = "<memory>",
                                          Loc where = Loc::current());

// A file's "__metadata__" (empty when it has none), read from the header alone.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

// A module's state: its parameters and buffers under named_parameters()'s and
// named_buffers()'s names ("0.weight", "attn.mask"), what torch.nn.Module.state_dict() holds
// for the same architecture, so PyTorch's load_state_dict reads the file and this reads
// PyTorch's. A tensor held under several names (a tied weight) is written once, under its
// first name, as safetensors' save_model writes a tied model (save_file refuses shared tensors).
void save_safetensors(const std::string& path, const nn::Module& module,
                      const std::map<std::string, std::string>& metadata = {});
// Sets every parameter and buffer of `module` from `path`, as load_state_dict(strict=True):
// each must be in the file with its shape, and the file must hold nothing else; a tied tensor is
// read from any one of its names (the first the file holds), as safetensors' load_model does.
// Values are converted to each tensor's dtype and device. The tensors stay the same tensors (an
// optimizer holding them sees the new values). Anything amiss is a SerializationError naming
// the file and the keys, and then nothing has changed.
void load_safetensors(nn::Module& module, const std::string& path);

}  // namespace lazyfuse
