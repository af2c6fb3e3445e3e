// Small file helpers that report errors as absl::Status naming the path.
#ifndef PDSERVE_COMMON_BASE_FILE_UTIL_H_
#define PDSERVE_COMMON_BASE_FILE_UTIL_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pdserve {

absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes through a temporary file and rename(2), so readers never see a half-written file.
absl::Status WriteStringToFile(const std::string& path, std::string_view contents);
bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);
absl::Status MakeDirectories(const std::string& path);
std::string JoinPath(std::string_view dir, std::string_view name);
// The last component, ignoring trailing slashes ("models/llama/" -> "llama").
std::string BaseName(std::string_view path);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_FILE_UTIL_H_
