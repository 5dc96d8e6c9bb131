// safetensors: the reader checks a header completely before it makes a tensor, and the writer
// lays a file out as the reference library (huggingface/safetensors) does, byte for byte.
#include "lazyfuse/frontend/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/executor.h"
#include "nlohmann/json.hpp"

namespace lazyfuse {
namespace {

// The format is little-endian and tensors are copied byte for byte.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

using Json = nlohmann::ordered_json;

// What the reference reader refuses: a header larger than this is not a header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
// Names and strings in messages are cut here: a message need not repeat a megabyte of header.
constexpr size_t kQuoteLimit = 200;

// Every dtype the format defines, in the order of the reference library's Dtype enum, which is
// its layout rank: it writes tensors by descending rank, then by name. Those lazyfuse lacks have
// no DType.
struct FileDType {
  std::string_view name;
  std::optional<DType> dtype;
};
constexpr FileDType kFileDTypes[] = {
    {"BOOL", DType::Bool},         {"F4", std::nullopt},          {"F6_E2M3", std::nullopt},
    {"F6_E3M2", std::nullopt},     {"U8", std::nullopt},          {"I8", std::nullopt},
    {"F8_E5M2", std::nullopt},     {"F8_E4M3", std::nullopt},     {"F8_E8M0", std::nullopt},
    {"F8_E4M3FNUZ", std::nullopt}, {"F8_E5M2FNUZ", std::nullopt}, {"I16", std::nullopt},
    {"U16", std::nullopt},         {"F16", DType::Float16},       {"BF16", DType::BFloat16},
    {"I32", DType::Int32},         {"U32", std::nullopt},         {"F32", DType::Float32},
    {"C64", std::nullopt},         {"F64", DType::Float64},       {"I64", DType::Int64},
    {"U64", std::nullopt},
};

const FileDType* find_file_dtype(std::string_view name) {
  for (const FileDType& d : kFileDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

// The position of `dtype` in kFileDTypes: the writer's sort key.
int layout_rank(DType dtype) {
  for (size_t i = 0; i < std::size(kFileDTypes); ++i)
    if (kFileDTypes[i].dtype == dtype) return static_cast<int>(i);
  return -1;
}

std::string_view file_dtype_name(DType dtype) { return kFileDTypes[layout_rank(dtype)].name; }

// Text from pieces. (absl::StrCat would do, but Debian's abseil has its own string_view, which
// it does not take from std::string_view.)
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(std::string_view source, const Args&... args) {
  throw SerializationError(cat(source, ": ", args...));
}

std::string in_quotes(std::string_view text) {
  if (text.size() <= kQuoteLimit) return cat("'", text, "'");
  return cat("'", text.substr(0, kQuoteLimit), "...' (", text.size(), " bytes)");
}

// A JSON value in a message: numbers and short strings as written, anything else by its kind.
// Never dump() a container: a hostile header nests arrays a million deep, and dump() recurses.
std::string describe(const Json& value) {
  if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
  if (value.is_string()) return in_quotes(value.get_ref<const std::string&>());
  return std::string(value.is_array() ? "an array" : "an object");
}

bool valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    int extra;
    uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, code = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    // Overlong forms, surrogates and code points past Unicode are not UTF-8.
    constexpr uint32_t kMinimum[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMinimum[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
      return false;
    i += extra + 1;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Reading

// A tensor as the header describes it, checked.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

// Where a file's bytes come from: memory, or a file read piece by piece so that a large file is
// not held twice (once as bytes, once as tensors).
class ByteSource {
 public:
  explicit ByteSource(std::string name) : name_(std::move(name)) {}
  virtual ~ByteSource() = default;
  const std::string& name() const { return name_; }
  virtual uint64_t size() const = 0;
  // Exactly `count` bytes from `offset`, which the caller keeps within size().
  virtual void read(uint64_t offset, void* out, uint64_t count) = 0;

 private:
  std::string name_;
};

class MemorySource : public ByteSource {
 public:
  MemorySource(std::string_view bytes, std::string name)
      : ByteSource(std::move(name)), bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, void* out, uint64_t count) override {
    if (count) std::memcpy(out, bytes_.data() + offset, count);
  }

 private:
  std::string_view bytes_;
};

class FileSource : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : ByteSource(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, "cannot open: ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      const int error = errno;
      ::close(fd_);
      fail(path, "cannot stat: ", std::strerror(error));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path, "not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* out, uint64_t count) override {
    auto* p = static_cast<char*>(out);
    while (count > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(count, 1 << 30));
      const ssize_t got = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(name(), "read failed at byte ", offset, ": ", std::strerror(errno));
      // The size was checked against fstat: a short read means the file shrank meanwhile.
      if (got == 0)
        fail(name(), "unexpected end of file at byte ", offset, " of ", size_,
             " (did the file change while it was read?)");
      p += got;
      offset += static_cast<uint64_t>(got);
      count -= static_cast<uint64_t>(got);
    }
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Watches the parser (nlohmann's parse callback) for two things its DOM would hide or suffer.
// Duplicate keys: nlohmann keeps the last without a word, but the format has one entry per name,
// and a reader that silently picks one loads something other than what another reader loads.
// Depth: a header is an object of objects of flat arrays, and nothing deeper is built (returning
// false discards a container unbuilt) because ordered_json copies its members recursively when
// an object grows, which a header nested a million deep would turn into a stack overflow.
class HeaderWatch {
 public:
  bool operator()(int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        // `depth` counts the containers around this one: the header (0), a tensor's entry or
        // __metadata__ (1), a shape or data_offsets (2).
        if (depth > 2) {
          too_deep_ = true;
          return false;
        }
        if (event == Json::parse_event_t::object_start) keys_.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys_.pop_back();
        break;
      case Json::parse_event_t::key:
        // Keys of a discarded object land in a set of their own or, past the depth limit, in
        // the nearest kept object's; either way the header is refused as too deep.
        if (!keys_.back().insert(parsed.get<std::string>()).second && !duplicate_)
          duplicate_ = std::make_pair(parsed.get<std::string>(), depth);
        break;
      default:
        break;
    }
    return true;
  }
  bool too_deep() const { return too_deep_; }
  // The first key seen twice in one object, and its depth (1: a tensor name).
  const std::optional<std::pair<std::string, int>>& duplicate() const { return duplicate_; }

 private:
  std::vector<std::set<std::string>> keys_;
  std::optional<std::pair<std::string, int>> duplicate_;
  bool too_deep_ = false;
};

// A non-negative integer that fits `limit`, or nullopt. nlohmann reads "-1" as a signed
// integer, "1e3" and integers past uint64 as floats: none of those is a size or an offset.
std::optional<uint64_t> as_count(const Json& value, uint64_t limit) {
  uint64_t n;
  if (value.is_number_unsigned()) {
    n = value.get<uint64_t>();
  } else if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    n = static_cast<uint64_t>(value.get<int64_t>());
  } else {
    return std::nullopt;
  }
  if (n > limit) return std::nullopt;
  return n;
}

std::string offsets_str(uint64_t begin, uint64_t end) { return cat("[", begin, ", ", end, "]"); }

Entry parse_entry(const std::string& source, const std::string& name, const Json& info) {
  const std::string where = cat("tensor ", in_quotes(name), ": ");
  if (!info.is_object())
    fail(source, where, "expected an object with dtype, shape and data_offsets, got ",
         describe(info));
  const auto field = [&](std::string_view key) -> const Json& {
    auto it = info.find(key);
    if (it == info.end()) fail(source, where, "missing \"", key, "\"");
    return *it;
  };
  Entry entry;
  entry.name = name;

  const Json& dtype = field("dtype");
  if (!dtype.is_string()) fail(source, where, "dtype must be a string, got ", describe(dtype));
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  const FileDType* file_dtype = find_file_dtype(dtype_name);
  if (!file_dtype) fail(source, where, "unknown dtype ", in_quotes(dtype_name));
  if (!file_dtype->dtype)
    fail(source, where, "dtype ", dtype_name,
         " is not supported by lazyfuse (it has BOOL, I32, I64, F16, BF16, F32 and F64)");
  entry.dtype = *file_dtype->dtype;

  const Json& shape = field("shape");
  if (!shape.is_array()) fail(source, where, "shape must be an array, got ", describe(shape));
  for (const Json& size : shape) {
    std::optional<uint64_t> n = as_count(size, std::numeric_limits<int64_t>::max());
    if (!n) fail(source, where, "shape entry ", describe(size), " is not a non-negative integer");
    entry.shape.push_back(static_cast<int64_t>(*n));
  }
  // Strides are products of the sizes (zeros counted as one): they must fit in int64 even for
  // a shape with no elements, or nothing can index the tensor.
  const int64_t count = checked_numel(entry.shape);
  if (count < 0)
    fail(source, where, "shape ", shape_str(entry.shape), " has more elements than int64 holds",
         zeros_as_ones(entry.shape));
  const int64_t itemsize = dtype_size(entry.dtype);
  if (count > std::numeric_limits<int64_t>::max() / itemsize)
    fail(source, where, "shape ", shape_str(entry.shape), " of ", dtype_name,
         " has more bytes than int64 holds");
  const uint64_t needed = static_cast<uint64_t>(count * itemsize);

  const Json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    fail(source, where, "data_offsets must be an array of two integers, got ", describe(offsets));
  std::optional<uint64_t> begin = as_count(offsets[0], std::numeric_limits<uint64_t>::max());
  std::optional<uint64_t> end = as_count(offsets[1], std::numeric_limits<uint64_t>::max());
  if (!begin || !end)
    fail(source, where, "data_offsets [", describe(offsets[0]), ", ", describe(offsets[1]),
         "] are not non-negative integers");
  entry.begin = *begin;
  entry.end = *end;
  if (entry.end < entry.begin)
    fail(source, where, "data_offsets ", offsets_str(entry.begin, entry.end),
         " end before they begin");
  if (entry.end - entry.begin != needed)
    fail(source, where, "data_offsets ", offsets_str(entry.begin, entry.end), " hold ",
         entry.end - entry.begin, " bytes, dtype ", dtype_name, " shape ", shape_str(entry.shape),
         " needs ", needed);
  return entry;
}

std::map<std::string, std::string> parse_metadata(const std::string& source, const Json& value) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;  // what a writer with no metadata may put there
  if (!value.is_object())
    fail(source, "__metadata__ must be an object of strings, got ", describe(value));
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string())
      fail(source, "__metadata__ must map strings to strings, but ", in_quotes(key), " holds ",
           describe(item));
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// Checks `text` as a header for a data section of `data_size` bytes.
Header parse_header(const std::string& source, std::string_view text, uint64_t data_size) {
  // The reference reader insists on '{' first; nlohmann would skip a byte order mark.
  if (text.empty() || text.front() != '{')
    fail(source, "the header is not a JSON object (it does not begin with '{')");
  HeaderWatch watch;
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), std::ref(watch));
  } catch (const Json::exception& e) {
    // nlohmann checks UTF-8 inside strings and allows nothing else outside ASCII.
    fail(source, "the header is not valid UTF-8 JSON: ", e.what());
  }
  if (watch.too_deep())
    fail(source, "the header nests arrays or objects deeper than a safetensors header does");
  if (watch.duplicate()) {
    const auto& [key, depth] = *watch.duplicate();
    if (depth <= 1) fail(source, "the header names ", in_quotes(key), " twice");
    fail(source, "the header has the key ", in_quotes(key), " twice in one object");
  }
  if (!json.is_object()) fail(source, "the header is not a JSON object");

  Header header;
  for (const auto& [key, value] : json.items()) {
    if (key == kMetadataKey)
      header.metadata = parse_metadata(source, value);
    else
      header.entries.push_back(parse_entry(source, key, value));
  }
  // In the order of the data; empty tensors that share an offset keep the header's order.
  std::stable_sort(header.entries.begin(), header.entries.end(),
                   [](const Entry& a, const Entry& b) {
                     return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
                   });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : header.entries) {
    if (e.end > data_size)
      fail(source, "tensor ", in_quotes(e.name), ": data_offsets ", offsets_str(e.begin, e.end),
           " run past the end of the data, which is ", data_size,
           " bytes (is the file truncated?)");
    if (e.begin < covered)
      fail(source, "tensor ", in_quotes(e.name), ": data_offsets ", offsets_str(e.begin, e.end),
           " overlap tensor ", in_quotes(previous->name), "'s ",
           offsets_str(previous->begin, previous->end));
    if (e.begin > covered)
      fail(source, "bytes [", covered, ", ", e.begin,
           ") of the data belong to no tensor (the next is ", in_quotes(e.name), " at ",
           offsets_str(e.begin, e.end), ")");
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size)
    fail(source, "the data is ", data_size, " bytes but the tensors cover ", covered);
  return header;
}

// The header of `source`, checked, and the offset of its data.
std::pair<Header, uint64_t> read_header(ByteSource& source) {
  const uint64_t size = source.size();
  if (size < 8)
    fail(source.name(), "the file is ", size, " bytes, too short for the 8-byte header length");
  unsigned char prefix[8];
  source.read(0, prefix, 8);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | prefix[i];
  if (length > size - 8)
    fail(source.name(), "header length ", length, " exceeds the file size ", size,
         length <= size ? " less the 8 bytes of the length" : "");
  if (length > kMaxHeaderBytes)
    fail(source.name(), "header length ", length, " exceeds the limit of ", kMaxHeaderBytes,
         " bytes");
  std::string text(length, '\0');
  source.read(8, text.data(), length);
  return {parse_header(source.name(), text, size - 8 - length), 8 + length};
}

NamedTensors load(ByteSource& source, Device device, const Loc& where) {
  // A device that does not exist is the caller's error, found before any reading.
  const Device target = resolve_device(device);
  const auto [header, data_offset] = read_header(source);
  NamedTensors out;
  out.reserve(header.entries.size());
  for (const Entry& e : header.entries) {
    BufferView buffer = allocate_buffer(Device::cpu(), e.dtype, e.shape);
    const uint64_t nbytes = e.end - e.begin;
    source.read(data_offset + e.begin, buffer.data(), nbytes);
    // A bool is one byte that is 0 or 1: kernels read it as C++ bool, for which anything else
    // is undefined. PyTorch writes nothing else.
    if (e.dtype == DType::Bool) {
      const auto* bytes = static_cast<const unsigned char*>(buffer.data());
      for (uint64_t i = 0; i < nbytes; ++i)
        if (bytes[i] > 1)
          fail(source.name(), "tensor ", in_quotes(e.name), ": BOOL element ", i, " is the byte ",
               static_cast<int>(bytes[i]), ", not 0 or 1");
    }
    out.emplace_back(e.name, Tensor(make_leaf(std::move(buffer), SourceLoc::from(where))));
  }
  if (!target.is_cpu()) {
    std::vector<Tensor> moved;
    moved.reserve(out.size());
    for (auto& [name, t] : out) {
      t = t.to(target, where);
      moved.push_back(t);
    }
    // One evaluation copies them all, and each becomes a computed tensor on the device.
    eval(moved);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

struct Planned {
  const std::string* name;
  const Tensor* tensor;
  uint64_t nbytes;
};

// The header safetensors writes for `tensors` and the order their data follows in.
std::pair<std::string, std::vector<Planned>> plan(
    const std::string& source, const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<Planned> planned;
  std::set<std::string_view> names;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey)
      fail(source, "the name ", in_quotes(name), " is reserved for the file's metadata");
    if (!names.insert(name).second) fail(source, "the name ", in_quotes(name), " is given twice");
    if (!valid_utf8(name)) fail(source, "the name ", in_quotes(name), " is not valid UTF-8");
    if (!tensor.defined()) fail(source, "tensor ", in_quotes(name), " is undefined");
    planned.push_back(
        {&name, &tensor, static_cast<uint64_t>(tensor.numel() * dtype_size(tensor.dtype()))});
  }
  for (const auto& [key, value] : metadata)
    if (!valid_utf8(key) || !valid_utf8(value))
      fail(source, "metadata ", in_quotes(key), " is not valid UTF-8");
  // The reference writer's order: widest dtype first (by its enum's rank), then by name. Each
  // tensor then starts at a multiple of its element size, given the 8-byte header padding.
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    const int ra = layout_rank(a.tensor->dtype()), rb = layout_rank(b.tensor->dtype());
    if (ra != rb) return ra > rb;
    return *a.name < *b.name;
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    Json& m = header[std::string(kMetadataKey)] = Json::object();
    for (const auto& [key, value] : metadata) m[key] = value;
  }
  uint64_t offset = 0;
  for (const Planned& p : planned) {
    Json shape = Json::array();
    for (int64_t s : p.tensor->sizes()) shape.push_back(s);
    Json info = Json::object();
    info["dtype"] = file_dtype_name(p.tensor->dtype());
    info["shape"] = std::move(shape);
    info["data_offsets"] = Json::array({offset, offset + p.nbytes});
    header[*p.name] = std::move(info);
    offset += p.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return {std::move(text), std::move(planned)};
}

// A save's header and data, planned and evaluated: what remains can only fail writing.
struct Prepared {
  std::string header;
  std::vector<Planned> planned;
};

Prepared prepare(const std::string& source, const NamedTensors& tensors,
                 const std::map<std::string, std::string>& metadata) {
  auto [header, planned] = plan(source, tensors, metadata);
  std::vector<Tensor> all;
  all.reserve(planned.size());
  for (const Planned& p : planned) all.push_back(*p.tensor);
  eval(all);
  return {std::move(header), std::move(planned)};
}

// The file's bytes, through `sink`.
void emit(const Prepared& prepared, const std::function<void(const void*, size_t)>& sink) {
  unsigned char prefix[8];
  const uint64_t length = prepared.header.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(length >> (8 * i));
  sink(prefix, 8);
  sink(prepared.header.data(), prepared.header.size());
  for (const Planned& p : prepared.planned) {
    if (p.nbytes == 0) continue;
    // One tensor at a time on the host: a model on a GPU is never copied over whole.
    const BufferView host = copy_to_device(*p.tensor->value()->buffer, Device::cpu());
    sink(host.data(), p.nbytes);
  }
}

// A temporary file beside the target that becomes the target only once complete; removed if
// anything fails before.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path) {
    namespace fs = std::filesystem;
    const fs::path target(path);
    fs::path dir = target.parent_path();
    if (dir.empty()) dir = ".";
    static std::atomic<uint64_t> counter{0};
    // O_EXCL with a name of this process and a counter: no other writer shares it, and the
    // mode is 0666 less the umask, as for any new file (mkstemp's would be 0600).
    for (int attempt = 0; fd_ < 0; ++attempt) {
      temp_ = (dir /
               cat(".", target.filename().string(), ".tmp-", ::getpid(), "-", counter.fetch_add(1)))
                  .string();
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && (errno != EEXIST || attempt == 100))
        fail(path, "cannot create a temporary file in ", in_quotes(dir.string()), ": ",
             std::strerror(errno));
    }
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t count) {
    const auto* p = static_cast<const char*>(data);
    while (count > 0) {
      const ssize_t put = ::write(fd_, p, std::min<size_t>(count, 1 << 30));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) fail(path_, "cannot write ", in_quotes(temp_), ": ", std::strerror(errno));
      p += put;
      count -= static_cast<size_t>(put);
    }
  }

  // Flushes the data to disk before the rename, so that a crash leaves the old file or the
  // whole new one, not a new name over missing blocks.
  void commit() {
    if (::fsync(fd_) != 0)
      fail(path_, "cannot sync ", in_quotes(temp_), ": ", std::strerror(errno));
    const int closed = ::close(fd_);
    fd_ = -1;
    if (closed != 0) fail(path_, "cannot close ", in_quotes(temp_), ": ", std::strerror(errno));
    if (::rename(temp_.c_str(), path_.c_str()) != 0)
      fail(path_, "cannot rename ", in_quotes(temp_), " over it: ", std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything that can be refused, and the evaluation, come before the temporary file exists.
  const Prepared prepared = prepare(path, tensors, metadata);
  AtomicFile file(path);
  emit(prepared, [&](const void* data, size_t count) { file.write(data, count); });
  file.commit();
}

std::string save_safetensors_to_memory(const NamedTensors& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  const Prepared prepared = prepare("<memory>", tensors, metadata);
  std::string out;
  emit(prepared,
       [&](const void* data, size_t count) { out.append(static_cast<const char*>(data), count); });
  return out;
}

NamedTensors load_safetensors(const std::string& path, Device device, Loc where) {
  FileSource source(path);
  return load(source, device, where);
}

NamedTensors load_safetensors_from_memory(std::string_view bytes, Device device,
                                          const std::string& source, Loc where) {
  MemorySource memory(bytes, source);
  return load(memory, device, where);
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  FileSource source(path);
  return read_header(source).first.metadata;
}

namespace {

// A module's state as torch.nn.Module.state_dict() names it: parameters, then buffers. With
// `aliases`, every name of a tensor held under several (tied weights) is listed; without, its
// first alone.
NamedTensors module_state(const nn::Module& module, bool aliases) {
  NamedTensors state = module.named_parameters(true, !aliases);
  NamedTensors buffers = module.named_buffers(true, !aliases);
  for (auto& [name, buffer] : buffers) {
    const bool is_parameter = std::any_of(state.begin(), state.end(), [&](const auto& entry) {
      return entry.second.is_same(buffer);
    });
    if (aliases || !is_parameter) state.emplace_back(std::move(name), std::move(buffer));
  }
  return state;
}

}  // namespace

void save_safetensors(const std::string& path, const nn::Module& module,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module_state(module, /*aliases=*/false), metadata);
}

void load_safetensors(nn::Module& module, const std::string& path) {
  NamedTensors loaded = load_safetensors(path);
  std::map<std::string, Tensor> by_name(loaded.begin(), loaded.end());
  // One entry per tensor, with every name it is held under: a tied weight is loaded from
  // whichever of its names the file holds (the first that it holds), so files that kept either
  // name load.
  struct Target {
    Tensor tensor;
    std::vector<std::string> names;
    std::string found;  // the name it is loaded from
  };
  std::vector<Target> targets;
  for (auto& [name, tensor] : module_state(module, /*aliases=*/true)) {
    auto same = std::find_if(targets.begin(), targets.end(),
                             [&](const Target& t) { return t.tensor.is_same(tensor); });
    if (same == targets.end()) same = targets.insert(targets.end(), Target{tensor, {}, ""});
    same->names.push_back(name);
  }
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> expected;
  for (Target& target : targets) {
    for (const std::string& name : target.names) {
      expected.insert(name);
      if (target.found.empty() && by_name.contains(name)) target.found = name;
    }
    if (target.found.empty()) {
      missing.push_back(absl::StrCat("\"", target.names[0], "\""));
    } else if (by_name.at(target.found).sizes() != target.tensor.sizes()) {
      mismatched.push_back(absl::StrCat(
          "size mismatch for ", target.found, ": copying a param with shape ",
          shape_str(by_name.at(target.found).sizes()),
          " from checkpoint, the shape in current model is ", shape_str(target.tensor.sizes())));
    }
  }
  for (const auto& [name, tensor] : loaded)
    if (!expected.contains(name)) unexpected.push_back(absl::StrCat("\"", name, "\""));
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string message = absl::StrCat(path, ": Error(s) in loading the parameters of ",
                                       module.repr().substr(0, module.repr().find('(')), ":");
    if (!missing.empty())
      absl::StrAppend(&message, " Missing key(s): ", absl::StrJoin(missing, ", "), ".");
    if (!unexpected.empty())
      absl::StrAppend(&message, " Unexpected key(s): ", absl::StrJoin(unexpected, ", "), ".");
    for (const std::string& m : mismatched) absl::StrAppend(&message, " ", m, ".");
    throw SerializationError(message);
  }
  // Every value converted first, in one evaluation; only then does any tensor change.
  NoGradGuard no_grad;
  std::vector<Tensor> values;
  for (const Target& target : targets)
    values.push_back(by_name.at(target.found).to(target.tensor.device()).to(target.tensor.dtype()));
  eval(values);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].tensor.set_data(values[i]);
}

}  // namespace lazyfuse
