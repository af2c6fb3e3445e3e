#include "common/model/safetensors.h"

#include <cstring>

#include "common/base/strings.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

// Headers of real checkpoints are a few hundred KB; a larger length means a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::optional<size_t> ElementSize(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(const uint8_t* data, size_t size,
                                                                std::string_view source) {
  auto corrupt = [&](std::string_view what) {
    return absl::DataLossError(Str(source, ": ", what));
  };
  if (size < 8) {
    return corrupt(Str("file is ", size,
                                " bytes, too small to hold a safetensors header (truncated?)"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    return corrupt(Str("header length ", header_len, " is implausible (corrupt file?)"));
  }
  if (header_len > size - 8) {
    return corrupt(Str("header length ", header_len, " runs past the end of the ", size,
                                "-byte file (truncated?)"));
  }
  const std::string_view header(reinterpret_cast<const char*>(data + 8), header_len);
  Json j = Json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt("header is not a JSON object");

  const uint8_t* base = data + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    auto bad = [&](std::string_view what) {
      return corrupt(Str("tensor '", name, "': ", what));
    };
    const Json& t = it.value();
    if (!t.is_object()) return bad("entry is not an object");
    if (!t.contains("dtype") || !t["dtype"].is_string()) return bad("missing 'dtype'");
    if (!t.contains("shape") || !t["shape"].is_array()) return bad("missing 'shape'");
    if (!t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2 || !t["data_offsets"][0].is_number_unsigned() ||
        !t["data_offsets"][1].is_number_unsigned()) {
      return bad("'data_offsets' must be two non-negative integers");
    }
    SafetensorsTensor out;
    out.name = name;
    out.dtype_name = t["dtype"].get<std::string>();
    if (out.dtype_name == "F32") out.dtype = DType::kF32;
    if (out.dtype_name == "BF16") out.dtype = DType::kBF16;
    if (out.dtype_name == "F16") out.dtype = DType::kF16;
    const std::optional<size_t> elem = ElementSize(out.dtype_name);
    if (!elem) return bad(Str("unknown dtype '", out.dtype_name, "'"));
    uint64_t numel = 1;
    for (const Json& d : t["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape holds a non-integer or negative dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t{1} << 48) / dim) return bad("shape is implausibly large");
      numel *= dim;
      out.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = t["data_offsets"][0].get<uint64_t>();
    const uint64_t end = t["data_offsets"][1].get<uint64_t>();
    if (begin > end) return bad("data_offsets begin after they end");
    if (end > data_size) {
      return bad(Str("data_offsets [", begin, ", ", end, "] run past the end of the ",
                              data_size, "-byte data section (truncated file?)"));
    }
    if (end - begin != numel * *elem) {
      return bad(Str("holds ", end - begin, " bytes but shape [",
                              absl::StrJoin(out.shape, ", "), "] of ", out.dtype_name, " needs ",
                              numel * *elem));
    }
    out.data = base + begin;
    out.nbytes = end - begin;
    tensors.push_back(std::move(out));
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  PD_ASSIGN_OR_RETURN(file->tensors_, ParseSafetensors(mapped->data(), mapped->size(), path));
  file->file_ = std::move(mapped);
  for (size_t i = 0; i < file->tensors_.size(); ++i) {
    if (!file->index_.emplace(file->tensors_[i].name, i).second) {
      return absl::DataLossError(
          Str(path, ": tensor '", file->tensors_[i].name, "' appears twice"));
    }
  }
  return file;
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(AsAbsl(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace pdserve
