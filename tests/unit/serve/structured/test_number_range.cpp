#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/structured/number_range.h"

namespace afd::serve::test_number_range {
namespace {

Decimal dec(const char* json_text) { return *decimal_from_json(nlohmann::ordered_json::parse(json_text)); }

TEST(Decimal, ExactFromShortestText) {
  EXPECT_EQ(to_string(dec("0.1")), "0.1");
  EXPECT_EQ(to_string(dec("1e-5")), "0.00001");
  EXPECT_EQ(to_string(dec("-2.50")), "-2.5");
  EXPECT_EQ(to_string(dec("1.5e3")), "1500");
  EXPECT_EQ(to_string(dec("-0.0")), "0");
  EXPECT_EQ(to_string(dec("18446744073709551615")), "18446744073709551615");
  EXPECT_FALSE(decimal_from_json(nlohmann::ordered_json("x")).ok());
}

TEST(Decimal, CompareOrdersValues) {
  EXPECT_LT(compare(dec("-3"), dec("-2.5")), 0);
  EXPECT_GT(compare(dec("0.25"), dec("0.125")), 0);
  EXPECT_EQ(compare(dec("1.50"), dec("1.5")), 0);
  EXPECT_LT(compare(dec("9"), dec("10")), 0);
}

TEST(NumberRange, EmptyRangesAreNone) {
  GbnfBuilder b;
  NumberBounds no_int{dec("0.2"), false, dec("0.8"), false};
  EXPECT_FALSE(integer_range_gbnf(b, no_int).has_value());
  EXPECT_TRUE(decimal_range_gbnf(b, no_int).has_value());
  NumberBounds open_point{dec("1"), true, dec("1"), false};
  EXPECT_FALSE(decimal_range_gbnf(b, open_point).has_value());
  EXPECT_FALSE(integer_range_gbnf(b, open_point).has_value());
}

}  // namespace
}  // namespace afd::serve::test_number_range
