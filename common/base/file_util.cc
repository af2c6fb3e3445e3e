#include "common/base/file_util.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/base/strings.h"

namespace pdserve {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!FileExists(path)) return absl::NotFoundError(Str(path, ": no such file"));
    return absl::PermissionDeniedError(Str(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(Str(path, ": read failed"));
  return buf.str();
}

absl::Status WriteStringToFile(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          Str(tmp, ": cannot create: ", std::strerror(errno)));
    }
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);  // No half-written file is left behind.
      return absl::DataLossError(Str(path, ": write failed: ", std::strerror(err)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return absl::InternalError(Str(path, ": rename failed: ", ec.message()));
  }
  return absl::OkStatus();
}

bool FileExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

absl::Status MakeDirectories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::PermissionDeniedError(Str(path, ": cannot create: ", ec.message()));
  return absl::OkStatus();
}

std::string JoinPath(std::string_view dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return Str(dir, name);
  return Str(dir, "/", name);
}

std::string BaseName(std::string_view path) {
  const size_t end = path.find_last_not_of('/');
  if (end == std::string_view::npos) return std::string(path);
  const std::string_view trimmed = path.substr(0, end + 1);
  const size_t slash = trimmed.rfind('/');
  return std::string(slash == std::string_view::npos ? trimmed : trimmed.substr(slash + 1));
}

}  // namespace pdserve
