// The float64 golden of MTP draft ids (tests/reference/mtp/<case>/mtp_drafts.json, written by
// tests/reference/make_golden_mtp.py), as test_mtp_head and test_mtp_drafter read it.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace afd::test {

// The two cases: an MTP layer with its own embed_tokens / shared_head.head, and one without.
inline const std::string kMtpOwnHead = AFD_SOURCE_DIR "/tests/reference/mtp/dsv3_mtp_own_head";
inline const std::string kMtpSharedHead = AFD_SOURCE_DIR "/tests/reference/mtp/dsv3_mtp_shared_head";

// A draft whose top-1 / top-2 logit margin in the reference is below this is not compared, nor
// are the drafts after it at that position (they follow from it). The float32 run of the
// reference deviates from float64 by about 1e-5 in the logits.
constexpr double kMtpMinMargin = 1e-3;

struct MtpGolden {
  int64_t k = 0;                                // drafts per position
  std::vector<std::vector<int32_t>> sequences;  // true tokens
  std::vector<int64_t> prompt_lengths;          // per sequence
  std::vector<std::vector<int64_t>> positions;  // rows [sequence, i, d1 .. dk]
  std::vector<std::vector<double>> margins;     // rows [m1 .. mk], beside positions
};

inline MtpGolden load_mtp_golden(const std::string& dir) {
  std::ifstream f(dir + "/mtp_drafts.json");
  const auto j = nlohmann::json::parse(f);
  MtpGolden g;
  g.k = j.at("k").get<int64_t>();
  g.sequences = j.at("sequences").get<std::vector<std::vector<int32_t>>>();
  g.prompt_lengths = j.at("prompt_lengths").get<std::vector<int64_t>>();
  g.positions = j.at("positions").get<std::vector<std::vector<int64_t>>>();
  g.margins = j.at("margins").get<std::vector<std::vector<double>>>();
  return g;
}

}  // namespace afd::test
