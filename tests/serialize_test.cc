// safetensors I/O (frontend/serialize.h): round trips of every dtype bit for bit, views, empty
// and 0-d tensors, metadata; the writer's layout and its temporary file; hand-written malformed
// files, each refused with a SerializationError that says what was wrong; files PyTorch wrote
// (tests/fixtures/safetensors, scripts/make-safetensors-fixtures.py), whose values the tests
// compute again from the script's formulas; and the replay of the fuzzer's corpus.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lazyfuse/frontend/nn.h"
#include "lazyfuse/frontend/serialize.h"
#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/executor.h"
#include "lazyfuse/runtime/lazy.h"
#include "lazyfuse/runtime/storage.h"
#include "tests/fuzz/safetensors_check.h"

namespace lazyfuse {
namespace {

namespace fs = std::filesystem;

// A computed CPU tensor holding exactly `bytes`: built with the runtime, not the loader.
Tensor from_bytes(DType dtype, Shape shape, const std::string& bytes) {
  BufferView buffer = allocate_buffer(Device::cpu(), dtype, shape);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(numel(shape) * dtype_size(dtype)));
  if (!bytes.empty()) std::memcpy(buffer.data(), bytes.data(), bytes.size());
  return Tensor(make_leaf(std::move(buffer), SourceLoc{}));
}

template <typename T>
std::string bytes_from(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The tensor's elements as bytes, row-major, read through the runtime rather than the loader.
std::string bytes_of(const Tensor& t) {
  eval(t);
  const BufferView host = copy_to_device(*t.value()->buffer, Device::cpu());
  const size_t n = static_cast<size_t>(t.numel() * dtype_size(t.dtype()));
  return n == 0 ? std::string() : std::string(static_cast<const char*>(host.data()), n);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A file: the 8-byte length (the header's own unless given), the header, the data.
std::string safetensors_file(const std::string& header, const std::string& data = "",
                             std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// The header of a file as text (padding included).
std::string header_of(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return file.substr(8, n);
}

std::vector<std::string> names_of(const NamedTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return names;
}

// A scratch directory per test, removed afterwards.
class SafetensorsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "lazyfuse-st-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(dir_, ignored);
  }
  std::vector<std::string> listing(const fs::path& dir) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

// One tensor of each dtype with the bit patterns that a detour through double would lose or
// change: int64 past 2^53, NaN payloads, -0.0, infinities, subnormals, the largest finite.
NamedTensors every_dtype() {
  return {
      {"bool", from_bytes(DType::Bool, {2, 3}, bytes_from<uint8_t>({1, 0, 1, 1, 0, 0}))},
      {"i32", from_bytes(DType::Int32, {5},
                         bytes_from<int32_t>({std::numeric_limits<int32_t>::min(), -1, 0, 1,
                                              std::numeric_limits<int32_t>::max()}))},
      {"i64",
       from_bytes(DType::Int64, {2, 3},
                  bytes_from<int64_t>({(int64_t{1} << 62) + 1, (int64_t{1} << 62) - 1,
                                       -(int64_t{1} << 62) - 3, std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max(), 9007199254740993}))},
      {"f16", from_bytes(DType::Float16, {8},
                         bytes_from<uint16_t>(
                             {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e01, 0x0001, 0x3c00, 0x7bff}))},
      {"bf16", from_bytes(DType::BFloat16, {2, 4},
                          bytes_from<uint16_t>(
                              {0x8000, 0x7f80, 0xff80, 0x7fc1, 0xffa0, 0x0001, 0x3f80, 0x7f7f}))},
      {"f32", from_bytes(DType::Float32, {7},
                         bytes_from<uint32_t>({0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                               0xffc00000u, 0x00000001u, 0x3f800000u}))},
      {"f64", from_bytes(DType::Float64, {5},
                         bytes_from<uint64_t>({0x8000000000000000ull, 0x7ff0000000000000ull,
                                               0x7ff8000000000123ull, 0x0000000000000001ull,
                                               0x3fb999999999999aull}))},
  };
}

TEST_F(SafetensorsFiles, EveryDTypeRoundTripsBitForBit) {
  const NamedTensors saved = every_dtype();
  const fs::path path = dir_ / "model.safetensors";
  save_safetensors(path.string(), saved);
  const NamedTensors loaded = load_safetensors(path.string());
  // In the order of their data: widest dtype first, as the reference writer lays them out.
  EXPECT_EQ(names_of(loaded),
            (std::vector<std::string>{"i64", "f64", "f32", "i32", "bf16", "f16", "bool"}));
  for (const auto& [name, original] : saved) {
    SCOPED_TRACE(name);
    const auto it = std::find_if(loaded.begin(), loaded.end(),
                                 [&](const auto& entry) { return entry.first == name; });
    ASSERT_NE(it, loaded.end());
    const Tensor& t = it->second;
    EXPECT_TRUE(t.is_computed());
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_EQ(t.dtype(), original.dtype());
    EXPECT_EQ(t.sizes(), original.sizes());
    EXPECT_EQ(bytes_of(t), bytes_of(original));
  }
  // The values are ordinary tensors: int64 arithmetic on them stays exact.
  const Tensor& i64 = loaded[0].second;
  EXPECT_EQ((i64 - 1).to_vector<int64_t>()[0], int64_t{1} << 62);
}

TEST_F(SafetensorsFiles, ViewsAndPendingTensorsAreSavedAsTheirValues) {
  const Tensor base = arange(12, kFloat32).reshape({3, 4});
  const NamedTensors saved = {
      {"transposed", base.t()},
      {"narrowed", base.narrow(1, 1, 2)},
      {"expanded", arange(3, kInt64).unsqueeze(1).expand({3, 4})},
      {"pending", base * 2 + 1},
      {"permuted", arange(24, kFloat16).reshape({2, 3, 4}).permute({2, 0, 1})},
  };
  const fs::path path = dir_ / "views.safetensors";
  save_safetensors(path.string(), saved);
  for (const auto& [name, t] : load_safetensors(path.string())) {
    SCOPED_TRACE(name);
    const auto it = std::find_if(saved.begin(), saved.end(),
                                 [&](const auto& entry) { return entry.first == name; });
    ASSERT_NE(it, saved.end());
    EXPECT_EQ(t.sizes(), it->second.sizes());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.to_vector<double>(), it->second.to_vector<double>());
  }
  // Saving evaluated the pending tensor, and a view's base is unchanged.
  EXPECT_TRUE(saved[3].second.is_computed());
  EXPECT_EQ(base.to_vector<float>()[5], 5.0f);
}

TEST_F(SafetensorsFiles, EmptyAndZeroDimTensors) {
  const NamedTensors saved = {
      {"empty", zeros({0, 3})},
      {"empty_i64", zeros({2, 0, 5}, kInt64)},
      {"scalar", scalar_tensor(7.5)},
      {"scalar_bool", scalar_tensor(true, kBool)},
  };
  const fs::path path = dir_ / "small.safetensors";
  save_safetensors(path.string(), saved);
  const std::string header = header_of(read_file(path));
  EXPECT_NE(header.find(R"("empty":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]})"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[0,4]})"),
            std::string::npos)
      << header;
  const NamedTensors loaded = load_safetensors(path.string());
  ASSERT_EQ(loaded.size(), 4u);
  std::map<std::string, Tensor> by_name(loaded.begin(), loaded.end());
  EXPECT_EQ(by_name["empty"].sizes(), (Shape{0, 3}));
  EXPECT_EQ(by_name["empty"].numel(), 0);
  EXPECT_EQ(by_name["empty_i64"].sizes(), (Shape{2, 0, 5}));
  EXPECT_EQ(by_name["empty_i64"].dtype(), kInt64);
  EXPECT_EQ(by_name["scalar"].dim(), 0);
  EXPECT_EQ(by_name["scalar"].item<float>(), 7.5f);
  EXPECT_EQ(by_name["scalar_bool"].dim(), 0);
  EXPECT_TRUE(by_name["scalar_bool"].item<bool>());
  // A file of no tensors at all is the reference writer's 16 bytes.
  save_safetensors((dir_ / "none.safetensors").string(), {});
  EXPECT_EQ(read_file(dir_ / "none.safetensors"), safetensors_file("{}      "));
  EXPECT_TRUE(load_safetensors((dir_ / "none.safetensors").string()).empty());
}

TEST_F(SafetensorsFiles, Metadata) {
  const fs::path path = dir_ / "meta.safetensors";
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "\"quoted\", ünïcödé, \\ and a\nnewline"}, {"", "empty key"}};
  save_safetensors(path.string(), {{"x", ones({2})}}, metadata);
  EXPECT_EQ(load_safetensors_metadata(path.string()), metadata);
  EXPECT_EQ(load_safetensors(path.string()).size(), 1u);
  // The metadata comes first in the header, as the reference writer puts it.
  EXPECT_EQ(header_of(read_file(path)).rfind(R"({"__metadata__":{)", 0), 0u);
  // Without metadata there is no "__metadata__" key at all.
  save_safetensors(path.string(), {{"x", ones({2})}});
  EXPECT_EQ(header_of(read_file(path)).find("__metadata__"), std::string::npos);
  EXPECT_TRUE(load_safetensors_metadata(path.string()).empty());
}

// README.md's example, on the CPU.
TEST_F(SafetensorsFiles, ReadmeExample) {
  nn::Linear fc(2, 3);
  const std::string path = (dir_ / "linear.safetensors").string();
  save_safetensors(path, {{"weight", fc.weight()}, {"bias", fc.bias()}}, {{"format", "pt"}});
  std::vector<std::string> lines;
  for (auto& [name, t] : load_safetensors(path, Device("cpu")))
    lines.push_back(name + " " + shape_str(t.sizes()));
  EXPECT_EQ(lines, (std::vector<std::string>{"bias [3]", "weight [3, 2]"}));
  EXPECT_EQ(bytes_of(load_safetensors(path)[1].second), bytes_of(fc.weight()));
}

TEST(Safetensors, LayoutIsTheReferenceWritersOrderAndAligned) {
  // Given in an order the writer does not keep: it sorts by dtype (widest first) then name.
  const NamedTensors tensors = {
      {"b", ones({3}, kFloat16)}, {"a", ones({1}, kBool)},     {"z", ones({2}, kInt64)},
      {"c", ones({5}, kFloat32)}, {"y", ones({1}, kFloat64)},  {"x", ones({3}, kBFloat16)},
      {"w", ones({3}, kInt32)},   {"aa", ones({2}, kFloat32)},
  };
  const std::string file = save_safetensors_to_memory(tensors);
  const std::string header = header_of(file);
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header, R"({"z":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                    R"("y":{"dtype":"F64","shape":[1],"data_offsets":[16,24]},)"
                    R"("aa":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},)"
                    R"("c":{"dtype":"F32","shape":[5],"data_offsets":[32,52]},)"
                    R"("w":{"dtype":"I32","shape":[3],"data_offsets":[52,64]},)"
                    R"("x":{"dtype":"BF16","shape":[3],"data_offsets":[64,70]},)"
                    R"("b":{"dtype":"F16","shape":[3],"data_offsets":[70,76]},)"
                    R"("a":{"dtype":"BOOL","shape":[1],"data_offsets":[76,77]}})"
                    "     ");
  EXPECT_EQ(file.size(), 8 + header.size() + 77);
  EXPECT_EQ(names_of(load_safetensors_from_memory(file)),
            (std::vector<std::string>{"z", "y", "aa", "c", "w", "x", "b", "a"}));
}

TEST(Safetensors, SaveRefusesBadNames) {
  auto message = [](const NamedTensors& tensors,
                    const std::map<std::string, std::string>& metadata = {}) -> std::string {
    try {
      save_safetensors_to_memory(tensors, metadata);
    } catch (const SerializationError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message({{"w", ones({1})}, {"w", ones({2})}}), "<memory>: the name 'w' is given twice");
  EXPECT_EQ(message({{"__metadata__", ones({1})}}),
            "<memory>: the name '__metadata__' is reserved for the file's metadata");
  EXPECT_EQ(message({{"w", Tensor()}}), "<memory>: tensor 'w' is undefined");
  EXPECT_EQ(message({{"bad\xff", ones({1})}}), "<memory>: the name 'bad\xff' is not valid UTF-8");
  EXPECT_EQ(message({{"w", ones({1})}}, {{"k", "\xc0\x80"}}),
            "<memory>: metadata 'k' is not valid UTF-8");
}

TEST_F(SafetensorsFiles, AFailedSaveLeavesNothingAndKeepsTheOldFile) {
  const fs::path path = dir_ / "model.safetensors";
  save_safetensors(path.string(), {{"w", ones({2})}});
  const std::string before = read_file(path);
  // Refused before any file is opened: the old file stays as it was.
  EXPECT_THROW(save_safetensors(path.string(), {{"w", ones({3})}, {"w", ones({3})}}),
               SerializationError);
  EXPECT_EQ(read_file(path), before);
  // A directory that does not exist.
  EXPECT_THROW(save_safetensors((dir_ / "missing" / "m.safetensors").string(), {{"w", ones({2})}}),
               SerializationError);
  // The data written in full, then the rename fails (the target is a directory): the
  // temporary file is removed.
  fs::create_directory(dir_ / "taken.safetensors");
  try {
    save_safetensors((dir_ / "taken.safetensors").string(), {{"w", ones({2})}});
    ADD_FAILURE() << "saving over a directory did not throw";
  } catch (const SerializationError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot rename"), std::string::npos) << e.what();
  }
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"model.safetensors", "taken.safetensors"}));
  // A directory that cannot be written (root writes anywhere, so only for others).
  const fs::path locked = dir_ / "locked";
  fs::create_directory(locked);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  if (geteuid() != 0) {
    try {
      save_safetensors((locked / "m.safetensors").string(), {{"w", ones({2})}});
      ADD_FAILURE() << "saving into a read-only directory did not throw";
    } catch (const SerializationError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot create a temporary file"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(listing(locked).empty());
  }
  // A save that succeeds replaces the file whole, leaving no temporary file beside it.
  save_safetensors(path.string(), {{"w", ones({3})}});
  EXPECT_EQ(load_safetensors(path.string())[0].second.numel(), 3);
  EXPECT_EQ(listing(dir_),
            (std::vector<std::string>{"locked", "model.safetensors", "taken.safetensors"}));
}

TEST(Safetensors, LoadsOntoTheGpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const NamedTensors saved = every_dtype();
  const std::string file = save_safetensors_to_memory(saved);
  const NamedTensors loaded = load_safetensors_from_memory(file, Device("cuda"));
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [name, t] : loaded) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(t.is_computed());
    EXPECT_EQ(t.device(), Device("cuda:0"));
  }
  // And back: saving GPU tensors copies them to the host, bit for bit.
  EXPECT_EQ(save_safetensors_to_memory(loaded), file);
}

// ---------------------------------------------------------------------------------------------
// Malformed files

// The message a load of `bytes` fails with, named as "model.safetensors".
std::string load_error(const std::string& bytes) {
  const int64_t held = memory_stats(Device::cpu()).allocated_bytes;
  try {
    NamedTensors loaded = load_safetensors_from_memory(bytes, Device::cpu(), "model.safetensors");
    return "loaded " + std::to_string(loaded.size()) + " tensors";
  } catch (const SerializationError& e) {
    // Nothing partial: every buffer made before the error is gone again.
    EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, held);
    return e.what();
  }
}

#define EXPECT_LOAD_ERROR(bytes, fragment)                               \
  do {                                                                   \
    const std::string message_ = load_error(bytes);                      \
    EXPECT_NE(message_.find(fragment), std::string::npos) << message_;   \
    EXPECT_EQ(message_.rfind("model.safetensors: ", 0), 0u) << message_; \
  } while (0)

const std::string kF32x3 = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";

TEST(SafetensorsMalformed, LengthAndTruncation) {
  EXPECT_LOAD_ERROR(std::string("abc"), "the file is 3 bytes, too short for the 8-byte header");
  // The brief's example, exactly: a length far past a 100-byte file.
  EXPECT_EQ(load_error(safetensors_file("{}", std::string(90, ' '), 1234567)),
            "model.safetensors: header length 1234567 exceeds the file size 100");
  EXPECT_LOAD_ERROR(safetensors_file("{}", "", ~uint64_t{0}), "header length 18446744073709551615");
  // Within the file, but not after the 8 bytes of the length.
  EXPECT_LOAD_ERROR(safetensors_file("{}", "", 6),
                    "header length 6 exceeds the file size 10 less the 8 bytes of the length");
  // Past the reference reader's limit of 100 MB, in a file that holds it.
  EXPECT_LOAD_ERROR(safetensors_file(std::string(100'000'008, ' ')),
                    "header length 100000008 exceeds the limit of 100000000 bytes");
  // A truncated header: its JSON ends early.
  EXPECT_LOAD_ERROR(safetensors_file(kF32x3.substr(0, 30)), "not valid UTF-8 JSON");
  // Truncated data.
  EXPECT_LOAD_ERROR(safetensors_file(kF32x3, std::string(8, '\0')),
                    "tensor 'w': data_offsets [0, 12] run past the end of the data, which is 8 "
                    "bytes (is the file truncated?)");
  // Data past the last tensor.
  EXPECT_LOAD_ERROR(safetensors_file(kF32x3, std::string(16, '\0')),
                    "the data is 16 bytes but the tensors cover 12");
  // A missing file.
  try {
    load_safetensors("/nonexistent/model.safetensors");
    ADD_FAILURE();
  } catch (const SerializationError& e) {
    EXPECT_EQ(std::string(e.what()),
              "/nonexistent/model.safetensors: cannot open: No such file or directory");
  }
}

TEST(SafetensorsMalformed, BadJson) {
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w": )"), "the header is not valid UTF-8 JSON");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w": {}} trailing)"), "not valid UTF-8 JSON");
  EXPECT_LOAD_ERROR(safetensors_file("{\"\xff\": 1}"), "not valid UTF-8 JSON");
  EXPECT_LOAD_ERROR(safetensors_file("{\"\\ud800\": 1}"), "not valid UTF-8 JSON");
  EXPECT_LOAD_ERROR(safetensors_file("[1, 2]"), "the header is not a JSON object");
  EXPECT_LOAD_ERROR(safetensors_file(" {}"), "it does not begin with '{'");
  EXPECT_LOAD_ERROR(safetensors_file("\xef\xbb\xbf{}"), "it does not begin with '{'");
  EXPECT_LOAD_ERROR(safetensors_file(""), "it does not begin with '{'");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w": 3})"),
                    "tensor 'w': expected an object with dtype, shape and data_offsets, got 3");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w":{"dtype":"F32","data_offsets":[0,0]}})"),
                    "tensor 'w': missing \"shape\"");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w":{"dtype":7,"shape":[],"data_offsets":[0,4]}})"),
                    "tensor 'w': dtype must be a string, got 7");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"__metadata__":{"k":1}})"),
                    "__metadata__ must map strings to strings, but 'k' holds 1");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"__metadata__":[]})"),
                    "__metadata__ must be an object of strings, got an array");
  // Padding with spaces, and a null __metadata__, are fine.
  EXPECT_EQ(load_error(safetensors_file(R"({"__metadata__":null}   )")), "loaded 0 tensors");
}

TEST(SafetensorsMalformed, DeepNesting) {
  // A million levels where a shape belongs: refused without recursing through them (such a
  // value once overflowed the stack when ordered_json copied it while its object grew).
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  EXPECT_LOAD_ERROR(
      safetensors_file(R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})"),
      "the header nests arrays or objects deeper than a safetensors header does");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":)" + deep + "}"), "deeper than a safetensors");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"__metadata__":{"k":{"x":{}}}})"),
                    "deeper than a safetensors");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})",
                                     std::string(4, '\0')),
                    "deeper than a safetensors");
}

TEST(SafetensorsMalformed, DuplicateKeys) {
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     std::string(8, '\0')),
                    "the header names 'w' twice");
  EXPECT_LOAD_ERROR(
      safetensors_file(R"({"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                       std::string(4, '\0')),
      "the header has the key 'dtype' twice in one object");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"__metadata__":{"a":"1","a":"2"}})"),
                    "the key 'a' twice in one object");
}

TEST(SafetensorsMalformed, OffsetsAndSizes) {
  // The brief's example, exactly.
  EXPECT_EQ(
      load_error(safetensors_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})",
                                  std::string(10, '\0'))),
      "model.safetensors: tensor 'w': data_offsets [0, 10] hold 10 bytes, dtype F32 shape "
      "[3] needs 12");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     std::string(12, '\0')),
                    "tensor 'b': data_offsets [4, 12] overlap tensor 'a''s [0, 8]");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                     std::string(12, '\0')),
                    "bytes [4, 8) of the data belong to no tensor (the next is 'b' at [8, 12])");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     std::string(8, '\0')),
                    "bytes [0, 4) of the data belong to no tensor");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
                                     std::string(8, '\0')),
                    "tensor 'a': data_offsets [8, 4] end before they begin");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})"),
                    "data_offsets must be an array of two integers, got an array");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})"),
                    "data_offsets [0, -4] are not non-negative integers");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})"),
                    "tensor 'a': shape entry -1 is not a non-negative integer");
  EXPECT_LOAD_ERROR(safetensors_file(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})"),
                    "tensor 'a': shape entry 1.0 is not a non-negative integer");
  EXPECT_LOAD_ERROR(
      safetensors_file(
          R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})"),
      "is not a non-negative integer");
  EXPECT_LOAD_ERROR(
      safetensors_file(
          R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
      "tensor 'a': shape [4294967296, 4294967296] has more elements than int64 holds");
  // No elements, but strides that do not fit int64: nothing could index it.
  EXPECT_LOAD_ERROR(
      safetensors_file(
          R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"),
      "has more elements than int64 holds (zeros counted as one, as strides count them)");
  EXPECT_LOAD_ERROR(
      safetensors_file(
          R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})"),
      "tensor 'a': shape [2305843009213693952] of F64 has more bytes than int64 holds");
  // Empty tensors may share an offset; they keep the header's order.
  const NamedTensors loaded = load_safetensors_from_memory(
      safetensors_file(R"({"e2":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                       R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
                       R"("e1":{"dtype":"BOOL","shape":[2,0],"data_offsets":[4,4]}})",
                       std::string(4, '\x07')));
  EXPECT_EQ(names_of(loaded), (std::vector<std::string>{"a", "e2", "e1"}));
  EXPECT_EQ(loaded[0].second.item<int32_t>(), 0x07070707);
}

TEST(SafetensorsMalformed, DTypes) {
  EXPECT_LOAD_ERROR(safetensors_file(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",
                                     std::string(4, '\0')),
                    "tensor 'w': unknown dtype 'F33'");
  for (const char* dtype : {"U8", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "C64"}) {
    SCOPED_TRACE(dtype);
    EXPECT_LOAD_ERROR(safetensors_file(std::string(R"({"w":{"dtype":")") + dtype +
                                       R"(","shape":[0],"data_offsets":[0,0]}})"),
                      std::string("tensor 'w': dtype ") + dtype +
                          " is not supported by lazyfuse (it has BOOL, I32, I64, F16, BF16, F32 "
                          "and F64)");
  }
  // A bool byte other than 0 and 1, which C++ code may not read as bool.
  EXPECT_LOAD_ERROR(safetensors_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                                     std::string("\x01\x02\x00", 3)),
                    "tensor 'm': BOOL element 1 is the byte 2, not 0 or 1");
}

TEST(SafetensorsMalformed, LongNamesAreCutInMessages) {
  const std::string name(1000, 'n');
  const std::string message = load_error(
      safetensors_file("{\"" + name + R"(":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}})",
                       std::string(10, '\0')));
  EXPECT_NE(message.find("...' (1000 bytes)"), std::string::npos) << message;
  EXPECT_LT(message.size(), 400u);
}

// ---------------------------------------------------------------------------------------------
// Files PyTorch wrote: scripts/make-safetensors-fixtures.py, with safetensors.torch.save_file.

fs::path fixture(const std::string& name) {
  return fs::path(LAZYFUSE_SOURCE_DIR) / "tests/fixtures/safetensors" / name;
}

// The fixture script's formulas, written again here.
template <typename T, typename F>
std::vector<T> formula(int n, F f) {
  std::vector<T> out;
  for (int k = 0; k < n; ++k) out.push_back(f(k));
  return out;
}

TEST(SafetensorsFromPyTorch, LoadsEveryDType) {
  const NamedTensors loaded = load_safetensors(fixture("dtypes.safetensors").string());
  // The order of torch's writer: dtype rank, widest first, then name.
  EXPECT_EQ(names_of(loaded), (std::vector<std::string>{"i64", "f64", "empty", "f32", "scalar",
                                                        "specials", "i32", "bf16", "f16", "bool"}));
  std::map<std::string, Tensor> t(loaded.begin(), loaded.end());

  EXPECT_EQ(t["bool"].dtype(), kBool);
  EXPECT_EQ(t["bool"].sizes(), (Shape{2, 3}));
  EXPECT_EQ(bytes_of(t["bool"]), bytes_from(formula<uint8_t>(6, [](int k) { return k % 3 == 0; })));

  EXPECT_EQ(t["i32"].dtype(), kInt32);
  EXPECT_EQ(t["i32"].sizes(), (Shape{3, 4}));
  EXPECT_EQ(bytes_of(t["i32"]),
            bytes_from(formula<int32_t>(12, [](int k) { return (k - 6) * 300000007; })));

  EXPECT_EQ(t["i64"].dtype(), kInt64);
  EXPECT_EQ(bytes_of(t["i64"]), bytes_from(formula<int64_t>(6, [](int k) {
              return int64_t{k - 3} * (int64_t{1} << 61) + (k - 3);
            })));

  // Half types: exact values, compared through float (the conversion of an exact value is).
  EXPECT_EQ(t["f16"].dtype(), kFloat16);
  EXPECT_EQ(t["f16"].to_vector<float>(), formula<float>(8, [](int k) { return (k - 4) * 0.375f; }));
  EXPECT_EQ(bytes_of(t["f16"]).substr(0, 4),
            bytes_from<uint16_t>({0xbe00, 0xbc80}));  // -1.5, -1.125
  EXPECT_EQ(t["bf16"].dtype(), kBFloat16);
  EXPECT_EQ(t["bf16"].to_vector<float>(), formula<float>(8, [](int k) { return (k - 4) * 0.5f; }));
  EXPECT_EQ(bytes_of(t["bf16"]).substr(0, 4), bytes_from<uint16_t>({0xc000, 0xbfc0}));  // -2, -1.5

  EXPECT_EQ(t["f32"].sizes(), (Shape{2, 2, 3}));
  EXPECT_EQ(bytes_of(t["f32"]), bytes_from(formula<float>(12, [](int k) { return k / 3.0f; })));
  EXPECT_EQ(t["f64"].dtype(), kFloat64);
  EXPECT_EQ(bytes_of(t["f64"]), bytes_from(formula<double>(5, [](int k) { return k / 7.0; })));
  EXPECT_EQ(t["scalar"].dim(), 0);
  EXPECT_EQ(t["scalar"].item<float>(), 2.5f);
  EXPECT_EQ(t["empty"].sizes(), (Shape{0, 3}));
  EXPECT_EQ(bytes_of(t["specials"]), bytes_from<uint32_t>({0x7fc00000u, 0x7f800000u, 0xff800000u,
                                                           0x80000000u, 0x00000001u}));
}

TEST(SafetensorsFromPyTorch, LinearStateDictAndMetadata) {
  const std::string path = fixture("linear.safetensors").string();
  const NamedTensors loaded = load_safetensors(path);
  ASSERT_EQ(names_of(loaded), (std::vector<std::string>{"bias", "weight"}));
  EXPECT_EQ(loaded[1].second.sizes(), (Shape{3, 2}));
  EXPECT_EQ(bytes_of(loaded[1].second),
            bytes_from(formula<float>(6, [](int k) { return k / 10.0f - 0.25f; })));
  EXPECT_EQ(loaded[0].second.to_vector<float>(), (std::vector<float>{-1, 0, 1}));
  EXPECT_EQ(load_safetensors_metadata(path),
            (std::map<std::string, std::string>{{"format", "pt"}}));
  // The state dict works as one: x @ weight.T + bias for x = [1, 2].
  const Tensor y = matmul(tensor({{1., 2.}}), loaded[1].second.t()) + loaded[0].second;
  const std::vector<float> w = loaded[1].second.to_vector<float>();
  const std::vector<float> out = y.to_vector<float>();
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(out[i], w[2 * i] + 2 * w[2 * i + 1] + (i - 1));
}

TEST(SafetensorsFromPyTorch, Uint8IsATypedError) {
  try {
    load_safetensors(fixture("uint8.safetensors").string());
    ADD_FAILURE() << "a U8 tensor loaded";
  } catch (const SerializationError& e) {
    EXPECT_NE(std::string(e.what()).find("uint8.safetensors: tensor 'pixels': dtype U8 is not "
                                         "supported by lazyfuse"),
              std::string::npos)
        << e.what();
  }
}

// The fixture's tensors, made with lazyfuse's own ops from the same formulas.
TEST(SafetensorsFromPyTorch, LazyfuseWritesTheSameBytesAsPyTorch) {
  const Tensor k6 = arange(6, kInt64) - 3;
  const NamedTensors dtypes = {
      {"bool", from_vector({1, 0, 0, 1, 0, 0}, {2, 3}, kBool)},
      {"i32", ((arange(12, kInt32) - 6) * 300000007).reshape({3, 4})},
      {"i64", k6 * (int64_t{1} << 61) + k6},
      {"f16", (arange(8, kFloat16) - 4) * 0.375},
      {"bf16", (arange(8, kBFloat16) - 4) * 0.5},
      {"f32", (arange(12, kFloat32) / 3).reshape({2, 2, 3})},
      {"f64", arange(5, kFloat64) / 7},
      {"scalar", scalar_tensor(2.5)},
      {"empty", zeros({0, 3})},
      {"specials", from_bytes(DType::Float32, {5},
                              bytes_from<uint32_t>({0x7fc00000u, 0x7f800000u, 0xff800000u,
                                                    0x80000000u, 0x00000001u}))},
  };
  EXPECT_EQ(save_safetensors_to_memory(dtypes), read_file(fixture("dtypes.safetensors")));
  const NamedTensors linear = {
      {"weight", (arange(6, kFloat32) / 10 - 0.25).reshape({3, 2})},
      {"bias", arange(3, kFloat32) - 1},
  };
  EXPECT_EQ(save_safetensors_to_memory(linear, {{"format", "pt"}}),
            read_file(fixture("linear.safetensors")));
}

// The other direction, PyTorch reading lazyfuse's files, needs torch, which the suite does not
// have: with LAZYFUSE_SAFETENSORS_EXPORT_DIR set, this writes files that
// `scripts/make-safetensors-fixtures.py --check DIR` loads with safetensors.torch and checks
// against the same values (and that torch writes them again byte for byte).
TEST(SafetensorsForPyTorch, WritesFilesForTheFixtureScriptToCheck) {
  const char* dir = std::getenv("LAZYFUSE_SAFETENSORS_EXPORT_DIR");
  if (!dir) GTEST_SKIP() << "LAZYFUSE_SAFETENSORS_EXPORT_DIR is not set";
  save_safetensors((fs::path(dir) / "every_dtype.safetensors").string(), every_dtype(),
                   {{"writer", "lazyfuse"}});
  const Tensor base = arange(12, kFloat32).reshape({3, 4});
  save_safetensors((fs::path(dir) / "views.safetensors").string(),
                   {{"transposed", base.t()},
                    {"narrowed", base.narrow(1, 1, 2)},
                    {"expanded", arange(3, kInt64).unsqueeze(1).expand({3, 4})},
                    {"scalar", scalar_tensor(7.5)},
                    {"empty", zeros({2, 0}, kBFloat16)}});
}

// ---------------------------------------------------------------------------------------------
// The fuzzer's corpus (tests/fuzz/corpus/safetensors), replayed as IrCorpus replays the IR's.

TEST(SafetensorsCorpus, EveryInputPassesTheFuzzersCheck) {
  const fs::path dir = fs::path(LAZYFUSE_SOURCE_DIR) / "tests/fuzz/corpus/safetensors";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  // The hand-written seeds alone are a dozen; fewer means the corpus went missing.
  ASSERT_GE(files.size(), 12u);
  for (const fs::path& file : files) {
    std::string finding;
    try {
      finding = fuzz::check_safetensors(read_file(file));
    } catch (const std::exception& e) {
      finding = std::string("an exception that is not a SerializationError: ") + e.what();
    }
    EXPECT_EQ(finding, "") << file;
  }
  // The fixtures PyTorch wrote pass it too.
  for (const char* name : {"dtypes.safetensors", "linear.safetensors", "uint8.safetensors"})
    EXPECT_EQ(fuzz::check_safetensors(read_file(fixture(name))), "") << name;
}

// A module's parameters out and back in, as state_dict and load_state_dict(strict=True).
TEST_F(SafetensorsFiles, ModuleParametersRoundTripAndAFailedLoadChangesNothing) {
  manual_seed(1);
  nn::Sequential saved(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  const std::string path = (dir_ / "net.safetensors").string();
  save_safetensors(path, saved);
  manual_seed(2);
  nn::Sequential loaded(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  Tensor weight = loaded.named_parameters()[0].second;  // as an optimizer would hold it
  load_safetensors(loaded, path);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(loaded.named_parameters()[i].second.to_vector<float>(),
              saved.named_parameters()[i].second.to_vector<float>());
    EXPECT_TRUE(loaded.named_parameters()[i].second.requires_grad());
  }
  EXPECT_EQ(weight.to_vector<float>(), saved.named_parameters()[0].second.to_vector<float>());

  // Wrong shapes, a missing and an unexpected key: an error naming them, and nothing changes.
  nn::Sequential other(nn::Linear(3, 5), nn::ReLU(), nn::Linear(5, 2, false));
  const std::vector<float> before = other.named_parameters()[0].second.to_vector<float>();
  try {
    load_safetensors(other, path);
    FAIL() << "expected SerializationError";
  } catch (const SerializationError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("net.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("Unexpected key(s): \"2.bias\""), std::string::npos) << message;
    EXPECT_NE(message.find("size mismatch for 0.weight"), std::string::npos) << message;
  }
  EXPECT_EQ(other.named_parameters()[0].second.to_vector<float>(), before);
  save_safetensors(path, {{"0.weight", zeros({4, 3})}});
  EXPECT_THROW(load_safetensors(loaded, path), SerializationError);  // keys missing
  EXPECT_EQ(weight.to_vector<float>(), saved.named_parameters()[0].second.to_vector<float>());
}

}  // namespace
}  // namespace lazyfuse
