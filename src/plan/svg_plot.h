// Minimal SVG line charts (no dependencies): panels side by side, each with axes, ticks,
// series (solid/dashed lines, optional markers), a legend and optional vertical markers.
#pragma once

#include <string>
#include <vector>

#include "plan/sim_sweep.h"

namespace afd::plan {

struct PlotSeries {
  std::string name;
  std::string color = "#1f77b4";
  std::vector<double> x, y;
  bool markers = false;
  bool dashed = false;
  bool line = true;
};

struct PlotPanel {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
  std::vector<std::pair<double, std::string>> v_lines;  // x, label
};

std::string render_svg(const std::vector<PlotPanel>& panels, int panel_w = 520, int panel_h = 380);

// A/F ratio paper, Figures 4-5: throughput per instance vs r (simulation markers, theory curve,
// r* line) and idle ratios η_A, η_F vs r (simulation and theory).
std::string ratio_sweep_svg(const std::vector<SweepPoint>& pts, const SimConfig& base, double r_star);

}  // namespace afd::plan
