// The calling convention of generated CUDA kernels: layouts and the packing of their words.
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"

namespace lazyfuse {
namespace {

const char* cuda_type(ArgType type) {
  switch (type) {
    case ArgType::Int64:
      return "long long";
    case ArgType::Double:
      return "double";
    case ArgType::Pointer:
      return "void*";
    case ArgType::ConstPointer:
      return "const void*";
    case ArgType::Counters:
      return "unsigned int*";
    case ArgType::ErrorSlot:
      return "unsigned long long*";
  }
  return "?";
}

}  // namespace

ArgLayout& ArgLayout::add(std::string_view name, ArgType type) {
  fields_.push_back({std::string(name), type, 0, 1, 1});
  return *this;
}
ArgLayout& ArgLayout::add_array(std::string_view name, ArgType type, int count) {
  fields_.push_back({std::string(name), type, 1, count, 1});
  return *this;
}
ArgLayout& ArgLayout::add_matrix(std::string_view name, ArgType type, int rows, int columns) {
  fields_.push_back({std::string(name), type, 2, rows, columns});
  return *this;
}

std::string ArgLayout::declare(std::string_view struct_name) const {
  std::string s = absl::StrCat("struct ", std::string(struct_name), " {\n");
  for (const Field& f : fields_) {
    if (f.words() == 0) continue;
    absl::StrAppend(&s, "  ", cuda_type(f.type), " ", f.name);
    if (f.dims >= 1) absl::StrAppend(&s, "[", f.rows, "]");
    if (f.dims == 2) absl::StrAppend(&s, "[", f.columns, "]");
    s += ";\n";
  }
  return s + "};\n";
}

int ArgLayout::words() const {
  int total = 0;
  for (const Field& f : fields_) total += f.words();
  return total;
}

int ArgLayout::offset(std::string_view name) const {
  int at = 0;
  for (const Field& f : fields_) {
    if (f.name == name) return at;
    at += f.words();
  }
  return -1;
}

void add_space_fields(ArgLayout& layout, const CudaElementwiseSpec& spec, int inputs) {
  layout.add_array("size", ArgType::Int64, spec.rank)
      .add_array("in", ArgType::ConstPointer, inputs)
      .add_matrix("stride", ArgType::Int64, inputs, spec.rank);
}

void append_space_args(const CudaElementwiseLaunch& launch,
                       std::span<const uint64_t> input_addresses, KernelArgs& words) {
  for (int d = 0; d < launch.spec.rank; ++d)
    words.push_back(static_cast<uint64_t>(launch.sizes[d]));
  for (uint64_t a : input_addresses) words.push_back(a);
  for (const Strides& s : launch.strides)
    for (int d = 0; d < launch.spec.rank; ++d) words.push_back(static_cast<uint64_t>(s[d]));
}

ArgLayout elementwise_arg_layout(const CudaElementwiseSpec& spec, int inputs, int outputs) {
  ArgLayout layout;
  layout.add("n", ArgType::Int64);
  add_space_fields(layout, spec, inputs);
  layout.add_array("out", ArgType::Pointer, outputs);
  return layout;
}

KernelArgs pack_elementwise_args(const CudaElementwiseLaunch& launch,
                                 std::span<const uint64_t> input_addresses,
                                 std::span<const uint64_t> output_addresses) {
  KernelArgs words;
  words.reserve(1 + launch.spec.rank * (1 + input_addresses.size()) + input_addresses.size() +
                output_addresses.size());
  words.push_back(static_cast<uint64_t>(launch.numel));
  append_space_args(launch, input_addresses, words);
  words.insert(words.end(), output_addresses.begin(), output_addresses.end());
  return words;
}

namespace {

// A reduction's fields after its output pointers, and their words.
void add_reduction_fields_after_out(ArgLayout& layout) {
  layout.add("rows", ArgType::Int64)
      .add("columns", ArgType::Int64)
      .add("chunk", ArgType::Int64)
      .add("chunks", ArgType::Int64)
      .add("divisor", ArgType::Double)
      .add("partial", ArgType::Pointer)
      .add("counters", ArgType::Counters);
}
void append_reduction_args_after_out(const ReductionWords& reduction, KernelArgs& words) {
  for (int64_t word : {reduction.rows, reduction.columns, reduction.chunk, reduction.chunks})
    words.push_back(static_cast<uint64_t>(word));
  words.push_back(std::bit_cast<uint64_t>(reduction.divisor));
  words.push_back(reduction.partial);
  words.push_back(reduction.counters);
}

}  // namespace

void add_reduction_fields(ArgLayout& layout) {
  layout.add("out", ArgType::Pointer);
  add_reduction_fields_after_out(layout);
}

void append_reduction_args(const ReductionWords& reduction, KernelArgs& words) {
  words.push_back(reduction.out);
  append_reduction_args_after_out(reduction, words);
}

ArgLayout plain_reduction_arg_layout() {
  ArgLayout layout;
  layout.add("in", ArgType::ConstPointer);
  add_reduction_fields(layout);
  return layout;
}

ArgLayout column_reduction_arg_layout() {
  ArgLayout layout;
  layout.add("in", ArgType::ConstPointer).add("stride", ArgType::Int64);
  add_reduction_fields(layout);
  return layout;
}

KernelArgs pack_column_reduction_args(uint64_t in, int64_t stride,
                                      const ReductionWords& reduction) {
  KernelArgs words = {in, static_cast<uint64_t>(stride)};
  append_reduction_args(reduction, words);
  return words;
}

void add_column_step_fields(ArgLayout& layout, int outputs) {
  layout.add_array("out", ArgType::Pointer, outputs);
  add_reduction_fields_after_out(layout);
}

void append_column_step_args(std::span<const uint64_t> output_addresses,
                             const ReductionWords& reduction, KernelArgs& words) {
  words.insert(words.end(), output_addresses.begin(), output_addresses.end());
  append_reduction_args_after_out(reduction, words);
}

void add_row_fields(ArgLayout& layout, int outputs) {
  layout.add_array("out", ArgType::Pointer, outputs)
      .add("rows", ArgType::Int64)
      .add("columns", ArgType::Int64)
      .add("divisor", ArgType::Double);
}

void append_row_args(std::span<const uint64_t> output_addresses, int64_t rows, int64_t columns,
                     KernelArgs& words) {
  words.insert(words.end(), output_addresses.begin(), output_addresses.end());
  words.push_back(static_cast<uint64_t>(rows));
  words.push_back(static_cast<uint64_t>(columns));
  words.push_back(std::bit_cast<uint64_t>(static_cast<double>(columns)));
}

namespace {
void append_all(std::span<const int64_t> values, KernelArgs& words) {
  for (int64_t v : values) words.push_back(static_cast<uint64_t>(v));
}
}  // namespace

ArgLayout gather_arg_layout(int rank) {
  ArgLayout layout;
  layout.add("n", ArgType::Int64)
      .add("dim", ArgType::Int64)
      .add("bound", ArgType::Int64)
      .add("x", ArgType::ConstPointer)
      .add("index", ArgType::ConstPointer)
      .add("out", ArgType::Pointer)
      .add("error", ArgType::ErrorSlot)
      .add_array("size", ArgType::Int64, rank)
      .add_array("x_stride", ArgType::Int64, rank)
      .add_array("index_stride", ArgType::Int64, rank);
  return layout;
}

KernelArgs pack_gather_args(const GatherWords& gather) {
  KernelArgs words;
  append_all(std::initializer_list<int64_t>{gather.n, gather.dim, gather.bound}, words);
  for (uint64_t a : {gather.x, gather.index, gather.out, gather.error}) words.push_back(a);
  append_all(gather.sizes, words);
  append_all(gather.x_strides, words);
  append_all(gather.index_strides, words);
  return words;
}

ArgLayout scatter_add_arg_layout(int rank) {
  ArgLayout layout;
  layout.add("lines", ArgType::Int64)
      .add("length", ArgType::Int64)
      .add("dim", ArgType::Int64)
      .add("bound", ArgType::Int64)
      .add("index", ArgType::ConstPointer)
      .add("src", ArgType::ConstPointer)
      .add("out", ArgType::Pointer)
      .add("error", ArgType::ErrorSlot)
      .add_array("size", ArgType::Int64, rank)
      .add_array("index_stride", ArgType::Int64, rank)
      .add_array("src_stride", ArgType::Int64, rank)
      .add_array("out_stride", ArgType::Int64, rank);
  return layout;
}

KernelArgs pack_scatter_add_args(const ScatterAddWords& scatter) {
  KernelArgs words;
  append_all(
      std::initializer_list<int64_t>{scatter.lines, scatter.length, scatter.dim, scatter.bound},
      words);
  for (uint64_t a : {scatter.index, scatter.src, scatter.out, scatter.error}) words.push_back(a);
  append_all(scatter.sizes, words);
  append_all(scatter.index_strides, words);
  append_all(scatter.src_strides, words);
  append_all(scatter.out_strides, words);
  return words;
}

ArgLayout strided_copy_arg_layout(int rank) {
  ArgLayout layout;
  layout.add("n", ArgType::Int64)
      .add("in", ArgType::ConstPointer)
      .add("out", ArgType::Pointer)
      .add_array("size", ArgType::Int64, rank)
      .add_array("in_stride", ArgType::Int64, rank)
      .add_array("out_stride", ArgType::Int64, rank);
  return layout;
}

KernelArgs pack_strided_copy_args(const StridedCopyWords& copy) {
  KernelArgs words;
  words.push_back(static_cast<uint64_t>(copy.n));
  words.push_back(copy.in);
  words.push_back(copy.out);
  append_all(copy.sizes, words);
  append_all(copy.in_strides, words);
  append_all(copy.out_strides, words);
  return words;
}

ArgLayout skinny_matmul_arg_layout() {
  ArgLayout layout;
  layout.add("a", ArgType::ConstPointer)
      .add("b", ArgType::ConstPointer)
      .add("bias", ArgType::ConstPointer)
      .add("c", ArgType::Pointer)
      .add("lda", ArgType::Int64)
      .add("ldb", ArgType::Int64)
      .add("inner", ArgType::Int64)
      .add("cols", ArgType::Int64);
  return layout;
}

KernelArgs pack_skinny_matmul_args(const SkinnyMatmulWords& product) {
  KernelArgs words;
  for (uint64_t address : {product.a, product.b, product.bias, product.c}) words.push_back(address);
  append_all(std::initializer_list<int64_t>{product.lda, product.ldb, product.inner, product.cols},
             words);
  return words;
}

}  // namespace lazyfuse
