// Generating CUDA source for the index steps: gather, scatter_add's lines, and the strided
// copies cat is made of. Each kernel is specialised on its dtypes and its operands' rank alone
// (sizes and strides are words: codegen/cuda/cuda_kernel_args.h), so one kernel serves every size.
//
// Note [Index errors on the GPU]
// A kernel that meets an index outside [0, bound) stores nothing for it and lowers the device's
// error slot (one unsigned 64-bit word, all ones when clear) to the index's row-major position
// with atomicMin. The runtime reads the slot after the kernel, and when it is set, reads the
// index there, clears the slot and raises the CPU's IndexError (runtime/cpu/cpu_index.cc): the
// smallest position wins on both devices, so both name the same index. Reading the slot waits
// for the kernel: an index step costs a synchronisation.
//
// Note [scatter_add on the GPU]
// One thread per line of the index (its positions that differ only along dim), adding in index
// order, as the CPU does (Note [Deterministic scatter_add] in runtime/cpu/cpu_index.cc): lines
// write disjoint parts of the result, so there are no atomics, and the result has the CPU's
// bits. Its parallelism is the number of lines; each line's additions are serial.
#include <string>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/gpu_dialect.h"

namespace lazyfuse {
namespace {

const char* type_name(DType dtype) { return cuda_emit::storage_type_name(dtype); }

// An unsigned type of `bytes` bytes: gather moves elements as bits.
const char* bits_type(int bytes) {
  switch (bytes) {
    case 1:
      return "unsigned char";
    case 2:
      return "unsigned short";
    case 4:
      return "unsigned int";
    default:
      return "unsigned long long";
  }
}

// The start of an index kernel: the prologue, the struct of its words and the signature, with
// a grid-stride loop over `count` as `i`.
std::string begin_kernel(const std::string& name, const ArgLayout& layout, const char* comment,
                         const char* count) {
  return absl::StrCat(gpu_dialect().prologue(), "\n// ", comment, "\n", layout.declare("IndexArgs"),
                      "\n", gpu_dialect().kernel(name, kCudaIndexThreads),
                      "(const IndexArgs args) {\n",
                      "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ",
                      count, ";\n       i += (long long)gridDim.x * blockDim.x) {\n");
}

// a + b in dtype's arithmetic, as the CPU's scatter_add adds (add_values in
// runtime/cpu/cpu_index.cc): in the compute type, rounded to the dtype; integers wrap, bools or.
std::string add_expression(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return "(a || b)";
    case DType::Int32:
    case DType::Int64:
      return absl::StrCat("(", type_name(dtype),
                          ")((unsigned long long)a + (unsigned long long)b)");
    case DType::Float16:
    case DType::BFloat16:
      return absl::StrCat("lf_store<", type_name(dtype), ">(lf_load(a) + lf_load(b))");
    default:
      return "a + b";
  }
}

}  // namespace

std::string cuda_gather_kernel_name(int element_bytes, int rank) {
  return absl::StrCat("i_gather_b", element_bytes, "_r", rank);
}

CudaSource generate_cuda_gather(int element_bytes, int rank) {
  CudaSource source;
  source.kernel_name = cuda_gather_kernel_name(element_bytes, rank);
  const char* t = bits_type(element_bytes);
  source.source = absl::StrCat(
      begin_kernel(source.kernel_name, gather_arg_layout(rank),
                   "gather: out[i] = x at i's coordinates, moved along dim to index[i]", "args.n"),
      "    long long rest = i, x_at = 0, index_at = 0;\n", "#pragma unroll\n",
      "    for (int d = ", rank - 1, "; d >= 0; --d) {\n",
      "      const long long c = rest % args.size[d];\n", "      rest /= args.size[d];\n",
      "      if (d != args.dim) x_at += c * args.x_stride[d];\n",
      "      index_at += c * args.index_stride[d];\n", "    }\n",
      "    const long long k = ((const long long*)args.index)[index_at];\n",
      "    if (k < 0 || k >= args.bound) {\n",
      "      atomicMin(args.error, (unsigned long long)i);\n", "      continue;\n", "    }\n",
      "    ((", t, "*)args.out)[i] = ((const ", t,
      "*)args.x)[x_at + k * args.x_stride[args.dim]];\n", "  }\n}\n");
  return source;
}

std::string cuda_scatter_add_kernel_name(DType dtype, int rank) {
  return absl::StrCat("i_scatter_add_", dtype_ir_name(dtype), "_r", rank);
}

CudaSource generate_cuda_scatter_add(DType dtype, int rank) {
  CudaSource source;
  source.kernel_name = cuda_scatter_add_kernel_name(dtype, rank);
  const char* t = type_name(dtype);
  source.source = absl::StrCat(
      begin_kernel(source.kernel_name, scatter_add_arg_layout(rank),
                   "scatter_add: each thread adds one line of src into out, in index order",
                   "args.lines"),
      // The line's offsets, and its row-major position in the index (at coordinate 0 along dim)
      // for an error; dim_span is the position's step along dim.
      "    long long rest = i, span = 1, position = 0, dim_span = 1;\n",
      "    long long index_at = 0, src_at = 0, out_at = 0;\n", "#pragma unroll\n",
      "    for (int d = ", rank - 1, "; d >= 0; --d) {\n", "      if (d == args.dim) {\n",
      "        dim_span = span;\n", "        span *= args.size[d];\n", "        continue;\n",
      "      }\n", "      const long long c = rest % args.size[d];\n",
      "      rest /= args.size[d];\n", "      position += c * span;\n",
      "      span *= args.size[d];\n", "      index_at += c * args.index_stride[d];\n",
      "      src_at += c * args.src_stride[d];\n", "      out_at += c * args.out_stride[d];\n",
      "    }\n", "    const long long* index = (const long long*)args.index + index_at;\n",
      "    const ", t, "* src = (const ", t, "*)args.src + src_at;\n", "    ", t, "* out = (", t,
      "*)args.out + out_at;\n", "    for (long long j = 0; j < args.length; ++j) {\n",
      "      const long long k = index[j * args.index_stride[args.dim]];\n",
      "      if (k < 0 || k >= args.bound) {\n",
      "        atomicMin(args.error, (unsigned long long)(position + j * dim_span));\n",
      "        break;\n", "      }\n", "      const ", t,
      " a = out[k * args.out_stride[args.dim]];\n", "      const ", t,
      " b = src[j * args.src_stride[args.dim]];\n",
      "      out[k * args.out_stride[args.dim]] = ", add_expression(dtype), ";\n", "    }\n",
      "  }\n}\n");
  return source;
}

std::string cuda_strided_copy_kernel_name(DType from, DType to, int rank) {
  return absl::StrCat("i_copy_", dtype_ir_name(from), "_", dtype_ir_name(to), "_r", rank);
}

CudaSource generate_cuda_strided_copy(DType from, DType to, int rank) {
  CudaSource source;
  source.kernel_name = cuda_strided_copy_kernel_name(from, to, rank);
  source.source = absl::StrCat(
      begin_kernel(source.kernel_name, strided_copy_arg_layout(rank),
                   "a strided copy, converted as a cast converts (cat's operands)", "args.n"),
      "    long long rest = i, in_at = 0, out_at = 0;\n", "#pragma unroll\n",
      "    for (int d = ", rank - 1, "; d >= 0; --d) {\n",
      "      const long long c = rest % args.size[d];\n", "      rest /= args.size[d];\n",
      "      in_at += c * args.in_stride[d];\n", "      out_at += c * args.out_stride[d];\n",
      "    }\n", "    ((", type_name(to), "*)args.out)[out_at] = lf_store<", type_name(to), ">((",
      cuda_emit::storage_type_name(compute_dtype(to)), ")lf_load(((const ", type_name(from),
      "*)args.in)[in_at]));\n", "  }\n}\n");
  return source;
}

}  // namespace lazyfuse
