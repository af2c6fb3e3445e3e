// A GGUF file (llama.cpp's model format, versions 2 and 3): its metadata and its tensors, the
// tensors read in place from a memory mapping of the file. Everything in the file is untrusted:
// counts and lengths are checked against the bytes that remain before anything is allocated,
// offsets and sizes against the file, and every error names the key or tensor and the reason.
#ifndef PDSERVE_COMMON_MODEL_GGUF_H_
#define PDSERVE_COMMON_MODEL_GGUF_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/base/ggml_types.h"

namespace pdserve {

class MappedFile;

// GGUF's metadata value types (their ids in the file).
enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // Integers and bools as both signed and unsigned (`is_negative` says which one holds), floats
  // as double, strings as bytes; arrays as their elements (one element type each).
  uint64_t u = 0;
  int64_t i = 0;
  bool is_negative = false;
  double f = 0;
  std::string s;
  GgufValueType element_type = GgufValueType::kUint8;
  // Arrays: array_length elements in the file; `array` holds them all for the keys a loader
  // reads (tokenizer.ggml.*), else only the first kPreviewElements (an array of metadata
  // nobody reads costs no memory per element: 8M empty strings were 0.9 GB).
  std::vector<GgufValue> array;
  uint64_t array_length = 0;
  // A top-level value's bytes in the file (after its type), so a value held in part can be
  // copied whole (gguf convert); empty for values made in memory.
  std::string_view encoded;
  bool held_whole() const {
    return type != GgufValueType::kArray || encoded.empty() || array.size() == array_length;
  }

  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64; }
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  // GGUF's order: dims[0] is the innermost (a matrix's columns), so a [rows][cols] matrix has
  // dims {cols, rows}.
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;  // In the mapping, `alignment`-aligned.
  size_t bytes = 0;
  int64_t elements() const;
};

// Thread-safe after Open (immutable).
class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // The same from bytes in memory (tests, the fuzzer); `data` must outlive the result.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                         std::string_view source);
  ~GgufFile();

  uint32_t version() const { return version_; }
  const std::string& source() const { return source_; }
  const GgufValue* Find(std::string_view key) const;
  // Typed lookups: NotFound naming the key when absent, InvalidArgument when of another type.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;  // Any non-negative integer.
  absl::StatusOr<double> GetFloat(std::string_view key) const;    // Any number.
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  const std::vector<std::string>& keys() const { return keys_; }  // In file order.

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;
  // MappedFile::Release when the file is mapped (Open), else nothing.
  void ReleasePages(const void* p, size_t n) const;

  // Bounds of what a file may declare (far above any released model).
  static constexpr uint64_t kMaxTensors = 1 << 20;
  static constexpr uint64_t kMaxKeys = 1 << 20;
  static constexpr uint64_t kMaxArrayDepth = 4;
  // Array elements held in all (Gemma 3's 262k tokens with their scores and types, or Llama 3's
  // 128k tokens and 280k merges, are well below); each costs ~100 bytes of memory.
  static constexpr uint64_t kMaxArrayElements = uint64_t{1} << 21;
  // What is held of an array no loader reads (gguf inspect shows them).
  static constexpr uint64_t kPreviewElements = 16;
  static constexpr uint64_t kMaxDims = 4;

 private:
  GgufFile() = default;
  std::unique_ptr<MappedFile> file_;
  std::string source_;
  uint32_t version_ = 0;
  std::vector<std::string> keys_;
  absl::flat_hash_map<std::string, GgufValue> values_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_GGUF_H_
