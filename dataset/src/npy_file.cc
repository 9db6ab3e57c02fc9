#include "packfeed/dataset/npy_file.h"

#include <fcntl.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "packfeed/common/posix_file.h"
#include "packfeed/common/status_macros.h"

namespace packfeed::dataset {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

int ItemSize(absl::string_view descr) {
  if (descr == "|u1" || descr == "|i1") return 1;
  if (descr == "<i2" || descr == "<u2") return 2;
  if (descr == "<i4" || descr == "<u4") return 4;
  if (descr == "<i8" || descr == "<u8") return 8;
  return 0;
}

// The value of 'key' in the header dict, up to the next top-level comma.
absl::StatusOr<absl::string_view> HeaderValue(absl::string_view header, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "':");
  const size_t at = header.find(quoted);
  if (at == header.npos) return absl::DataLossError(absl::StrCat("no '", key, "' in the header"));
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(header.substr(at + quoted.size()));
  size_t end = 0;
  if (!rest.empty() && rest[0] == '(') {
    end = rest.find(')');
    if (end == rest.npos) return absl::DataLossError("an unclosed shape");
    return rest.substr(0, end + 1);
  }
  end = rest.find_first_of(",}");
  return absl::StripTrailingAsciiWhitespace(rest.substr(0, end));
}

absl::Status ParseHeader(absl::string_view header, NpyArray& out) {
  PF_ASSIGN_OR_RETURN(absl::string_view descr, HeaderValue(header, "descr"));
  if (descr.size() < 2 || descr.front() != '\'' || descr.back() != '\'') {
    return absl::DataLossError(absl::StrCat("descr ", descr, " is not a string"));
  }
  out.descr = std::string(descr.substr(1, descr.size() - 2));
  if (ItemSize(out.descr) == 0) {
    return absl::DataLossError(
        absl::StrCat("dtype '", out.descr, "' is not a little-endian integer type"));
  }
  PF_ASSIGN_OR_RETURN(absl::string_view fortran, HeaderValue(header, "fortran_order"));
  if (fortran != "False") return absl::DataLossError("Fortran order is not supported");
  PF_ASSIGN_OR_RETURN(absl::string_view shape, HeaderValue(header, "shape"));
  if (shape.size() < 2 || shape.front() != '(') {
    return absl::DataLossError(absl::StrCat("shape ", shape, " is not a tuple"));
  }
  for (absl::string_view dim :
       absl::StrSplit(shape.substr(1, shape.size() - 2), ',', absl::SkipWhitespace())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &n) || n < 0) {
      return absl::DataLossError(absl::StrCat("shape ", shape, " has a bad dimension"));
    }
    out.shape.push_back(n);
  }
  return absl::OkStatus();
}

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t NpyArray::IntAt(int64_t i) const {
  const int size = ItemSize(descr);
  const char* p = data.data() + i * size;
  const bool is_signed = descr[1] == 'i';
  switch (size) {
    case 1:
      return is_signed ? static_cast<int8_t>(*p) : static_cast<uint8_t>(*p);
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return is_signed ? static_cast<int16_t>(v) : v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return is_signed ? static_cast<int32_t>(v) : static_cast<int64_t>(v);
    }
    default: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view path) {
  auto fail = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": not a .npy file we read: ", why));
  };
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) return fail("bad magic");
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_length = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_length = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return fail("truncated header");
    uint32_t n;
    std::memcpy(&n, bytes.data() + 8, 4);
    header_length = n;
    header_start = 12;
  } else {
    return fail(absl::StrCat("version ", major));
  }
  if (bytes.size() < header_start + header_length) return fail("truncated header");
  NpyArray out;
  const absl::Status header = ParseHeader(bytes.substr(header_start, header_length), out);
  if (!header.ok()) return fail(header.message());
  const absl::string_view data = bytes.substr(header_start + header_length);
  const int64_t expected = out.elements() * ItemSize(out.descr);
  if (static_cast<int64_t>(data.size()) != expected) {
    return fail(absl::StrCat("shape (", absl::StrJoin(out.shape, ", "), ") of ", out.descr,
                             " needs ", expected, " data bytes, the file has ", data.size()));
  }
  out.data = std::string(data);
  return out;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  PF_ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  return ParseNpy(bytes, path);
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", array.descr,
                                    "', 'fortran_order': False, 'shape': (", shape, "), }");
  // numpy pads the header with spaces so the data starts 64-byte aligned.
  const size_t unpadded = kMagic.size() + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out(kMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out += array.data;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  ScopedFd file(fd);
  return WriteFully(file.get(), path, out);
}

NpyArray Int64Npy(std::vector<int64_t> values, std::vector<int64_t> shape) {
  NpyArray out;
  out.descr = "<i8";
  out.shape = std::move(shape);
  out.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  return out;
}

}  // namespace packfeed::dataset
