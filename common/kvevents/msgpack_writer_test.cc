#include "common/kvevents/msgpack_writer.h"

#include <gtest/gtest.h>

#include <string>

namespace pdserve {
namespace {

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// Expected bytes written out from the MessagePack specification's format table.
TEST(MsgpackWriter, EachFormAtItsBoundaries) {
  const struct {
    void (*write)(MsgpackWriter*);
    const char* hex;
  } cases[] = {
      {[](MsgpackWriter* w) { w->Nil(); }, "c0"},
      {[](MsgpackWriter* w) { w->Bool(true); }, "c3"},
      {[](MsgpackWriter* w) { w->Bool(false); }, "c2"},
      {[](MsgpackWriter* w) { w->Uint(0); }, "00"},
      {[](MsgpackWriter* w) { w->Uint(127); }, "7f"},
      {[](MsgpackWriter* w) { w->Uint(128); }, "cc80"},
      {[](MsgpackWriter* w) { w->Uint(256); }, "cd0100"},
      {[](MsgpackWriter* w) { w->Uint(65536); }, "ce00010000"},
      {[](MsgpackWriter* w) { w->Uint(0xffffffffffffffffULL); }, "cfffffffffffffffff"},
      {[](MsgpackWriter* w) { w->Int(-1); }, "ff"},
      {[](MsgpackWriter* w) { w->Int(-32); }, "e0"},
      {[](MsgpackWriter* w) { w->Int(-33); }, "d0df"},
      {[](MsgpackWriter* w) { w->Int(-129); }, "d1ff7f"},
      {[](MsgpackWriter* w) { w->Int(-32769); }, "d2ffff7fff"},
      {[](MsgpackWriter* w) { w->Int(INT64_MIN); }, "d38000000000000000"},
      {[](MsgpackWriter* w) { w->Int(300); }, "cd012c"},
      {[](MsgpackWriter* w) { w->Double(1.5); }, "cb3ff8000000000000"},
      {[](MsgpackWriter* w) { w->Str("GPU"); }, "a3475055"},
      {[](MsgpackWriter* w) { w->Bin("\x01"); }, "c40101"},
      {[](MsgpackWriter* w) { w->Array(15); }, "9f"},
      {[](MsgpackWriter* w) { w->Array(16); }, "dc0010"},
      {[](MsgpackWriter* w) { w->Array(70000); }, "dd00011170"},
      {[](MsgpackWriter* w) { w->Map(2); }, "82"},
  };
  for (const auto& c : cases) {
    MsgpackWriter w;
    c.write(&w);
    EXPECT_EQ(Hex(w.bytes()), c.hex);
  }
  MsgpackWriter w;  // Past fixstr's 31 bytes: str 8.
  w.Str(std::string(32, 'a'));
  std::string want = "d920";
  for (int i = 0; i < 32; ++i) want += "61";
  EXPECT_EQ(Hex(w.bytes()), want);
}

}  // namespace
}  // namespace pdserve
