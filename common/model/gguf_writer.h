// Writes GGUF files (version 3): metadata of every GGUF value type and tensors of any GgmlType,
// laid out as llama.cpp's writer lays them (tensor data aligned to general.alignment, 32 by
// default). The fixtures of the GGUF tests; the files are read back by llama.cpp's own gguf-py.
#ifndef PDSERVE_COMMON_MODEL_GGUF_WRITER_H_
#define PDSERVE_COMMON_MODEL_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/model/gguf.h"

namespace pdserve {

class GgufWriter {
 public:
  void SetString(std::string_view key, std::string_view value);
  void SetUint32(std::string_view key, uint32_t value);
  void SetInt32(std::string_view key, int32_t value);
  void SetUint64(std::string_view key, uint64_t value);
  void SetFloat32(std::string_view key, float value);
  void SetBool(std::string_view key, bool value);
  void SetStringArray(std::string_view key, const std::vector<std::string>& values);
  void SetInt32Array(std::string_view key, const std::vector<int32_t>& values);
  void SetFloat32Array(std::string_view key, const std::vector<float>& values);
  // Any value (GgufFile's representation), arrays nested as they are.
  void Set(std::string_view key, const GgufValue& value);

  // `dims` in GGUF's order (dims[0] = columns); `data` holds the tensor's bytes in `type`.
  void AddTensor(std::string_view name, GgmlType type, std::vector<int64_t> dims,
                 std::string data);

  absl::Status WriteFile(const std::string& path, uint64_t alignment = 32) const;
  std::string Serialize(uint64_t alignment = 32) const;

 private:
  // An integer type (or bool): `value` as both of GgufValue's integer fields.
  void SetInteger(std::string_view key, GgufValueType type, int64_t value);
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::string data;
  };
  int64_t kv_count_ = 0;
  std::string kv_;  // Encoded key/value pairs.
  std::vector<Tensor> tensors_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_GGUF_WRITER_H_
