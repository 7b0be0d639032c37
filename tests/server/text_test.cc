#include "server/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fpa::server {
namespace {

std::vector<int32_t> ids_of(const std::string& bytes) {
  std::vector<int32_t> ids;
  for (unsigned char c : bytes) ids.push_back(c);
  return ids;
}

TEST(EncodePrompt, BosThenBytes) {
  EXPECT_EQ(encode_prompt("h\xC3\xA9", 256), (std::vector<int32_t>{256, 104, 0xC3, 0xA9}));
  EXPECT_EQ(encode_prompt("", 256), (std::vector<int32_t>{256}));
}

TEST(Utf8Decoder, HoldsBackASplitCharacter) {
  Utf8Decoder d;
  EXPECT_EQ(d.push(ids_of("a\xE2")), "a");
  EXPECT_EQ(d.push(ids_of("\x82")), "");
  EXPECT_EQ(d.push(ids_of("\xAC!")), "\xE2\x82\xAC!");
  EXPECT_EQ(d.finish(), "");
}

TEST(Utf8Decoder, SpecialTokensCarryNoText) {
  Utf8Decoder d;
  EXPECT_EQ(d.push(std::vector<int32_t>{256, 'o', 257, 'k', 258}), "ok");
  EXPECT_EQ(d.bytes(), "ok");
}

TEST(Utf8Decoder, InvalidBytesBecomeOneReplacementPerMaximalSubpart) {
  const std::string fffd = "\xEF\xBF\xBD";
  Utf8Decoder d;
  // A lone continuation byte, an overlong lead, a truncated 3-byte sequence before ASCII and a
  // surrogate: the same answers as Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(d.push(ids_of("\x80")), fffd);
  EXPECT_EQ(d.push(ids_of("\xC0\xAF")), fffd + fffd);
  EXPECT_EQ(d.push(ids_of("\xE2\x82"
                          "A")),
            fffd + "A");
  EXPECT_EQ(d.push(ids_of("\xED\xA0\x80")), fffd + fffd + fffd);
}

TEST(Utf8Decoder, FinishFlushesATruncatedCharacter) {
  Utf8Decoder d;
  EXPECT_EQ(d.push(ids_of("x\xF0\x9F")), "x");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.finish(), "");
}

}  // namespace
}  // namespace fpa::server
