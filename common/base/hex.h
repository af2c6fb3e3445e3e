// Bytes as lowercase hex digits and back: handles and ids carried in text (endpoints, hellos).
#ifndef PDSERVE_COMMON_BASE_HEX_H_
#define PDSERVE_COMMON_BASE_HEX_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pdserve {

std::string HexEncode(std::string_view bytes);
// InvalidArgument for an odd length or a character that is not a lowercase hex digit.
absl::StatusOr<std::string> HexDecode(std::string_view hex);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_HEX_H_
