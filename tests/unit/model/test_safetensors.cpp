// parse_safetensors / SafetensorsFile: valid files and every kind of lying header.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include "model_test_util.h"

namespace afd::test_safetensors {
namespace {

using test::safetensors_bytes;

Result<SafetensorsHeader> parse(const std::string& bytes) {
  return parse_safetensors(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                           "t.safetensors");
}

// Expects an error whose message contains every one of `needles`.
void expect_error(const std::string& bytes, StatusCode code, std::initializer_list<const char*> needles) {
  auto r = parse(bytes);
  ASSERT_FALSE(r.ok()) << "parsed a bad file";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find("t.safetensors"), std::string::npos) << r.status().message();
  for (const char* n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
}

const std::string kTwo =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
    R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})";

TEST(Safetensors, ParsesValidHeader) {
  auto r = parse(safetensors_bytes(kTwo, std::string(22, '\1')));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->metadata.at("format"), "pt");
  EXPECT_EQ(r->header_len, kTwo.size());
  EXPECT_EQ(r->data_offset, 8 + kTwo.size());
  EXPECT_EQ(r->data_size, 22u);
  const auto& a = r->tensors[0].name == "a" ? r->tensors[0] : r->tensors[1];
  const auto& b = r->tensors[0].name == "a" ? r->tensors[1] : r->tensors[0];
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a.numel(), 4);
  EXPECT_EQ(b.dtype, DType::bf16);
  EXPECT_EQ(b.begin, 16u);
  EXPECT_EQ(b.end, 22u);
}

TEST(Safetensors, AcceptsEmptyAndScalarTensorsAndGaps) {
  const std::string h =
      R"({"e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]},"s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})";
  auto r = parse(safetensors_bytes(h, std::string(12, '\0')));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensors.size(), 2u);
}

TEST(Safetensors, TooShortForLength) {
  expect_error(std::string(5, '\0'), StatusCode::corrupt_data, {"too short"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  std::string b = safetensors_bytes(kTwo, std::string(22, '\0'));
  b.resize(8 + kTwo.size() / 2);  // cut inside the header
  expect_error(b, StatusCode::corrupt_data, {"header length", "past the end of the file"});
}

TEST(Safetensors, HeaderLengthAboveLimit) {
  std::string b(16, '\0');
  b[7] = 0x10;  // 2^60
  expect_error(b, StatusCode::corrupt_data, {"exceeds"});
}

TEST(Safetensors, NotJson) {
  expect_error(safetensors_bytes("{\"a\": [1, 2", ""), StatusCode::corrupt_data, {"not valid JSON"});
  expect_error(safetensors_bytes(std::string("\xff\xfe{}", 4), ""), StatusCode::corrupt_data, {"not valid JSON"});
}

TEST(Safetensors, JsonButNotObject) {
  expect_error(safetensors_bytes("[1, 2, 3]", ""), StatusCode::corrupt_data, {"not an object"});
}

TEST(Safetensors, UnknownDtype) {
  auto r = parse(safetensors_bytes(R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", "ab"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::not_supported);
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos);
  EXPECT_NE(r.status().message().find("Q4_K"), std::string::npos);
}

TEST(Safetensors, MissingOrMistypedFields) {
  expect_error(safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"), StatusCode::corrupt_data,
               {"'w'", "dtype"});
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"), StatusCode::corrupt_data,
               {"'w'", "shape"});
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"), StatusCode::corrupt_data,
               {"'w'", "data_offsets"});
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "data_offsets"});
  expect_error(safetensors_bytes(R"({"w":[1,2]})", "abcd"), StatusCode::corrupt_data, {"'w'", "not an object"});
}

TEST(Safetensors, BadShapeEntries) {
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "shape entry -1"});
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "shape entry"});
  expect_error(safetensors_bytes(
                   R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "overflows"});
}

TEST(Safetensors, OffsetsPastData) {
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "past the end of the data"});
}

TEST(Safetensors, OffsetsReversed) {
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "begin > end"});
  expect_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd"),
               StatusCode::corrupt_data, {"'w'", "not non-negative"});
}

TEST(Safetensors, OffsetsDisagreeWithDtypeTimesShape) {
  expect_error(safetensors_bytes(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", "abcdefgh"),
               StatusCode::corrupt_data, {"'w'", "span 8 bytes", "needs 3 x 2"});
}

TEST(Safetensors, OverlappingTensors) {
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_error(safetensors_bytes(h, std::string(12, '\0')), StatusCode::corrupt_data, {"'a'", "'b'", "overlap"});
}

TEST(Safetensors, DuplicateNames) {
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect_error(safetensors_bytes(h, std::string(8, '\0')), StatusCode::corrupt_data, {"'a' twice"});
}

TEST(Safetensors, BadMetadata) {
  expect_error(safetensors_bytes(R"({"__metadata__":{"n":1}})", ""), StatusCode::corrupt_data, {"__metadata__", "'n'"});
  expect_error(safetensors_bytes(R"({"__metadata__":[1]})", ""), StatusCode::corrupt_data, {"__metadata__"});
}

TEST(SafetensorsFile, OpensAndPointsAtData) {
  test::TempDir dir;
  std::string data(22, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i);
  test::write_bytes(dir.file("m.safetensors"), safetensors_bytes(kTwo, data));
  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  for (size_t i = 0; i < f->header().tensors.size(); ++i) {
    EXPECT_EQ(f->tensor_data(i)[0], static_cast<uint8_t>(f->header().tensors[i].begin));
  }
}

TEST(SafetensorsFile, MissingFileNamesPath) {
  test::TempDir dir;
  auto f = SafetensorsFile::open(dir.file("nope.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::not_found);
  EXPECT_NE(f.status().message().find("nope.safetensors"), std::string::npos);
}

TEST(SafetensorsFile, TruncatedFileNamesPathAndTensor) {
  test::TempDir dir;
  std::string b = safetensors_bytes(kTwo, std::string(22, '\0'));
  b.resize(b.size() - 3);
  test::write_bytes(dir.file("cut.safetensors"), b);
  auto f = SafetensorsFile::open(dir.file("cut.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::corrupt_data);
  EXPECT_NE(f.status().message().find("cut.safetensors"), std::string::npos);
  EXPECT_NE(f.status().message().find("'b'"), std::string::npos);
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos);
}

TEST(SafetensorsFile, EmptyFile) {
  test::TempDir dir;
  test::write_bytes(dir.file("empty.safetensors"), "");
  auto f = SafetensorsFile::open(dir.file("empty.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("empty.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace afd::test_safetensors
