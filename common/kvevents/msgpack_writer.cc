#include "common/kvevents/msgpack_writer.h"

#include <cstring>

namespace pdserve {

void MsgpackWriter::BigEndian(uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void MsgpackWriter::Uint(uint64_t v) {
  if (v < 0x80) {
    Tag(static_cast<uint8_t>(v));  // positive fixint
  } else if (v <= 0xff) {
    Tag(0xcc);
    BigEndian(v, 1);
  } else if (v <= 0xffff) {
    Tag(0xcd);
    BigEndian(v, 2);
  } else if (v <= 0xffffffffULL) {
    Tag(0xce);
    BigEndian(v, 4);
  } else {
    Tag(0xcf);
    BigEndian(v, 8);
  }
}

void MsgpackWriter::Int(int64_t v) {
  if (v >= 0) {
    Uint(static_cast<uint64_t>(v));
  } else if (v >= -32) {
    Tag(static_cast<uint8_t>(static_cast<int8_t>(v)));  // negative fixint
  } else if (v >= INT8_MIN) {
    Tag(0xd0);
    BigEndian(static_cast<uint8_t>(static_cast<int8_t>(v)), 1);
  } else if (v >= INT16_MIN) {
    Tag(0xd1);
    BigEndian(static_cast<uint16_t>(static_cast<int16_t>(v)), 2);
  } else if (v >= INT32_MIN) {
    Tag(0xd2);
    BigEndian(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
  } else {
    Tag(0xd3);
    BigEndian(static_cast<uint64_t>(v), 8);
  }
}

void MsgpackWriter::Double(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  Tag(0xcb);
  BigEndian(bits, 8);
}

void MsgpackWriter::Length(uint32_t n, uint8_t fix_base, uint32_t fix_limit, uint8_t tag8,
                           uint8_t tag16, uint8_t tag32) {
  if (n < fix_limit) {
    Tag(static_cast<uint8_t>(fix_base | n));
  } else if (tag8 != 0 && n <= 0xff) {
    Tag(tag8);
    BigEndian(n, 1);
  } else if (n <= 0xffff) {
    Tag(tag16);
    BigEndian(n, 2);
  } else {
    Tag(tag32);
    BigEndian(n, 4);
  }
}

void MsgpackWriter::Str(std::string_view s) {
  Length(static_cast<uint32_t>(s.size()), 0xa0, 32, 0xd9, 0xda, 0xdb);
  out_.append(s);
}

void MsgpackWriter::Bin(std::string_view b) {
  // bin has no fix form: a limit of 0 never takes it.
  Length(static_cast<uint32_t>(b.size()), 0, 0, 0xc4, 0xc5, 0xc6);
  out_.append(b);
}

void MsgpackWriter::Array(uint32_t n) { Length(n, 0x90, 16, 0, 0xdc, 0xdd); }

void MsgpackWriter::Map(uint32_t n) { Length(n, 0x80, 16, 0, 0xde, 0xdf); }

}  // namespace pdserve
