// Memory in and out (frontend/interop.h): from_blob over the caller's memory, data_ptr and the
// layout accessors, and DLPack tensors handed to a consumer and back, each without a copy, each
// owner's deleter called exactly once.
#include <dlpack/dlpack.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "lazyfuse/lazyfuse.h"

namespace lazyfuse {
namespace {

// A reader of DLPack tensors written from the protocol alone, as another library would: the sum
// of a float32 tensor's elements through its shape, strides and byte offset.
double sum_of_dlpack_floats(const DLTensor& t) {
  EXPECT_EQ(t.dtype.code, kDLFloat);
  EXPECT_EQ(t.dtype.bits, 32);
  const auto* base =
      reinterpret_cast<const float*>(static_cast<const char*>(t.data) + t.byte_offset);
  int64_t count = 1;
  for (int d = 0; d < t.ndim; ++d) count *= t.shape[d];
  double total = 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0, rest = i, compact = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      const int64_t stride = t.strides != nullptr ? t.strides[d] : compact;
      offset += rest % t.shape[d] * stride;
      rest /= t.shape[d];
      compact *= t.shape[d];
    }
    total += base[offset];
  }
  return total;
}

TEST(Interop, FromBlobReadsTheCallersMemoryAndCallsTheDeleterOnce) {
  float* data = new float[6]{1, 2, 3, 4, 5, 6};
  int deleted = 0;
  {
    Tensor t = from_blob(data, {2, 3}, [&](void* p) {
      ++deleted;
      delete[] static_cast<float*>(p);
    });
    EXPECT_TRUE(t.is_computed());
    EXPECT_EQ(t.data_ptr<float>(), data) << "no copy";
    Tensor column_sums = t.sum({0});
    Tensor transposed = t.t();  // a view: keeps the memory alive after t goes
    t = Tensor();
    EXPECT_EQ(column_sums.to_vector<float>(), (std::vector<float>{5, 7, 9}));
    EXPECT_EQ(deleted, 0);
    EXPECT_EQ(transposed.contiguous().to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
    EXPECT_EQ(deleted, 0) << "a view still uses the memory";
  }
  EXPECT_EQ(deleted, 1);
}

TEST(Interop, FromBlobTakesStridesAndOptions) {
  // A 3x2 column-major view of a row-major 2x3 block, as float64.
  std::vector<double> data = {1, 2, 3, 4, 5, 6};
  Tensor t = from_blob(data.data(), {3, 2}, {1, 3}, kFloat64);
  EXPECT_EQ(t.dtype(), kFloat64);
  EXPECT_EQ(t.strides(), (Strides{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ((t * 2).sum().item<double>(), 42);
  // requires_grad as the options say: the gradient of a sum is ones.
  std::vector<float> weights = {0.5f, -1.0f};
  Tensor w = from_blob(weights.data(), {2}, TensorOptions().requires_grad(true));
  (w * w).sum().backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
}

TEST(Interop, InPlaceUpdatesLeaveTheCallersMemoryAlone) {
  std::vector<float> data = {1, 2, 3};
  Tensor t = from_blob(data.data(), {3});
  t.add_(10);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{11, 12, 13}));
  EXPECT_EQ(data, (std::vector<float>{1, 2, 3}));
}

TEST(Interop, FromBlobRejectsBadLayoutsAndStillCallsTheDeleter) {
  std::vector<float> data(4);
  int deleted = 0;
  auto count = [&](void*) { ++deleted; };
  EXPECT_THROW(from_blob(data.data(), {2, 2}, {1}, count), ShapeError);
  EXPECT_EQ(deleted, 1);
  EXPECT_THROW(from_blob(data.data(), {2, 2}, {2, -1}, count), ShapeError);
  EXPECT_EQ(deleted, 2);
  EXPECT_THROW(from_blob(nullptr, {2}), Error);
  try {
    from_blob(data.data(), {2, 2}, {1});
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("1 strides for 2 dims"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("interop_test.cc"), std::string::npos) << e.what();
  }
}

TEST(Interop, LayoutAccessorsAndDataPtr) {
  Tensor t = arange(12, kFloat64).reshape({3, 4});
  EXPECT_EQ(t.strides(), (Strides{4, 1}));
  EXPECT_EQ(t.stride(-2), 4);
  EXPECT_EQ(t.element_size(), 8);
  EXPECT_EQ(t.nbytes(), 96);
  Tensor column = t.narrow(1, 1, 1);  // a view whose first element is past the storage's start
  EXPECT_EQ(column.strides(), (Strides{4, 1}));
  EXPECT_EQ(*column.data_ptr<double>(), 1.0);
  EXPECT_EQ(column.data_ptr<double>()[4], 5.0);
  Tensor pending = t * 2;
  EXPECT_FALSE(pending.is_computed());
  EXPECT_EQ(pending.data_ptr<double>()[11], 22.0);  // computed first
  EXPECT_THROW(t.data_ptr<float>(), DTypeError);
  EXPECT_EQ(ones({2}, kInt32).data_ptr<int32_t>()[1], 1);
}

// The DLPack deleter of a producer other than lazyfuse: counts its calls.
int producer_deletions = 0;
struct Producer {
  std::vector<float> values;
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};
DLManagedTensor* produce(std::vector<float> values, std::vector<int64_t> shape, DLDataType type,
                         uint64_t byte_offset = 0) {
  auto* producer = new Producer{std::move(values), std::move(shape)};
  DLTensor& t = producer->managed.dl_tensor;
  t.data = producer->values.data();
  t.byte_offset = byte_offset;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(producer->shape.size());
  t.dtype = type;
  t.shape = producer->shape.data();
  t.strides = nullptr;  // compact, row-major
  producer->managed.manager_ctx = producer;
  producer->managed.deleter = [](DLManagedTensor* self) {
    ++producer_deletions;
    delete static_cast<Producer*>(self->manager_ctx);
  };
  return &producer->managed;
}

TEST(Interop, DlpackRoundTripThroughASecondConsumer) {
  Tensor t = arange(12, kFloat32).reshape({3, 4}).t();  // a strided view
  DLManagedTensor* lent = to_dlpack(t);
  const DLTensor& dl = lent->dl_tensor;
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.shape[0], 4);
  EXPECT_EQ(dl.shape[1], 3);
  EXPECT_EQ(dl.strides[0], 1);
  EXPECT_EQ(dl.strides[1], 4);
  EXPECT_EQ(static_cast<char*>(dl.data) + dl.byte_offset, t.data_ptr()) << "no copy";
  // The consumer reads it; lazyfuse's tensors may go first: the memory stays until the deleter.
  const void* memory = t.data_ptr();
  t = Tensor();
  EXPECT_EQ(sum_of_dlpack_floats(dl), 66.0);
  // And hands it back: the same memory, the same values, lent's deleter once when it goes.
  Tensor back = from_dlpack(lent);
  EXPECT_EQ(back.data_ptr(), memory);
  EXPECT_EQ(back.sizes(), (Shape{4, 3}));
  std::vector<float> want;
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 3; ++r) want.push_back(static_cast<float>(r * 4 + c));
  EXPECT_EQ(back.to_vector<float>(), want);
  EXPECT_EQ((back + 1).sum().item<float>(), 78.0f);
}

TEST(Interop, FromDlpackOwnsTheProducersTensor) {
  producer_deletions = 0;
  {
    // A byte offset of one element: the tensor starts at the second value.
    Tensor t = from_dlpack(produce({9, 1, 2, 3, 4, 5, 6}, {2, 3}, {kDLFloat, 32, 1}, 4));
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    Tensor view = t.narrow(1, 1, 2);
    t = Tensor();
    EXPECT_EQ(view.sum().item<float>(), 2 + 3 + 5 + 6);
    EXPECT_EQ(producer_deletions, 0);
    // Handed on again: DLPack from DLPack, the producer's memory still.
    DLManagedTensor* again = to_dlpack(view);
    view = Tensor();
    EXPECT_EQ(producer_deletions, 0);
    EXPECT_EQ(sum_of_dlpack_floats(again->dl_tensor), 16.0);
    again->deleter(again);
  }
  EXPECT_EQ(producer_deletions, 1);
  // A type lazyfuse has no dtype for is refused, and the producer's deleter still runs once.
  EXPECT_THROW(from_dlpack(produce({1, 2}, {2}, {kDLUInt, 8, 1})), DTypeError);
  EXPECT_EQ(producer_deletions, 2);
  EXPECT_THROW(to_dlpack(ones({2}, kBool)), DTypeError);
}

TEST(Interop, EdgeShapes) {
  // No elements: no memory needed, and the deleter still runs once.
  int deleted = 0;
  {
    Tensor empty = from_blob(nullptr, {0, 3}, [&](void*) { ++deleted; });
    EXPECT_EQ(empty.numel(), 0);
    EXPECT_EQ(empty.sum().item<float>(), 0.0f);
  }
  EXPECT_EQ(deleted, 1);
  // 0-d, through DLPack and back.
  Tensor scalar = scalar_tensor(2.5, kFloat64);
  DLManagedTensor* lent = to_dlpack(scalar);
  EXPECT_EQ(lent->dl_tensor.ndim, 0);
  Tensor back = from_dlpack(lent);
  EXPECT_EQ(back.dim(), 0);
  EXPECT_EQ(back.item<double>(), 2.5);
  // A broadcast view (a stride of 0) keeps its layout both ways.
  std::vector<int32_t> row = {7, 8, 9};
  Tensor rows = from_blob(row.data(), {4, 3}, {0, 1}, kInt32);
  EXPECT_EQ(rows.sum({0}).to_vector<int64_t>(), (std::vector<int64_t>{28, 32, 36}));
  DLManagedTensor* broadcast = to_dlpack(rows);
  EXPECT_EQ(broadcast->dl_tensor.strides[0], 0);
  EXPECT_EQ(from_dlpack(broadcast).to_vector<int32_t>()[10], 8);
  // bool memory is read as bool.
  bool flags[3] = {true, false, true};
  EXPECT_EQ(from_blob(flags, {3}, kBool).sum().item<int64_t>(), 2);
}

class CudaInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  }
};

TEST_F(CudaInterop, FromBlobOverGpuMemoryCallsTheDeleterOnce) {
  // GPU memory allocated by lazyfuse, wrapped as someone else's: the deleter keeps its owner.
  Tensor owner = arange(6, TensorOptions().dtype(kFloat32).device("cuda:0"));
  int deleted = 0;
  {
    Tensor t = from_blob(
        owner.data_ptr(), {2, 3}, [&, keep = owner](void*) { ++deleted; },
        TensorOptions().device("cuda:0"));
    EXPECT_EQ(t.device(), Device("cuda:0"));
    EXPECT_EQ(t.data_ptr(), owner.data_ptr()) << "no copy";
    EXPECT_EQ((t * 2).sum({1}).to_vector<float>(), (std::vector<float>{6, 24}));
  }
  EXPECT_EQ(deleted, 1);
}

TEST_F(CudaInterop, DlpackRoundTripOnTheGpu) {
  Tensor t = arange(8, TensorOptions().dtype(kFloat32).device("cuda:0")).reshape({2, 4});
  DLManagedTensor* lent = to_dlpack(t);
  EXPECT_EQ(lent->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(lent->dl_tensor.device.device_id, 0);
  Tensor back = from_dlpack(lent);
  EXPECT_EQ(back.data_ptr(), t.data_ptr());
  EXPECT_EQ(back.device(), Device("cuda:0"));
  EXPECT_EQ((back * back).sum().item<float>(), 140.0f);
}

}  // namespace
}  // namespace lazyfuse
