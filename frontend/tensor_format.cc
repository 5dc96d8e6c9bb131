// PyTorch's tensor printing, reimplemented after torch/_tensor_str.py (default print options).
// The structure mirrors PyTorch's on purpose: one formatter built from the elements that will be
// shown (so width and notation come from those alone, as with get_summarized_data), then a
// recursive walk that nests brackets, wraps long rows and inserts "..." for summarised dims.
#include "lazyfuse/frontend/tensor_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

// PyTorch's PRINT_OPTS defaults; sci_mode=None means the formatter chooses.
constexpr int kPrecision = 4;
constexpr int64_t kThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;
// len("tensor("): everything nested is indented relative to the opening bracket.
constexpr int64_t kPrefixIndent = 7;

// printf-style formatting into a std::string; two passes because "%.4f" of a large double can
// run to hundreds of characters.
template <typename... Args>
std::string printf_string(const char* format, Args... args) {
  char small[64];
  int needed = std::snprintf(small, sizeof(small), format, args...);
  if (needed < static_cast<int>(sizeof(small))) return std::string(small, needed);
  std::string out(static_cast<size_t>(needed) + 1, '\0');
  std::snprintf(out.data(), out.size(), format, args...);
  out.resize(static_cast<size_t>(needed));
  return out;
}

// Python's float formatting spells non-finite values "nan", "inf" and "-inf" whatever the
// presentation type, and drops the sign of a NaN; C's printf would print "-nan".
bool non_finite_string(double value, std::string* out) {
  if (std::isnan(value)) {
    *out = "nan";
    return true;
  }
  if (std::isinf(value)) {
    *out = value > 0 ? "inf" : "-inf";
    return true;
  }
  return false;
}

// Python's "{:.Nf}". glibc's printf rounds the exact binary value correctly, as Python does.
std::string python_fixed(double value, int precision) {
  std::string out;
  if (non_finite_string(value, &out)) return out;
  return printf_string("%.*f", precision, value);
}

// Python's "{:.Ne}": both spell the exponent with a sign and at least two digits.
std::string python_sci(double value, int precision) {
  std::string out;
  if (non_finite_string(value, &out)) return out;
  return printf_string("%.*e", precision, value);
}

int64_t numel_of(const Shape& shape) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  return numel;
}

// Python's str(tuple(shape)): "(0, 3)", with the trailing comma of a 1-tuple.
std::string shape_tuple_string(const Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  out += ")";
  return out;
}

// The indices along one dim that get printed: all of them, or the first and last kEdgeItems
// when summarising a dim longer than 2 * kEdgeItems.
std::vector<int64_t> shown_indices(int64_t size, bool summarize) {
  std::vector<int64_t> indices;
  if (summarize && size > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) indices.push_back(i);
    for (int64_t i = size - kEdgeItems; i < size; ++i) indices.push_back(i);
  } else {
    for (int64_t i = 0; i < size; ++i) indices.push_back(i);
  }
  return indices;
}

// Flat offsets of the elements that get printed, i.e. of get_summarized_data(t).
void collect_shown(const Shape& shape, const Strides& strides, size_t dim, int64_t offset,
                   bool summarize, std::vector<int64_t>* out) {
  if (dim == shape.size()) {
    out->push_back(offset);
    return;
  }
  for (int64_t i : shown_indices(shape[dim], summarize)) {
    collect_shown(shape, strides, dim + 1, offset + i * strides[dim], summarize, out);
  }
}

// PyTorch's _Formatter: decides notation and a common width from the shown elements, then
// right-aligns every element to that width.
class ElementFormatter {
 public:
  ElementFormatter(const FormatInput& in, const double* values, const int64_t* int_values,
                   const std::vector<int64_t>& shown)
      : in_(in), values_(values), int_values_(int_values) {
    if (!in_.is_floating) {
      for (int64_t offset : shown) {
        max_width_ = std::max(max_width_, static_cast<int64_t>(raw_string(offset).size()));
      }
      return;
    }
    // Zeros and non-finite values take no part in choosing the notation or the width.
    std::vector<double> nonzero_finite;
    for (int64_t offset : shown) {
      double value = values_[offset];
      if (std::isfinite(value) && value != 0.0) nonzero_finite.push_back(value);
    }
    if (nonzero_finite.empty()) return;

    double abs_min = std::abs(nonzero_finite[0]);
    double abs_max = abs_min;
    for (double value : nonzero_finite) {
      abs_min = std::min(abs_min, std::abs(value));
      abs_max = std::max(abs_max, std::abs(value));
      if (value != std::ceil(value)) int_mode_ = false;
    }
    // Integral floats print as "3." so only a huge range or magnitude needs sci notation;
    // otherwise tiny magnitudes need it too, or "{:.4f}" would print them as zero.
    bool wide_range = abs_max / abs_min > 1000.0 || abs_max > 1.0e8;
    sci_mode_ = int_mode_ ? wide_range : (wide_range || abs_min < 1.0e-4);
    for (double value : nonzero_finite) {
      int64_t width;
      if (sci_mode_) {
        width = static_cast<int64_t>(python_sci(value, kPrecision).size());
      } else if (int_mode_) {
        // +1 for the "." that marks the tensor as floating.
        width = static_cast<int64_t>(python_fixed(value, 0).size()) + 1;
      } else {
        width = static_cast<int64_t>(python_fixed(value, kPrecision).size());
      }
      max_width_ = std::max(max_width_, width);
    }
  }

  int64_t width() const { return max_width_; }

  std::string format(int64_t offset) const {
    std::string text = raw_string(offset);
    if (static_cast<int64_t>(text.size()) >= max_width_) return text;
    return std::string(static_cast<size_t>(max_width_) - text.size(), ' ') + text;
  }

 private:
  // The element before padding.
  std::string raw_string(int64_t offset) const {
    if (in_.is_floating) {
      double value = values_[offset];
      if (sci_mode_) return python_sci(value, kPrecision);
      if (int_mode_) {
        std::string text = python_fixed(value, 0);
        if (std::isfinite(value)) text += ".";
        return text;
      }
      return python_fixed(value, kPrecision);
    }
    if (in_.is_bool) return values_[offset] != 0.0 ? "True" : "False";
    return std::to_string(int_values_[offset]);
  }

  const FormatInput& in_;
  const double* values_;
  const int64_t* int_values_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  int64_t max_width_ = 1;
};

// _vector_str: a 1-D row, wrapped so that each line holds as many elements as fit in the line
// width (counting ", " after each), continuation lines aligned one past the opening bracket.
std::string vector_string(const ElementFormatter& formatter, int64_t size, int64_t stride,
                          int64_t offset, int64_t indent, bool summarize) {
  int64_t element_length = formatter.width() + 2;
  // Floor division: with deep nesting the numerator can go negative.
  int64_t numerator = kLineWidth - indent;
  int64_t per_line = numerator / element_length;
  if (numerator % element_length != 0 && numerator < 0) --per_line;
  per_line = std::max<int64_t>(1, per_line);

  std::vector<std::string> items;
  if (summarize && size > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) items.push_back(formatter.format(offset + i * stride));
    // PyTorch's own placeholder; it counts as one element when wrapping.
    items.push_back(" ...");
    for (int64_t i = size - kEdgeItems; i < size; ++i) {
      items.push_back(formatter.format(offset + i * stride));
    }
  } else {
    for (int64_t i = 0; i < size; ++i) items.push_back(formatter.format(offset + i * stride));
  }

  std::string line_break = ",\n" + std::string(static_cast<size_t>(indent + 1), ' ');
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (static_cast<int64_t>(i) % per_line == 0) ? line_break : ", ";
    out += items[i];
  }
  out += "]";
  return out;
}

// _tensor_str_with_formatter: nests one bracket per dim; sub-blocks of a k-dim tensor are
// separated by k-1 newlines, so matrices of a 3-D tensor get a blank line between them.
std::string nested_string(const ElementFormatter& formatter, const Shape& shape,
                          const Strides& strides, size_t dim, int64_t offset, int64_t indent,
                          bool summarize) {
  size_t rank = shape.size() - dim;
  if (rank == 0) return formatter.format(offset);
  if (rank == 1) {
    return vector_string(formatter, shape[dim], strides[dim], offset, indent, summarize);
  }

  std::string separator =
      "," + std::string(rank - 1, '\n') + std::string(static_cast<size_t>(indent + 1), ' ');
  int64_t size = shape[dim];
  bool elide = summarize && size > 2 * kEdgeItems;
  std::string out = "[";
  bool first = true;
  for (int64_t i : shown_indices(size, summarize)) {
    if (!first) out += separator;
    first = false;
    if (elide && i == size - kEdgeItems) out += "..." + separator;
    out += nested_string(formatter, shape, strides, dim + 1, offset + i * strides[dim], indent + 1,
                         summarize);
  }
  out += "]";
  return out;
}

// _add_suffixes: ", suffix" normally, but a suffix that would overflow the line width starts a
// new line indented under the data. PyTorch's running line length is off by a couple of
// characters (it adds 1 to len - rfind("\n"), and rfind gives -1 on a single line); that is kept
// because it decides where the break falls.
std::string add_suffixes(const std::string& tensor_str, const std::vector<std::string>& suffixes,
                         int64_t indent) {
  std::string out = tensor_str;
  size_t newline = tensor_str.rfind('\n');
  int64_t newline_pos = newline == std::string::npos ? -1 : static_cast<int64_t>(newline);
  int64_t last_line_len = static_cast<int64_t>(tensor_str.size()) - newline_pos + 1;
  for (const std::string& suffix : suffixes) {
    int64_t suffix_len = static_cast<int64_t>(suffix.size());
    if (last_line_len + suffix_len + 2 > kLineWidth) {
      out += ",\n" + std::string(static_cast<size_t>(indent), ' ') + suffix;
      last_line_len = indent + suffix_len;
    } else {
      out += ", " + suffix;
      last_line_len += suffix_len + 2;
    }
  }
  out += ")";
  return out;
}

}  // namespace

std::string format_tensor(const FormatInput& in) {
  for (int64_t size : in.shape) {
    if (size < 0) {
      throw ShapeError("format_tensor: negative size in shape " + shape_tuple_string(in.shape));
    }
  }
  const int64_t numel = numel_of(in.shape);
  const size_t count = static_cast<size_t>(numel);

  // Pick the vector the dtype reads and check that it holds one value per element.
  const double* values = nullptr;
  const int64_t* int_values = nullptr;
  std::vector<double> bool_values;
  std::string_view source;
  size_t available = 0;
  if (in.is_floating) {
    values = in.values.data();
    available = in.values.size();
    source = "values";
  } else if (in.is_bool) {
    if (in.values.size() != count && in.int_values.size() == count) {
      bool_values.assign(in.int_values.begin(), in.int_values.end());
      values = bool_values.data();
      available = bool_values.size();
    } else {
      values = in.values.data();
      available = in.values.size();
    }
    source = "values";
  } else {
    int_values = in.int_values.data();
    available = in.int_values.size();
    source = "int_values";
  }
  if (available != count) {
    throw ShapeError("format_tensor: shape " + shape_tuple_string(in.shape) + " has " +
                     std::to_string(numel) + " elements but " + std::string(source) + " holds " +
                     std::to_string(available));
  }

  std::vector<std::string> suffixes;
  if (!in.device_suffix.empty()) suffixes.push_back(in.device_suffix);

  std::string body;
  if (numel == 0) {
    // NumPy-style: the shape is spelled out unless it is the plain (0,).
    if (in.shape.size() != 1) suffixes.push_back("size=" + shape_tuple_string(in.shape));
    body = "[]";
  } else {
    Strides strides(in.shape.size(), 1);
    for (size_t d = in.shape.size(); d-- > 1;) strides[d - 1] = strides[d] * in.shape[d];
    const bool summarize = numel > kThreshold;
    std::vector<int64_t> shown;
    collect_shown(in.shape, strides, 0, 0, summarize, &shown);
    ElementFormatter formatter(in, values, int_values, shown);
    body = nested_string(formatter, in.shape, strides, 0, 0, kPrefixIndent, summarize);
  }
  if (!in.dtype_suffix.empty()) suffixes.push_back(in.dtype_suffix);
  if (!in.grad_suffix.empty()) suffixes.push_back(in.grad_suffix);

  return add_suffixes("tensor(" + body, suffixes, kPrefixIndent);
}

}  // namespace lazyfuse
