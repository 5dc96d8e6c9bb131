// The CUDA driver API, loaded with dlopen("libcuda.so.1") so that one binary runs with and
// without a GPU. Only the entry points lazyfuse uses are declared, with the driver's own
// types spelled out, so building needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lazyfuse::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

inline constexpr int kAttrMaxThreadsPerBlock = 1;
inline constexpr int kAttrMultiprocessorCount = 16;
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;
inline constexpr CUresult kErrorOutOfMemory = 2;
inline constexpr CUresult kErrorPeerAccessAlreadyEnabled = 704;
// CUstreamCaptureMode: other threads may make any call while a stream captures (evaluations are
// serialized; the caching allocator may call cuMemAlloc).
inline constexpr int kStreamCaptureModeRelaxed = 2;

// CUDA_MEMCPY2D: a copy of `Height` rows of `WidthInBytes` between pitched buffers.
inline constexpr unsigned kMemoryTypeDevice = 2;
struct CudaMemcpy2D {
  size_t srcXInBytes = 0, srcY = 0;
  unsigned srcMemoryType = kMemoryTypeDevice;
  const void* srcHost = nullptr;
  CUdeviceptr srcDevice = 0;
  void* srcArray = nullptr;
  size_t srcPitch = 0;
  size_t dstXInBytes = 0, dstY = 0;
  unsigned dstMemoryType = kMemoryTypeDevice;
  void* dstHost = nullptr;
  CUdeviceptr dstDevice = 0;
  void* dstArray = nullptr;
  size_t dstPitch = 0;
  size_t WidthInBytes = 0, Height = 0;
};

struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceCanAccessPeer)(int*, CUdevice, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuMemcpyPeer)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpy2DAsync)(const CudaMemcpy2D*, CUstream);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamGetFlags)(CUstream, unsigned*);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
};

// The loaded driver, initialised, or null when there is none (then `why_unavailable()` says
// why). Loaded once per process.
const DriverApi* driver();
std::string why_unavailable();
int driver_version();  // e.g. 13000; 0 without a driver

// Throws CudaError("<what>: <driver's message> (CUresult N)") when `result` is not success,
// OutOfMemoryError-free: callers that can recover from kErrorOutOfMemory test it themselves.
void check(CUresult result, const char* what);

// The primary context of GPU `index`, made current on the calling thread.
CUcontext activate(int index);

// The stream on which lazyfuse queues GPU `index`'s work: kernels, library calls and graph
// launches, in order. Made on first use and kept for the process; it synchronizes with the
// legacy default stream (the synchronous copies' and other libraries'), as the default stream
// did, and unlike it can be captured into a CUDA graph. Call with the device's context current.
// While a CUDAStreamGuard (runtime/cuda/cuda_stream.h) holds a user's stream for the device on this
// thread, that stream instead.
CUstream device_stream(int index);
// The user's stream a guard set for GPU `index` on this thread, or null; set_stream_override
// is the guard's (it returns what was set before).
CUstream stream_override(int index);
CUstream set_stream_override(int index, CUstream stream);

}  // namespace lazyfuse::cuda
