#include "plan/calibrate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "plan/text_file.h"

namespace afd::plan {

Result<std::vector<StageSample>> run_calibration_sweep(const StageSampler& sampler, const SweepSpec& spec) {
  if (!sampler) return invalid_argument("calibration: no stage sampler");
  if (spec.batches.empty() || spec.contexts.empty() || spec.repeats < 1)
    return invalid_argument("calibration: empty sweep");
  std::vector<StageSample> out;
  for (int64_t b : spec.batches) {
    for (int64_t ctx : spec.contexts) {
      if (b < 1 || ctx < 1) return invalid_argument("calibration: batch and context must be >= 1");
      for (int r = 0; r < spec.repeats; ++r) {
        auto s = sampler(b, b * ctx);
        if (!s.ok())
          return s.status().with_context("calibration sample batch=" + std::to_string(b) + " context=" + std::to_string(ctx));
        out.push_back(*s);
      }
    }
  }
  return out;
}

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> f;
  std::string cur;
  for (char c : line) {
    if (c == ',') {
      f.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  f.push_back(trim(cur));
  return f;
}

bool parse_double(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

}  // namespace

Result<std::vector<StageSample>> parse_samples_csv(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  std::map<std::string, size_t> col;
  std::vector<StageSample> out;
  int64_t line_no = 0;
  const char* required[] = {"batch", "token_load", "attention_s", "a2f_s", "ffn_s", "f2a_s"};
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    auto fields = split_csv(t);
    const std::string where = source + ":" + std::to_string(line_no);
    if (col.empty()) {
      for (size_t i = 0; i < fields.size(); ++i) {
        if (col.count(fields[i])) return corrupt_data(where + ": duplicate column '" + fields[i] + "'");
        col[fields[i]] = i;
      }
      for (const char* r : required)
        if (!col.count(r)) return corrupt_data(where + ": header lacks column '" + std::string(r) + "'");
      continue;
    }
    if (fields.size() != col.size())
      return corrupt_data(where + ": expected " + std::to_string(col.size()) + " fields, got " + std::to_string(fields.size()));
    auto get = [&](const char* name, double* v) -> Status {
      auto it = col.find(name);
      if (it == col.end()) return Status();
      if (!parse_double(fields[it->second], v)) return corrupt_data(where + ": column '" + name + "' is not a number");
      if (*v < 0) return corrupt_data(where + ": column '" + name + "' is negative");
      return Status();
    };
    double b = 0, tl = 0, ft = 0;
    StageSample s;
    AFD_RETURN_IF_ERROR(get("batch", &b));
    AFD_RETURN_IF_ERROR(get("token_load", &tl));
    AFD_RETURN_IF_ERROR(get("ffn_tokens", &ft));
    AFD_RETURN_IF_ERROR(get("attention_s", &s.attention_s));
    AFD_RETURN_IF_ERROR(get("a2f_s", &s.a2f_s));
    AFD_RETURN_IF_ERROR(get("ffn_s", &s.ffn_s));
    AFD_RETURN_IF_ERROR(get("f2a_s", &s.f2a_s));
    if (b < 1 || b > 1e12 || tl > 1e15 || ft > 1e12) return corrupt_data(where + ": batch/token_load out of range");
    s.batch = static_cast<int64_t>(b);
    s.token_load = static_cast<int64_t>(tl);
    s.ffn_tokens = static_cast<int64_t>(ft);
    out.push_back(s);
  }
  if (col.empty()) return corrupt_data(source + ": no header row");
  if (out.empty()) return corrupt_data(source + ": no samples");
  return out;
}

Result<std::vector<StageSample>> load_samples_csv(const std::string& path) {
  AFD_ASSIGN_OR_RETURN(const std::string text, read_text_file(path, "samples file"));
  return parse_samples_csv(text, path);
}

Result<LinearModel> fit_linear(const std::vector<double>& x, const std::vector<double>& y,
                               std::vector<double>* residuals) {
  const size_t n = x.size();
  if (n != y.size()) return invalid_argument("fit: x and y differ in length");
  if (n < 2) return invalid_argument("fit: need at least 2 samples");
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (!(sxx > 0)) return invalid_argument("fit: need at least 2 distinct x values");
  auto sse = [&](double a, double b) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += (y[i] - a * x[i] - b) * (y[i] - a * x[i] - b);
    return s;
  };
  double a = sxy / sxx, b = my - a * mx;
  if (a < 0 || b < 0) {
    // Boundary candidates: beta = 0 (alpha = Σxy/Σx², clipped at 0) and alpha = 0 (beta = mean y).
    double sx2 = 0, sxy0 = 0;
    for (size_t i = 0; i < n; ++i) {
      sx2 += x[i] * x[i];
      sxy0 += x[i] * y[i];
    }
    const double a0 = sx2 > 0 ? std::max(0.0, sxy0 / sx2) : 0.0;
    const double b1 = std::max(0.0, my);
    if (sse(a0, 0.0) <= sse(0.0, b1)) {
      a = a0;
      b = 0;
    } else {
      a = 0;
      b = b1;
    }
  }
  LinearModel m{a, b, LinearFitQuality{}};
  double ss_res = 0, max_abs = 0;
  if (residuals) residuals->assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const double r = y[i] - m.at(x[i]);
    ss_res += r * r;
    max_abs = std::max(max_abs, std::fabs(r));
    if (residuals) (*residuals)[i] = r;
  }
  m.fit->n = static_cast<int64_t>(n);
  m.fit->r2 = syy > 0 ? 1.0 - ss_res / syy : (ss_res == 0 ? 1.0 : 0.0);
  m.fit->rmse = std::sqrt(ss_res / n);
  m.fit->max_abs_residual = max_abs;
  return m;
}

Result<CalibrationResult> fit_profile(const std::vector<StageSample>& samples, const std::string& source) {
  std::vector<double> xa, ya, xf, yf, xc, yc;
  for (const auto& s : samples) {
    xa.push_back(static_cast<double>(s.token_load));
    ya.push_back(s.attention_s);
    xf.push_back(static_cast<double>(s.ffn_tokens > 0 ? s.ffn_tokens : s.batch));
    yf.push_back(s.ffn_s);
    xc.push_back(static_cast<double>(s.batch));
    yc.push_back(s.a2f_s + s.f2a_s);
  }
  CalibrationResult r;
  r.profile.time_unit = "s";
  r.profile.source = source;
  auto fa = fit_linear(xa, ya, &r.attention_residuals);
  if (!fa.ok()) return fa.status().with_context("attention (attention_s vs token_load)");
  auto ff = fit_linear(xf, yf, &r.ffn_residuals);
  if (!ff.ok()) return ff.status().with_context("ffn (ffn_s vs ffn_tokens)");
  auto fc = fit_linear(xc, yc, &r.comm_residuals);
  if (!fc.ok()) return fc.status().with_context("comm (a2f_s + f2a_s vs batch)");
  r.profile.attention = *fa;
  r.profile.ffn = *ff;
  r.profile.comm = *fc;
  if (!(r.profile.ffn.alpha > 0))
    return invalid_argument("ffn: fitted alpha is 0 (FFN time does not grow with tokens in these samples)");
  return r;
}

}  // namespace afd::plan
