// Checkpoint: single-file and sharded directories, and broken indexes.
#include "model/checkpoint.h"

#include <gtest/gtest.h>

#include "model_test_util.h"

namespace afd::test_checkpoint {
namespace {

using test::safetensors_bytes;
using test::write_bytes;

std::string one_tensor(const std::string& name, float v) {
  std::string data(4, '\0');
  std::memcpy(data.data(), &v, 4);
  return safetensors_bytes("{\"" + name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data);
}

void expect_error(const Result<std::shared_ptr<Checkpoint>>& r, StatusCode code,
                  std::initializer_list<std::string> needles) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  for (const auto& n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
}

void write_index(const std::string& dir, const std::string& weight_map) {
  write_bytes(dir + "/model.safetensors.index.json", R"({"metadata":{"total_size":8},"weight_map":)" + weight_map + "}");
}

TEST(Checkpoint, SingleFile) {
  test::TempDir d;
  write_bytes(d.file("model.safetensors"), one_tensor("x", 3.5f));
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_FALSE((*ck)->sharded());
  EXPECT_EQ((*ck)->n_tensors(), 1u);
  auto t = (*ck)->get("x");
  ASSERT_TRUE(t.ok());
  float v;
  std::memcpy(&v, t->data, 4);
  EXPECT_EQ(v, 3.5f);
  EXPECT_EQ((*ck)->file_of("x"), d.file("model.safetensors"));
  EXPECT_EQ((*ck)->total_bytes(), 4u);
  auto missing = (*ck)->get("y");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
  EXPECT_NE(missing.status().message().find("'y'"), std::string::npos);
}

TEST(Checkpoint, ShardedReportsWhichFileHoldsWhat) {
  test::TempDir d;
  write_bytes(d.file("a.safetensors"), one_tensor("x", 1.0f));
  write_bytes(d.file("b.safetensors"), one_tensor("y", 2.0f));
  write_index(d.path(), R"({"x":"a.safetensors","y":"b.safetensors"})");
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE((*ck)->sharded());
  EXPECT_EQ((*ck)->files().size(), 2u);
  EXPECT_EQ((*ck)->file_of("x"), d.file("a.safetensors"));
  EXPECT_EQ((*ck)->file_of("y"), d.file("b.safetensors"));
  EXPECT_EQ((*ck)->tensor_names(), (std::vector<std::string>{"x", "y"}));
}

TEST(Checkpoint, EmptyDirectory) {
  test::TempDir d;
  expect_error(Checkpoint::open(d.path()), StatusCode::not_found, {d.path(), "model.safetensors"});
}

TEST(Checkpoint, IndexNotJson) {
  test::TempDir d;
  write_bytes(d.file("model.safetensors.index.json"), "{weight_map: nope");
  expect_error(Checkpoint::open(d.path()), StatusCode::corrupt_data, {"index.json", "not valid JSON"});
}

TEST(Checkpoint, IndexWithoutWeightMap) {
  test::TempDir d;
  write_bytes(d.file("model.safetensors.index.json"), R"({"metadata":{}})");
  expect_error(Checkpoint::open(d.path()), StatusCode::corrupt_data, {"index.json", "weight_map"});
}

TEST(Checkpoint, IndexNamesMissingShard) {
  test::TempDir d;
  write_bytes(d.file("a.safetensors"), one_tensor("x", 1.0f));
  write_index(d.path(), R"({"x":"a.safetensors","y":"model-00002-of-00002.safetensors"})");
  expect_error(Checkpoint::open(d.path()), StatusCode::not_found,
               {"model-00002-of-00002.safetensors", "'y'", "does not exist"});
}

TEST(Checkpoint, IndexPutsTensorInWrongShard) {
  test::TempDir d;
  write_bytes(d.file("a.safetensors"), one_tensor("x", 1.0f));
  write_bytes(d.file("b.safetensors"), one_tensor("y", 2.0f));
  write_index(d.path(), R"({"x":"b.safetensors","y":"b.safetensors"})");
  expect_error(Checkpoint::open(d.path()), StatusCode::corrupt_data, {"'x'", "b.safetensors", "does not contain"});
}

TEST(Checkpoint, TensorInTwoShards) {
  test::TempDir d;
  write_bytes(d.file("a.safetensors"), one_tensor("x", 1.0f));
  write_bytes(d.file("b.safetensors"), one_tensor("x", 2.0f));
  write_index(d.path(), R"({"x":"a.safetensors","z":"b.safetensors"})");
  expect_error(Checkpoint::open(d.path()), StatusCode::corrupt_data, {"'x'", "twice"});
}

TEST(Checkpoint, ShardNameOutsideDirectory) {
  test::TempDir d;
  write_index(d.path(), R"({"x":"../evil.safetensors"})");
  expect_error(Checkpoint::open(d.path()), StatusCode::corrupt_data, {"../evil.safetensors"});
}

TEST(Checkpoint, CorruptShardNamesShard) {
  test::TempDir d;
  write_bytes(d.file("a.safetensors"), one_tensor("x", 1.0f));
  write_bytes(d.file("b.safetensors"), "garbage!garbage!");
  write_index(d.path(), R"({"x":"a.safetensors","y":"b.safetensors"})");
  expect_error(Checkpoint::open(d.path()), StatusCode::corrupt_data, {"b.safetensors"});
}

}  // namespace
}  // namespace afd::test_checkpoint
