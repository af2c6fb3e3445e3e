#include "common/model/gguf.h"

#include <cstring>
#include <limits>

#include "common/base/mapped_file.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32.
constexpr uint64_t kDefaultAlignment = 32;

// A bounds-checked cursor over the file. Every read says what it was reading, for the error.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, std::string_view source)
      : data_(data), size_(size), source_(source) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  absl::Status Bytes(void* out, size_t n, std::string_view what) {
    if (n > left()) {
      return absl::InvalidArgumentError(Str(source_, ": truncated while reading ", what, " (at byte ",
                                            pos_, ", needs ", n, ", ", left(), " left)"));
    }
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Get(std::string_view what) {
    T v{};
    absl::Status s = Bytes(&v, sizeof(T), what);
    if (!s.ok()) return s;
    return v;
  }
  absl::StatusOr<std::string> String(std::string_view what) {
    auto n = Get<uint64_t>(what);
    if (!n.ok()) return n.status();
    if (*n > left()) {
      return absl::InvalidArgumentError(Str(source_, ": ", what, ": a string of ", *n,
                                            " bytes runs past the end of the file"));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(*n));
    pos_ += static_cast<size_t>(*n);
    return s;
  }
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(Str(source_, ": ", message));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string_view source_;
};

// The smallest encoding of one value of a type: bounds an array's count by the bytes left.
size_t MinBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kString:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kArray: return 12;
  }
  return 1;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

template <typename T>
absl::Status ReadInt(Reader& r, std::string_view what, GgufValue* v) {
  auto x = r.Get<T>(what);
  if (!x.ok()) return x.status();
  if constexpr (std::numeric_limits<T>::is_signed) {
    v->i = static_cast<int64_t>(*x);
    v->is_negative = *x < 0;
    v->u = v->is_negative ? 0 : static_cast<uint64_t>(*x);
  } else {
    v->u = static_cast<uint64_t>(*x);
    v->i = v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(v->u);
  }
  v->f = static_cast<double>(*x);
  return absl::OkStatus();
}

// `elements_left`: array elements the whole file may still hold (each costs an in-memory value).
// `whole`: an array's elements are all held (else only the first kPreviewElements, the rest
// read and dropped).
absl::Status ReadValue(Reader& r, GgufValueType type, const std::string& key, int depth,
                       uint64_t* elements_left, bool whole, GgufValue* v) {
  v->type = type;
  switch (type) {
    case GgufValueType::kUint8: return ReadInt<uint8_t>(r, key, v);
    case GgufValueType::kInt8: return ReadInt<int8_t>(r, key, v);
    case GgufValueType::kUint16: return ReadInt<uint16_t>(r, key, v);
    case GgufValueType::kInt16: return ReadInt<int16_t>(r, key, v);
    case GgufValueType::kUint32: return ReadInt<uint32_t>(r, key, v);
    case GgufValueType::kInt32: return ReadInt<int32_t>(r, key, v);
    case GgufValueType::kUint64: return ReadInt<uint64_t>(r, key, v);
    case GgufValueType::kInt64: return ReadInt<int64_t>(r, key, v);
    case GgufValueType::kBool: {
      auto b = r.Get<uint8_t>(key);
      if (!b.ok()) return b.status();
      if (*b > 1) return r.Error(Str(key, ": a bool of value ", int{*b}));
      v->u = *b;
      v->i = *b;
      return absl::OkStatus();
    }
    case GgufValueType::kFloat32: {
      auto f = r.Get<float>(key);
      if (!f.ok()) return f.status();
      v->f = *f;
      return absl::OkStatus();
    }
    case GgufValueType::kFloat64: {
      auto f = r.Get<double>(key);
      if (!f.ok()) return f.status();
      v->f = *f;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      auto s = r.String(key);
      if (!s.ok()) return s.status();
      v->s = std::move(*s);
      return absl::OkStatus();
    }
    case GgufValueType::kArray: {
      if (depth >= static_cast<int>(GgufFile::kMaxArrayDepth)) {
        return r.Error(Str(key, ": arrays nest deeper than ", GgufFile::kMaxArrayDepth));
      }
      auto et = r.Get<uint32_t>(key);
      if (!et.ok()) return et.status();
      if (!KnownValueType(*et)) return r.Error(Str(key, ": unknown array element type ", *et));
      auto n = r.Get<uint64_t>(key);
      if (!n.ok()) return n.status();
      v->element_type = static_cast<GgufValueType>(*et);
      if (*n > r.left() / MinBytes(v->element_type)) {
        return r.Error(Str(key, ": an array of ", *n, " elements cannot fit in the ", r.left(),
                           " bytes left"));
      }
      v->array_length = *n;
      const uint64_t held = whole ? *n : std::min<uint64_t>(*n, GgufFile::kPreviewElements);
      if (held > *elements_left) {
        return r.Error(Str(key, ": arrays of more than ", GgufFile::kMaxArrayElements,
                           " elements in all"));
      }
      *elements_left -= held;
      v->array.resize(static_cast<size_t>(held));
      for (GgufValue& e : v->array) {
        absl::Status s = ReadValue(r, v->element_type, key, depth + 1, elements_left, whole, &e);
        if (!s.ok()) return s;
      }
      GgufValue dropped;  // The rest: checked, not kept.
      for (uint64_t i = held; i < *n; ++i) {
        dropped = GgufValue();
        absl::Status s = ReadValue(r, v->element_type, key, depth + 1, elements_left, false, &dropped);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
  }
  return r.Error(Str(key, ": unknown value type ", static_cast<uint32_t>(type)));
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64: return true;
    default: return false;
  }
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GgufFile::~GgufFile() = default;

void GgufFile::ReleasePages(const void* p, size_t n) const {
  if (file_ != nullptr) file_->Release(p, n);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  auto file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  auto parsed = Parse((*file)->data(), (*file)->size(), path);
  if (!parsed.ok()) return parsed.status();
  (*parsed)->file_ = std::move(*file);
  return parsed;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size,
                                                          std::string_view source) {
  auto g = std::unique_ptr<GgufFile>(new GgufFile());
  g->source_ = std::string(source);
  Reader r(data, size, g->source_);
  auto magic = r.Get<uint32_t>("the magic");
  if (!magic.ok()) return magic.status();
  if (*magic != kMagic) return r.Error("not a GGUF file (wrong magic)");
  auto version = r.Get<uint32_t>("the version");
  if (!version.ok()) return version.status();
  if (*version != 2 && *version != 3) {
    return r.Error(Str("GGUF version ", *version, " is not supported (2 and 3 are)"));
  }
  g->version_ = *version;
  auto tensor_count = r.Get<uint64_t>("the tensor count");
  if (!tensor_count.ok()) return tensor_count.status();
  auto kv_count = r.Get<uint64_t>("the metadata count");
  if (!kv_count.ok()) return kv_count.status();
  if (*tensor_count > kMaxTensors) return r.Error(Str(*tensor_count, " tensors; at most ", kMaxTensors));
  if (*kv_count > kMaxKeys) return r.Error(Str(*kv_count, " metadata keys; at most ", kMaxKeys));

  uint64_t elements_left = kMaxArrayElements;
  for (uint64_t k = 0; k < *kv_count; ++k) {
    auto key = r.String(Str("metadata key ", k));
    if (!key.ok()) return key.status();
    auto type = r.Get<uint32_t>(*key);
    if (!type.ok()) return type.status();
    if (!KnownValueType(*type)) return r.Error(Str(*key, ": unknown value type ", *type));
    GgufValue v;
    // Only the tokenizer's arrays are read by a loader; the rest are held in part.
    const bool whole = std::string_view(*key).substr(0, 15) == "tokenizer.ggml.";
    const size_t start = r.pos();
    absl::Status s = ReadValue(r, static_cast<GgufValueType>(*type), *key, 0, &elements_left, whole, &v);
    if (!s.ok()) return s;
    v.encoded = std::string_view(reinterpret_cast<const char*>(data) + start, r.pos() - start);
    if (g->values_.contains(AsAbsl(*key))) return r.Error(Str("metadata key ", *key, " appears twice"));
    g->keys_.push_back(*key);
    g->values_.emplace(std::move(*key), std::move(v));
  }

  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* a = g->Find("general.alignment")) {
    if (!a->is_integer() || a->is_negative || a->u == 0 || a->u > (1u << 20) ||
        (a->u & (a->u - 1)) != 0) {
      return r.Error("general.alignment must be a power of two up to 1 MiB");
    }
    alignment = a->u;
  }

  struct Info {
    uint64_t offset;
  };
  std::vector<Info> infos;
  g->tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(*tensor_count, r.left() / 24)));
  for (uint64_t t = 0; t < *tensor_count; ++t) {
    GgufTensor tensor;
    auto name = r.String(Str("tensor name ", t));
    if (!name.ok()) return name.status();
    tensor.name = std::move(*name);
    const std::string& n = tensor.name;
    auto ndims = r.Get<uint32_t>(n);
    if (!ndims.ok()) return ndims.status();
    if (*ndims == 0 || *ndims > kMaxDims) {
      return r.Error(Str("tensor ", n, ": ", *ndims, " dimensions (1 to ", kMaxDims, ")"));
    }
    int64_t elements = 1;
    for (uint32_t d = 0; d < *ndims; ++d) {
      auto dim = r.Get<uint64_t>(n);
      if (!dim.ok()) return dim.status();
      // Each dimension and the product stay far inside int64 (2^40 elements is 4 TB of f32); the
      // product is bounded by division, so the check itself cannot overflow (a fuzzer found it).
      if (*dim == 0 || *dim > (uint64_t{1} << 40) / static_cast<uint64_t>(elements)) {
        return r.Error(Str("tensor ", n, ": dimension ", d, " is ", *dim,
                           " (each in [1, 2^40], and so their product)"));
      }
      tensor.dims.push_back(static_cast<int64_t>(*dim));
      elements *= static_cast<int64_t>(*dim);
    }
    auto type = r.Get<uint32_t>(n);
    if (!type.ok()) return type.status();
    std::optional<GgmlType> gt = GgmlTypeFromId(*type);
    if (!gt) {
      return r.Error(Str("tensor ", n, ": type ", *type,
                         " is not supported (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)"));
    }
    tensor.type = *gt;
    if (tensor.dims[0] % GgmlBlockElements(*gt) != 0) {
      return r.Error(Str("tensor ", n, ": ", tensor.dims[0], " columns are not whole ",
                         GgmlTypeName(*gt), " blocks of ", GgmlBlockElements(*gt)));
    }
    tensor.bytes = static_cast<size_t>(elements / GgmlBlockElements(*gt) * GgmlBlockBytes(*gt));
    auto offset = r.Get<uint64_t>(n);
    if (!offset.ok()) return offset.status();
    if (*offset % alignment != 0) {
      return r.Error(Str("tensor ", n, ": offset ", *offset, " is not a multiple of the alignment ",
                         alignment));
    }
    if (g->tensor_index_.contains(AsAbsl(n))) return r.Error(Str("tensor ", n, " appears twice"));
    g->tensor_index_.emplace(n, g->tensors_.size());
    g->tensors_.push_back(std::move(tensor));
    infos.push_back({*offset});
  }
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  for (size_t t = 0; t < g->tensors_.size(); ++t) {
    GgufTensor& tensor = g->tensors_[t];
    const uint64_t offset = infos[t].offset;
    if (data_start > size || offset > size - data_start || tensor.bytes > size - data_start - offset) {
      return r.Error(Str("tensor ", tensor.name, ": its ", tensor.bytes, " bytes at offset ", offset,
                         " run past the end of the file (", size, " bytes; data from ", data_start,
                         ")"));
    }
    tensor.data = data + data_start + offset;
  }
  return g;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = values_.find(AsAbsl(key));
  return it == values_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(AsAbsl(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(Str(source_, ": no metadata key ", key));
  if (v->type != GgufValueType::kString) {
    return absl::InvalidArgumentError(Str(source_, ": metadata ", key, " is not a string"));
  }
  return v->s;
}

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(Str(source_, ": no metadata key ", key));
  if (!v->is_integer() || v->is_negative) {
    return absl::InvalidArgumentError(Str(source_, ": metadata ", key,
                                          " is not a non-negative integer"));
  }
  return v->u;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(Str(source_, ": no metadata key ", key));
  if (!v->is_number()) {
    return absl::InvalidArgumentError(Str(source_, ": metadata ", key, " is not a number"));
  }
  return v->f;
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(Str(source_, ": no metadata key ", key));
  if (v->type != GgufValueType::kBool) {
    return absl::InvalidArgumentError(Str(source_, ": metadata ", key, " is not a bool"));
  }
  return v->u != 0;
}

}  // namespace pdserve
