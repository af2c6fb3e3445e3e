#include "common/rpc/api_keys.h"

#include <grpcpp/server_context.h>

#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// Constant time in the contents: every byte of the longer string is looked at.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& file, std::string_view env_value) {
  ApiKeys out;
  if (!file.empty()) {
    auto text = ReadFileToString(file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(Str("--api-key-file: cannot read '", file, "': ",
                                            text.status().message()));
    }
    for (absl::string_view line : absl::StrSplit(AsAbsl(*text), '\n')) {
      std::string key = Trim(std::string_view(line.data(), line.size()));
      if (!key.empty() && key[0] != '#') out.keys_.push_back(std::move(key));
    }
    if (out.keys_.empty()) {
      return absl::InvalidArgumentError(Str("--api-key-file: '", file, "' holds no key"));
    }
  }
  for (absl::string_view part : absl::StrSplit(AsAbsl(env_value), ',')) {
    std::string key = Trim(std::string_view(part.data(), part.size()));
    if (!key.empty()) out.keys_.push_back(std::move(key));
  }
  return out;
}

bool ApiKeys::Matches(std::string_view presented) const {
  bool any = false;
  for (const std::string& k : keys_) any |= ConstantTimeEquals(presented, k);  // No early exit.
  return any;
}

absl::Status ApiKeys::Check(const grpc::ServerContextBase& context) const {
  if (!enabled()) return absl::OkStatus();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return CheckAuthorization(nullptr);
  const std::string_view value(it->second.data(), it->second.size());
  return CheckAuthorization(&value);
}

absl::Status ApiKeys::CheckAuthorization(const std::string_view* value) const {
  if (!enabled()) return absl::OkStatus();
  if (value == nullptr) {
    return absl::UnauthenticatedError("missing API key: send 'Authorization: Bearer <key>'");
  }
  constexpr std::string_view kBearer = "bearer";
  const std::string_view v = *value;
  bool scheme = v.size() > kBearer.size() && (v[kBearer.size()] == ' ' || v[kBearer.size()] == '\t');
  for (size_t i = 0; scheme && i < kBearer.size(); ++i) {
    scheme = (v[i] | 0x20) == kBearer[i];  // ASCII letters: case-insensitive.
  }
  if (!scheme) return absl::UnauthenticatedError("the Authorization value must be 'Bearer <key>'");
  const size_t start = v.find_first_not_of(" \t", kBearer.size());
  const std::string_view key = start == std::string_view::npos ? "" : v.substr(start);
  if (key.empty() || !Matches(key)) return absl::UnauthenticatedError("invalid API key");
  return absl::OkStatus();
}

}  // namespace pdserve
