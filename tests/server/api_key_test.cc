// --api-key's Bearer check.
#include "server/http/api_key.h"

#include "gtest/gtest.h"

namespace fpa::server {
namespace {

TEST(BearerMatches, OnlyTheExactKeyAfterBearer) {
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cret!", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3creT", "s3cret"));
  EXPECT_FALSE(bearer_matches("s3cret", "s3cret"));  // no scheme
  EXPECT_FALSE(bearer_matches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("", "s3cret"));
}

}  // namespace
}  // namespace fpa::server
