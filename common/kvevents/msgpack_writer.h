// A MessagePack writer for the subset KV event batches use (nil, bool, integers, float64, str,
// bin, array and map headers), each in its smallest form, multi-byte values big-endian, as the
// specification (msgpack/spec.md) says.
#ifndef PDSERVE_COMMON_KVEVENTS_MSGPACK_WRITER_H_
#define PDSERVE_COMMON_KVEVENTS_MSGPACK_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace pdserve {

class MsgpackWriter {
 public:
  void Nil() { out_.push_back(static_cast<char>(0xc0)); }
  void Bool(bool v) { out_.push_back(static_cast<char>(v ? 0xc3 : 0xc2)); }
  void Uint(uint64_t v);
  void Int(int64_t v);
  void Double(double v);
  void Str(std::string_view s);
  void Bin(std::string_view b);
  void Array(uint32_t n);
  void Map(uint32_t n);

  const std::string& bytes() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Tag(uint8_t tag) { out_.push_back(static_cast<char>(tag)); }
  void BigEndian(uint64_t v, int bytes);
  // A length header: fix form below `fix_limit` (tag fix_base | n), else the 8/16/32-bit forms.
  void Length(uint32_t n, uint8_t fix_base, uint32_t fix_limit, uint8_t tag8, uint8_t tag16,
              uint8_t tag32);

  std::string out_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVEVENTS_MSGPACK_WRITER_H_
