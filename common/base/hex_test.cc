#include "common/base/hex.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(HexTest, RoundTripsEveryByteAndRefusesWhatIsNotHex) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::string hex = HexEncode(all);
  EXPECT_EQ(hex.substr(0, 6), "000102");
  EXPECT_EQ(hex.substr(hex.size() - 4), "feff");
  EXPECT_EQ(*HexDecode(hex), all);
  EXPECT_FALSE(HexDecode("abc").ok());
  EXPECT_FALSE(HexDecode("zz").ok());
  EXPECT_FALSE(HexDecode("AB").ok()) << "lowercase only, as HexEncode writes";
}

}  // namespace
}  // namespace pdserve
