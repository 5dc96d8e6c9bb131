// NVRTC, loaded with dlopen so that builds and binaries without the CUDA toolkit still work:
// generated CUDA source to a cubin for one GPU architecture (PTX only when NVRTC does not know
// the architecture, since loading PTX makes the driver compile it: ~125 ms against ~0.1 ms).
#pragma once

#include <string>
#include <vector>

namespace lazyfuse {

struct CompiledKernel {
  std::string name;
  std::string arch;  // "sm_90", or "compute_90" for PTX
  bool is_cubin = true;
  std::vector<char> image;  // what cuModuleLoadData takes (PTX is NUL-terminated)
  double compile_ms = 0;
};

bool nvrtc_available();
std::string nvrtc_unavailable_reason();
std::string nvrtc_version();  // "13.0"

// Changes whenever the options nvrtc_compile passes change: part of every disk cache key, so a
// cubin compiled otherwise is never loaded.
inline constexpr int kNvrtcOptionsVersion = 2;

// Compiles `source`, which defines extern "C" kernel `name`, for compute capability
// major.minor. Throws CompileError with NVRTC's log and the path where the source was saved.
CompiledKernel nvrtc_compile(const std::string& source, const std::string& name, int major,
                             int minor);

}  // namespace lazyfuse
