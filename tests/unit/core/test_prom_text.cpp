#include <gtest/gtest.h>

#include <cmath>

#include "core/prom_text.h"

namespace afd::test_prom_text {
namespace {

TEST(PromText, SampleLineWithLabelsValueAndTimestamp) {
  PromSample s;
  ASSERT_TRUE(parse_prom_sample("afd_x_total{layer=\"3\", a_b=\"q\\\"\\\\\\n\",} 12.5 1700000000000\r", &s));
  EXPECT_EQ(s.name, "afd_x_total");
  ASSERT_EQ(s.labels.size(), 2u);
  EXPECT_EQ(s.labels[0].name, "layer");
  EXPECT_EQ(s.labels[0].quoted_value, "\"3\"");
  EXPECT_EQ(s.labels[1].quoted_value, "\"q\\\"\\\\\\n\"");
  EXPECT_EQ(s.value, 12.5);
  EXPECT_EQ(s.rest, "12.5 1700000000000");
  EXPECT_EQ(prom_label(s, "layer"), "3");
  EXPECT_EQ(prom_label(s, "a_b"), "q\"\\\n");
  EXPECT_EQ(prom_label(s, "expert"), std::nullopt);
}

TEST(PromText, BareSampleAndSpecialValues) {
  PromSample s;
  ASSERT_TRUE(parse_prom_sample("up 1", &s));
  EXPECT_TRUE(s.labels.empty());
  EXPECT_EQ(s.value, 1);
  ASSERT_TRUE(parse_prom_sample("x{} +Inf", &s));
  EXPECT_TRUE(std::isinf(s.value));
  ASSERT_TRUE(parse_prom_sample("x NaN", &s));
  EXPECT_TRUE(std::isnan(s.value));
}

TEST(PromText, LinesOutsideTheFormatAreRefused) {
  PromSample s;
  for (const char* bad : {"", " up 1", "1up 1", "up", "up one", "up 1 2.5", "up 1 2 3", "up{a=\"1\",a=\"2\"} 1",
                          "up{a=\"\\x\"} 1", "up{a=\"1\" 1", "up{a=1} 1", "up{=\"1\"} 1", "up{a=\"1\"b=\"2\"} 1"}) {
    EXPECT_FALSE(parse_prom_sample(bad, &s)) << bad;
  }
}

TEST(PromText, NamesEndAtTheFirstCharacterOutsideTheirSet) {
  size_t i = 0;
  EXPECT_EQ(take_prom_name("afd:a_1{x", &i), "afd:a_1");
  EXPECT_EQ(i, 7u);
  i = 0;
  EXPECT_EQ(take_prom_name("9a", &i), "");
  EXPECT_EQ(i, 0u);
}

}  // namespace
}  // namespace afd::test_prom_text
