#include <gtest/gtest.h>

#include "core/check.h"
#include "core/status.h"

namespace afd::test_status {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value must be positive, got " + std::to_string(v));
  return v;
}

Result<int> doubled(int v) {
  AFD_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(Status, OkAndError) {
  EXPECT_TRUE(Status().is_ok());
  Status s = not_found("model.safetensors");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::not_found);
  EXPECT_EQ(s.to_string(), "not_found: model.safetensors");
  EXPECT_EQ(s.with_context("loading").message(), "loading: model.safetensors");
}

// The message lives behind a pointer that is null when empty: copies must still be deep,
// moves must leave a valid (empty-message) Status, and an empty message reads as "".
TEST(Status, CopiesMovesAndEmptyMessages) {
  Status a = unavailable("peer 'ffn0' is gone");
  Status b = a;  // copy
  EXPECT_EQ(b.message(), a.message());
  EXPECT_NE(&b.message(), &a.message());  // its own string
  Status c = std::move(a);
  EXPECT_EQ(c.code(), StatusCode::unavailable);
  EXPECT_EQ(c.message(), "peer 'ffn0' is gone");
  EXPECT_EQ(a.message(), "");  // NOLINT(bugprone-use-after-move): moved-from stays usable
  a = c;  // copy-assign over a moved-from one
  EXPECT_EQ(a.message(), c.message());
  a = a;  // self-assignment keeps it
  EXPECT_EQ(a.message(), "peer 'ffn0' is gone");
  Status empty(StatusCode::internal, "");
  EXPECT_FALSE(empty.is_ok());
  EXPECT_EQ(empty.message(), "");
  EXPECT_EQ(empty.to_string(), "internal: ");
  EXPECT_EQ(Status().message(), "");
  Status d = Status();
  d = b;
  EXPECT_EQ(d.to_string(), "unavailable: peer 'ffn0' is gone");
}

TEST(Result, PropagatesErrors) {
  auto ok = doubled(3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 6);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("-1"), std::string::npos);
}

TEST(Check, ThrowsWithLocation) {
  try {
    AFD_CHECK(1 + 1 == 3, "math");
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("test_status.cpp"), std::string::npos);
    EXPECT_NE(w.find("math"), std::string::npos);
  }
}

}  // namespace
}  // namespace afd::test_status
