#include "plan/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace afd::plan {
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// "Nice" tick step for a range.
double tick_step(double span, int target) {
  const double raw = span / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

void panel_svg(std::ostringstream& o, const PlotPanel& p, double ox, double oy, double w, double h) {
  const double ml = 64, mr = 16, mt = 34, mb = 48;
  const double pw = w - ml - mr, ph = h - mt - mb;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = 0, y1 = -x0;
  for (const auto& s : p.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  y1 *= 1.08;
  auto X = [&](double v) { return ox + ml + (v - x0) / (x1 - x0) * pw; };
  auto Y = [&](double v) { return oy + mt + ph - (v - y0) / (y1 - y0) * ph; };
  o << "<text x='" << ox + w / 2 << "' y='" << oy + 20 << "' text-anchor='middle' font-size='14'>" << esc(p.title)
    << "</text>\n";
  o << "<rect x='" << ox + ml << "' y='" << oy + mt << "' width='" << pw << "' height='" << ph
    << "' fill='none' stroke='#444'/>\n";
  const double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
  for (double t = std::ceil(x0 / xs) * xs; t <= x1 + 1e-12; t += xs) {
    o << "<line x1='" << X(t) << "' y1='" << oy + mt + ph << "' x2='" << X(t) << "' y2='" << oy + mt + ph + 5
      << "' stroke='#444'/><text x='" << X(t) << "' y='" << oy + mt + ph + 18
      << "' text-anchor='middle' font-size='11'>" << num(t) << "</text>\n";
  }
  for (double t = std::ceil(y0 / ys) * ys; t <= y1 + 1e-12; t += ys) {
    o << "<line x1='" << ox + ml << "' y1='" << Y(t) << "' x2='" << ox + ml + pw << "' y2='" << Y(t)
      << "' stroke='#ddd'/><text x='" << ox + ml - 6 << "' y='" << Y(t) + 4
      << "' text-anchor='end' font-size='11'>" << num(t) << "</text>\n";
  }
  o << "<text x='" << ox + ml + pw / 2 << "' y='" << oy + h - 10 << "' text-anchor='middle' font-size='12'>"
    << esc(p.x_label) << "</text>\n";
  o << "<text transform='translate(" << ox + 16 << "," << oy + mt + ph / 2
    << ") rotate(-90)' text-anchor='middle' font-size='12'>" << esc(p.y_label) << "</text>\n";
  for (const auto& [vx, label] : p.v_lines) {
    if (vx < x0 || vx > x1) continue;
    o << "<line x1='" << X(vx) << "' y1='" << oy + mt << "' x2='" << X(vx) << "' y2='" << oy + mt + ph
      << "' stroke='#888' stroke-dasharray='2,3'/><text x='" << X(vx) + 4 << "' y='" << oy + mt + 14
      << "' font-size='11' fill='#555'>" << esc(label) << "</text>\n";
  }
  int li = 0;
  for (const auto& s : p.series) {
    if (s.line && s.x.size() > 1) {
      o << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.8'"
        << (s.dashed ? " stroke-dasharray='6,4'" : "") << " points='";
      for (size_t i = 0; i < s.x.size(); ++i) o << X(s.x[i]) << "," << Y(s.y[i]) << " ";
      o << "'/>\n";
    }
    if (s.markers)
      for (size_t i = 0; i < s.x.size(); ++i)
        o << "<circle cx='" << X(s.x[i]) << "' cy='" << Y(s.y[i]) << "' r='3.5' fill='" << s.color << "'/>\n";
    const double lx = ox + ml + pw - 150, ly = oy + mt + 12 + 16 * li++;
    o << "<line x1='" << lx << "' y1='" << ly - 4 << "' x2='" << lx + 22 << "' y2='" << ly - 4 << "' stroke='"
      << s.color << "' stroke-width='2'" << (s.dashed ? " stroke-dasharray='6,4'" : "") << "/><text x='" << lx + 28
      << "' y='" << ly << "' font-size='11'>" << esc(s.name) << "</text>\n";
  }
}

}  // namespace

std::string render_svg(const std::vector<PlotPanel>& panels, int panel_w, int panel_h) {
  std::ostringstream o;
  const int w = panel_w * static_cast<int>(std::max<size_t>(1, panels.size()));
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << panel_h << "' viewBox='0 0 " << w
    << " " << panel_h << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (size_t i = 0; i < panels.size(); ++i) panel_svg(o, panels[i], static_cast<double>(i) * panel_w, 0, panel_w, panel_h);
  o << "</svg>\n";
  return o.str();
}

std::string ratio_sweep_svg(const std::vector<SweepPoint>& pts, const SimConfig& base, double r_star) {
  PlotPanel thr{"Throughput per instance vs A/F ratio", "A/F ratio r", "tokens / time unit / instance", {}, {}};
  PlotPanel idle{"Idle ratios vs A/F ratio", "A/F ratio r", "idle fraction", {}, {}};
  PlotSeries sim_thr{"simulation", "#1f77b4", {}, {}, true, false, true};
  PlotSeries ea{"eta_A simulation", "#1f77b4", {}, {}, true, false, true};
  PlotSeries ef{"eta_F simulation", "#ff7f0e", {}, {}, true, false, true};
  double r_max = 0;
  for (const auto& p : pts) {
    const double r = p.spec.ratio();
    r_max = std::max(r_max, r);
    sim_thr.x.push_back(r);
    sim_thr.y.push_back(p.sim.throughput_per_instance);
    ea.x.push_back(r);
    ea.y.push_back(p.sim.eta_attn);
    ef.x.push_back(r);
    ef.y.push_back(p.sim.eta_ffn);
  }
  PlotSeries th{"theory (eq. 6)", "#d62728", {}, {}, false, true, true};
  PlotSeries tea{"eta_A theory", "#1f77b4", {}, {}, false, true, true};
  PlotSeries tef{"eta_F theory", "#ff7f0e", {}, {}, false, true, true};
  const double r_min = pts.empty() ? 0.5 : std::min(0.5, pts.front().spec.ratio());
  for (int i = 0; i <= 300; ++i) {
    const double r = r_min + (std::max(r_max, 1.0) - r_min) * i / 300.0;
    const TheoryPoint t = theory_point(base, r);
    th.x.push_back(r);
    th.y.push_back(t.throughput_per_instance);
    tea.x.push_back(r);
    tea.y.push_back(t.eta_attn);
    tef.x.push_back(r);
    tef.y.push_back(t.eta_ffn);
  }
  thr.series = {sim_thr, th};
  idle.series = {ea, ef, tea, tef};
  char lab[48];
  std::snprintf(lab, sizeof lab, "r* = %.2f", r_star);
  thr.v_lines.push_back({r_star, lab});
  idle.v_lines.push_back({r_star, lab});
  return render_svg({thr, idle});
}

}  // namespace afd::plan
