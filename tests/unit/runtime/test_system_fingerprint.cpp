// system_fingerprint: "fp_" + 16 hex digits, a function of the model fingerprint and of every
// option that changes the numbers (precision, KV dtype, batch invariance, the FFN device), and
// not of options that do not (threads, wiring, --deterministic in reference precision, which is
// batch-invariant without it); --deterministic with a CUDA FFN is refused.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "runtime/system_fingerprint.h"

namespace afd {
namespace {

TEST(SystemFingerprint, FormatAndInputs) {
  EngineOptions o;
  const std::string base = system_fingerprint(42, o);
  EXPECT_TRUE(std::regex_match(base, std::regex("fp_[0-9a-f]{16}"))) << base;
  EXPECT_EQ(system_fingerprint(42, o), base);  // a function of its inputs
  std::set<std::string> seen{base};
  EXPECT_TRUE(seen.insert(system_fingerprint(43, o)).second);  // other weights
  {
    EngineOptions d = o;
    d.deterministic = true;
    EXPECT_TRUE(seen.insert(system_fingerprint(42, d)).second);
  }
  {
    EngineOptions r = o;
    r.precision = Precision::reference;
    const std::string ref = system_fingerprint(42, r);
    EXPECT_TRUE(seen.insert(ref).second);
    r.kv.dtype = DType::f8_e4m3;  // reference precision keeps an f32 cache whatever is asked
    EXPECT_EQ(system_fingerprint(42, r), ref);
    r.deterministic = true;  // the same numbers: reference precision is batch-invariant anyway
    EXPECT_EQ(system_fingerprint(42, r), ref);
  }
  {
    EngineOptions k = o;
    k.kv.dtype = DType::f8_e4m3;
    EXPECT_TRUE(seen.insert(system_fingerprint(42, k)).second);
  }
  {
    EngineOptions c = o;
    c.ffn_device = "cuda";
    EXPECT_TRUE(seen.insert(system_fingerprint(42, c)).second);
  }
  {
    EngineOptions same = o;  // threads and wiring do not change the numbers under --deterministic
    same.n_threads = 3;
    same.topology = *parse_topology("2A2F");
    EXPECT_EQ(system_fingerprint(42, same), base);
  }
}

TEST(SystemFingerprint, DeterministicRefusesTheCudaFfn) {
  EngineOptions o;
  o.deterministic = true;
  EXPECT_TRUE(o.validate().is_ok());
  o.ffn_device = "cuda";
  const Status s = o.validate();
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("--deterministic needs the CPU FFN"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace afd
