// afd eval's corpus handling (serve/text/documents.h): text checks and document splitting.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/text/documents.h"

namespace afd::serve {
namespace {

std::vector<std::string> split(std::string_view text, std::string_view sep) {
  std::vector<std::string> out;
  for (std::string_view d : split_documents(text, sep)) out.emplace_back(d);
  return out;
}

TEST(Documents, SplitAtBlankLinesTrimmedAndWithoutEmptyOnes) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("a b\n\nc\n", "\n\n"), (V{"a b", "c"}));
  EXPECT_EQ(split("\n\n a \n\n\n\nb\t\n\n\n", "\n\n"), (V{"a", "b"}));
  EXPECT_EQ(split("one\n\ntwo", ""), (V{"one\n\ntwo"}));
  EXPECT_EQ(split("x---y---", "---"), (V{"x", "y"}));
  EXPECT_TRUE(split("", "\n\n").empty());
  EXPECT_TRUE(split(" \n\n\t\r\n", "\n\n").empty());
  EXPECT_TRUE(split("  ", "").empty());
  EXPECT_EQ(split("caf\xc3\xa9\n\nna\xc3\xafve", "\n\n"), (V{"caf\xc3\xa9", "na\xc3\xafve"}));
}

TEST(Documents, BinaryOrInvalidUtf8IsNamedWithItsOffset) {
  EXPECT_TRUE(check_text_file("plain text, caf\xc3\xa9", "f.txt").is_ok());
  Status s = check_text_file(std::string("ab\0cd", 5), "f.txt");
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), "f.txt: binary or not UTF-8 (a NUL byte at byte offset 2)");
  s = check_text_file("caf\xe9 au lait", "g.txt");
  EXPECT_EQ(s.message(), "g.txt: binary or not UTF-8 (invalid UTF-8 at byte offset 3)");
  EXPECT_FALSE(check_text_file("\xc3", "h.txt").is_ok());  // truncated sequence
}

}  // namespace
}  // namespace afd::serve
