// Stop strings: where the scheduler sees one, and what text the HTTP API lets through.
#include "server/request/stop_strings.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fpa::server {
namespace {

// Pushes `pieces` one by one, as streamed tokens, and joins what comes out.
std::string stream(StopTrimmer& t, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += t.push(p);
  return out + t.finish("");
}

TEST(StopInTail, FindsAStopEndingInsideTheNewBytes) {
  const std::vector<std::string> stops = {"5"};
  EXPECT_TRUE(stop_in_tail(" 15", 1, stops));
  EXPECT_TRUE(stop_in_tail(" 15,", 2, stops));     // a token "5," holds the stop
  EXPECT_FALSE(stop_in_tail(" 15,", 1, stops));    // already seen at the previous token
  EXPECT_TRUE(stop_in_tail("ab\nc", 1, {"\nc"}));  // split across tokens
  EXPECT_FALSE(stop_in_tail("ab", 2, {"abc"}));
}

TEST(StopTrimmer, CutsTheStopAndWhatFollows) {
  StopTrimmer t({"5"}, false);
  EXPECT_EQ(stream(t, {" ", "1", "5", ","}), " 1");
}

TEST(StopTrimmer, HoldsBackAPossibleStopSplitAcrossTokens) {
  StopTrimmer t({"END"}, false);
  EXPECT_EQ(t.push("abE"), "ab");  // "E" could start "END"
  EXPECT_EQ(t.push("N"), "");
  EXPECT_EQ(t.push("D tail"), "");
  EXPECT_EQ(t.finish("more"), "");
}

TEST(StopTrimmer, ReleasesHeldTextThatDidNotBecomeAStop) {
  StopTrimmer t({"END"}, false);
  EXPECT_EQ(t.push("xE"), "x");
  EXPECT_EQ(t.push("Nx"), "ENx");
  EXPECT_EQ(t.push("EN"), "");
  EXPECT_EQ(t.finish(""), "EN");  // generation ended first: nothing is trimmed
}

TEST(StopTrimmer, IncludeStopKeepsTheStopString) {
  StopTrimmer t({"5"}, true);
  EXPECT_EQ(stream(t, {" 1", "5,", "6"}), " 15");
}

TEST(StopTrimmer, TheEarliestStopWins) {
  StopTrimmer t({"cd", "b"}, false);
  EXPECT_EQ(stream(t, {"abcd"}), "a");
}

TEST(StopTrimmer, StopHereEndsTheText) {
  StopTrimmer t({"zz"}, false);
  EXPECT_EQ(t.push("az"), "a");
  t.stop_here();
  EXPECT_EQ(t.push("b"), "");
  EXPECT_EQ(t.finish("c"), "");
}

TEST(StopTrimmer, NoStopsPassesEverything) {
  StopTrimmer t({}, false);
  EXPECT_EQ(stream(t, {"a", "b"}), "ab");
}

}  // namespace
}  // namespace fpa::server
