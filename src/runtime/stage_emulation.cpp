#include "runtime/stage_emulation.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/timer.h"

namespace afd {

namespace {

constexpr int64_t kCheckEveryNs = 100'000'000;

void sleep_us(double us) {
  if (us >= 1) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(std::llround(us))));
}

}  // namespace

Result<StageCosts> parse_stage_costs(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(source + ": not a JSON object");
  StageCosts c;
  for (const auto& [key, value] : j.items()) {
    double* field = key == "attention_us_per_token" ? &c.attention_us_per_token
                    : key == "ffn_us_per_row"       ? &c.ffn_us_per_row
                    : key == "ffn_us_per_batch"     ? &c.ffn_us_per_batch
                                                    : nullptr;
    if (!field)
      return invalid_argument(source + ": unknown key '" + key +
                              "' (attention_us_per_token, ffn_us_per_row, ffn_us_per_batch)");
    if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() <= 1e6))
      return invalid_argument(source + ": " + key + " must be a number in [0, 1e6]");
    *field = value.get<double>();
  }
  return c;
}

Result<std::shared_ptr<StageCostEmulation>> StageCostEmulation::open(const std::string& path) {
  std::shared_ptr<StageCostEmulation> e(new StageCostEmulation(path));
  std::lock_guard<std::mutex> l(e->mu_);
  AFD_RETURN_IF_ERROR(e->reload());
  return e;
}

Status StageCostEmulation::reload() {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return not_found("--emulate-stage-costs: cannot read '" + path_ + "'");
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (mtime == mtime_ns_ && size == size_) return Status();
  mtime_ns_ = mtime;
  size_ = size;
  std::ifstream in(path_);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return io_error("--emulate-stage-costs: cannot read '" + path_ + "'");
  AFD_ASSIGN_OR_RETURN(costs_, parse_stage_costs(ss.str(), "--emulate-stage-costs " + path_));
  spdlog::info("emulated stage costs from {}: attention {} us/token, FFN {} us/row + {} us/batch", path_,
               costs_.attention_us_per_token, costs_.ffn_us_per_row, costs_.ffn_us_per_batch);
  return Status();
}

StageCosts StageCostEmulation::current() {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t now = now_ns();
  if (now - checked_ns_ >= kCheckEveryNs) {
    checked_ns_ = now;
    Status s = reload();
    const std::string why = s.is_ok() ? std::string() : s.to_string();
    if (!why.empty() && why != last_error_) spdlog::warn("{} (keeping the last values)", why);
    last_error_ = why;
  }
  return costs_;
}

void StageCostEmulation::attention(int64_t tokens) {
  sleep_us(current().attention_us_per_token * static_cast<double>(tokens));
}

void StageCostEmulation::ffn(int64_t expert_rows) {
  const StageCosts c = current();
  sleep_us(c.ffn_us_per_row * static_cast<double>(expert_rows) + c.ffn_us_per_batch);
}

}  // namespace afd
