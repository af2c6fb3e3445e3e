#include "common/model/safetensors_writer.h"

#include "common/base/check.h"
#include "common/base/file_util.h"
#include "nlohmann/json.hpp"

namespace pdserve {

void SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                            const std::vector<float>& values) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  PD_CHECK(numel == static_cast<int64_t>(values.size()));
  const size_t begin = data_.size();
  data_.resize(begin + values.size() * DTypeSize(dtype));
  uint8_t* out = reinterpret_cast<uint8_t*>(data_.data() + begin);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(out + 4 * i, &values[i], 4);
        break;
      case DType::kBF16: {
        const uint16_t h = F32ToBf16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t h = F32ToF16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
    }
  }
  names_.push_back(name);
  entries_.push_back({std::move(name), dtype, std::move(shape), begin, data_.size()});
}

std::string SafetensorsWriter::Serialize() const {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (const Entry& e : entries_) {
    const char* dtype = e.dtype == DType::kF32 ? "F32" : e.dtype == DType::kBF16 ? "BF16" : "F16";
    header[e.name] = {{"dtype", dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + data_.size());
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += text;
  out += data_;
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  return WriteStringToFile(path, Serialize());
}

}  // namespace pdserve
