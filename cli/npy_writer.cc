#include "cli/npy_writer.h"

#include "common/base/file_util.h"
#include "common/base/strings.h"

namespace pdserve::cli {

absl::Status WriteNpyFloat32(const std::string& path, const std::vector<float>& data,
                             const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) StrAppendTo(&dims, d, ",");
  std::string header =
      Str("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  return WriteStringToFile(path, out);
}

}  // namespace pdserve::cli
