#include "common/model/gguf_writer.h"

#include <cstring>

#include "common/base/file_util.h"

namespace pdserve {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

void PutValue(std::string* out, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kUint8: return Put<uint8_t>(out, static_cast<uint8_t>(v.u));
    case GgufValueType::kInt8: return Put<int8_t>(out, static_cast<int8_t>(v.i));
    case GgufValueType::kUint16: return Put<uint16_t>(out, static_cast<uint16_t>(v.u));
    case GgufValueType::kInt16: return Put<int16_t>(out, static_cast<int16_t>(v.i));
    case GgufValueType::kUint32: return Put<uint32_t>(out, static_cast<uint32_t>(v.u));
    case GgufValueType::kInt32: return Put<int32_t>(out, static_cast<int32_t>(v.i));
    case GgufValueType::kUint64: return Put<uint64_t>(out, v.u);
    case GgufValueType::kInt64: return Put<int64_t>(out, v.i);
    case GgufValueType::kFloat32: return Put<float>(out, static_cast<float>(v.f));
    case GgufValueType::kFloat64: return Put<double>(out, v.f);
    case GgufValueType::kBool: return Put<uint8_t>(out, v.u != 0 ? 1 : 0);
    case GgufValueType::kString: return PutString(out, v.s);
    case GgufValueType::kArray:
      if (!v.held_whole()) {  // Read in part from a file that is still open: its own bytes.
        out->append(v.encoded);
        return;
      }
      Put<uint32_t>(out, static_cast<uint32_t>(v.element_type));
      Put<uint64_t>(out, v.array.size());
      for (const GgufValue& e : v.array) PutValue(out, e);
      return;
  }
}

GgufValue Scalar(GgufValueType type) {
  GgufValue v;
  v.type = type;
  return v;
}

// An array of `element` values, each set from one item by `fill`.
template <typename T, typename Fill>
GgufValue ArrayOf(GgufValueType element, const std::vector<T>& items, Fill fill) {
  GgufValue v = Scalar(GgufValueType::kArray);
  v.element_type = element;
  for (const T& item : items) {
    GgufValue e = Scalar(element);
    fill(item, &e);
    v.array.push_back(std::move(e));
  }
  return v;
}

}  // namespace

void GgufWriter::Set(std::string_view key, const GgufValue& value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(value.type));
  PutValue(&kv_, value);
  ++kv_count_;
}

void GgufWriter::SetString(std::string_view key, std::string_view value) {
  GgufValue v = Scalar(GgufValueType::kString);
  v.s = std::string(value);
  Set(key, v);
}
void GgufWriter::SetUint32(std::string_view key, uint32_t value) {
  SetInteger(key, GgufValueType::kUint32, value);
}
void GgufWriter::SetInt32(std::string_view key, int32_t value) {
  SetInteger(key, GgufValueType::kInt32, value);
}
void GgufWriter::SetUint64(std::string_view key, uint64_t value) {
  SetInteger(key, GgufValueType::kUint64, static_cast<int64_t>(value));
}
void GgufWriter::SetBool(std::string_view key, bool value) {
  SetInteger(key, GgufValueType::kBool, value ? 1 : 0);
}
void GgufWriter::SetFloat32(std::string_view key, float value) {
  GgufValue v = Scalar(GgufValueType::kFloat32);
  v.f = value;
  Set(key, v);
}
void GgufWriter::SetInteger(std::string_view key, GgufValueType type, int64_t value) {
  GgufValue v = Scalar(type);
  v.i = value;
  v.u = static_cast<uint64_t>(value);
  Set(key, v);
}
void GgufWriter::SetStringArray(std::string_view key, const std::vector<std::string>& values) {
  Set(key, ArrayOf(GgufValueType::kString, values,
                   [](const std::string& x, GgufValue* e) { e->s = x; }));
}
void GgufWriter::SetInt32Array(std::string_view key, const std::vector<int32_t>& values) {
  Set(key, ArrayOf(GgufValueType::kInt32, values, [](int32_t x, GgufValue* e) { e->i = x; }));
}
void GgufWriter::SetFloat32Array(std::string_view key, const std::vector<float>& values) {
  Set(key, ArrayOf(GgufValueType::kFloat32, values, [](float x, GgufValue* e) { e->f = x; }));
}

void GgufWriter::AddTensor(std::string_view name, GgmlType type, std::vector<int64_t> dims,
                           std::string data) {
  tensors_.push_back({std::string(name), type, std::move(dims), std::move(data)});
}

std::string GgufWriter::Serialize(uint64_t alignment) const {
  std::string out;
  Put<uint32_t>(&out, 0x46554747);  // "GGUF"
  Put<uint32_t>(&out, 3);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, static_cast<uint64_t>(kv_count_));
  out += kv_;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, offset);
    offsets.push_back(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  for (const Tensor& t : tensors_) {
    out += t.data;
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path, uint64_t alignment) const {
  return WriteStringToFile(path, Serialize(alignment));
}

}  // namespace pdserve
