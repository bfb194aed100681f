// A model directory for an engine-less front end in tests: config.json of a reference model
// and generated tokenizer files, under a per-process name; and the model_config fingerprint
// an attention worker of that model reports on /health.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/fingerprint.h"
#include "serve/text/tokenizer_writer.h"

namespace afd::serve {

// Empty on failure (reported as a test failure).
inline std::string frontend_model_dir(const std::string& tag) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("afd_fe_" + tag + "_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string model = std::string(AFD_SOURCE_DIR) + "/tests/reference/data/qwen3_gqa2_top2_untied";
  std::filesystem::copy_file(model + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto cfg = load_model_config(dir);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  if (!cfg.ok()) return "";
  auto tok = write_tokenizer_files(dir, cfg->vocab_size);
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? dir : "";
}

// 16 hex digits ("" if the directory has no valid config).
inline std::string frontend_model_fingerprint(const std::string& dir) {
  auto cfg = load_model_config(dir);
  if (!cfg.ok()) return "";
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(model_config_fingerprint(*cfg)));
  return fp;
}

}  // namespace afd::serve
