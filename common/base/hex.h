// Bytes as lowercase hex digits and back: handles and ids carried in text (endpoints, hellos).
#ifndef PDSERVE_COMMON_BASE_HEX_H_
#define PDSERVE_COMMON_BASE_HEX_H_

#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"

namespace pdserve {

std::string HexEncode(std::string_view bytes);
// InvalidArgument for an odd length or a character that is not a lowercase hex digit.
absl::StatusOr<std::string> HexDecode(std::string_view hex);

// A trivially copyable value's bytes (a CUDA IPC handle, an ncclUniqueId) as hex, and back:
// false unless `hex` holds exactly sizeof(T) bytes.
template <typename T>
std::string HexOf(const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  return HexEncode(std::string_view(reinterpret_cast<const char*>(&v), sizeof(T)));
}
template <typename T>
bool FromHex(std::string_view hex, T* v) {
  static_assert(std::is_trivially_copyable_v<T>);
  auto bytes = HexDecode(hex);
  if (!bytes.ok() || bytes->size() != sizeof(T)) return false;
  std::memcpy(v, bytes->data(), sizeof(T));
  return true;
}

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_HEX_H_
