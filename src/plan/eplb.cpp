#include "plan/eplb.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/prom_text.h"
#include "plan/text_file.h"

namespace afd::plan {
namespace {

using nlohmann::json;

constexpr const char* kCountsSeries = "afd_ffn_expert_tokens_total";
constexpr int64_t kMaxExperts = 65536;
constexpr int64_t kMaxWorkerExperts = int64_t{1} << 26;
constexpr const char* kExpertsSeries = "afd_ffn_routed_experts";

Status check_count(double c, const std::string& source, int64_t layer, int64_t expert) {
  if (!std::isfinite(c) || c < 0) {
    std::ostringstream m;
    m << source << ": layer " << layer << " expert " << expert << ": count " << c
      << " is not a finite non-negative number";
    return corrupt_data(m.str());
  }
  return {};
}

Result<ExpertCounts> counts_from_json(const json& j, const std::string& source) {
  ExpertCounts out;
  const json* layers = &j;
  bool explicit_ids = false;
  if (j.is_object()) {
    if (!j.contains("layers") || !j["layers"].is_array())
      return corrupt_data(source + ": expected \"layers\": an array of {\"layer\", \"counts\"}");
    layers = &j["layers"];
    explicit_ids = true;
    if (j.contains("n_experts")) {
      if (!j["n_experts"].is_number_integer() || j["n_experts"].get<int64_t>() < 1)
        return corrupt_data(source + ": \"n_experts\" must be a positive integer");
      out.n_experts = j["n_experts"].get<int64_t>();
    }
  } else if (!j.is_array()) {
    return corrupt_data(source + ": expected an object with \"layers\" or an array of count rows");
  }
  int64_t index = 0;
  for (const auto& row : *layers) {
    const json* counts = &row;
    int64_t layer = index;
    if (explicit_ids) {
      if (!row.is_object() || !row.contains("layer") || !row.contains("counts"))
        return corrupt_data(source + ": layers[" + std::to_string(index) + "] needs \"layer\" and \"counts\"");
      if (!row["layer"].is_number_integer() || row["layer"].get<int64_t>() < 0)
        return corrupt_data(source + ": layers[" + std::to_string(index) + "].layer must be a non-negative integer");
      layer = row["layer"].get<int64_t>();
      counts = &row["counts"];
    }
    if (!counts->is_array())
      return corrupt_data(source + ": layer " + std::to_string(layer) + ": counts must be an array of numbers");
    std::vector<double> c;
    c.reserve(counts->size());
    for (const auto& v : *counts) {
      if (!v.is_number())
        return corrupt_data(source + ": layer " + std::to_string(layer) + " expert " + std::to_string(c.size()) +
                            ": count is not a number");
      c.push_back(v.get<double>());
    }
    out.layer_ids.push_back(layer);
    out.counts.push_back(std::move(c));
    ++index;
  }
  if (out.n_experts == 0 && !out.counts.empty()) out.n_experts = static_cast<int64_t>(out.counts[0].size());
  return out;
}

bool parse_index(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 9) return false;
  int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + (ch - '0');
  }
  *out = v;
  return true;
}

Result<ExpertCounts> counts_from_prometheus(const std::string& text, const std::string& source) {
  const std::string series = kCountsSeries;
  const std::string experts_series = kExpertsSeries;
  std::map<int64_t, std::map<int64_t, double>> by_layer;
  int64_t n_experts = 0;
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const std::string where = source + ":" + std::to_string(line_no);
    size_t name_end = 0;
    const std::string_view name = take_prom_name(line, &name_end);
    if (name != series && name != experts_series) continue;  // other series and other lines are skipped
    PromSample sample;
    if (!parse_prom_sample(line, &sample))
      return corrupt_data(where + ": " + std::string(name) + ": not a valid Prometheus sample line");
    const double v = sample.value;
    if (name == experts_series) {
      if (!(v >= 1 && v <= (1 << 20) && v == std::floor(v)))
        return corrupt_data(where + ": " + experts_series + " must be a positive integer");
      if (n_experts != 0 && n_experts != static_cast<int64_t>(v))
        return corrupt_data(where + ": workers disagree on the number of routed experts");
      n_experts = static_cast<int64_t>(v);
      continue;
    }
    const std::optional<std::string> ls = prom_label(sample, "layer"), es = prom_label(sample, "expert");
    int64_t layer = 0, expert = 0;
    if (!ls || !es || !parse_index(*ls, &layer) || !parse_index(*es, &expert))
      return corrupt_data(where + ": expected integer labels layer=\"..\" and expert=\"..\"");
    if (Status s = check_count(v, where, layer, expert); !s.is_ok()) return s;
    by_layer[layer][expert] += v;
  }
  if (by_layer.empty()) return corrupt_data(source + ": no " + series + " samples");
  if (n_experts == 0) return corrupt_data(source + ": no " + experts_series + " sample (the number of routed experts)");
  ExpertCounts out;
  out.n_experts = n_experts;
  for (const auto& [layer, experts] : by_layer) {
    std::vector<double> row(static_cast<size_t>(n_experts), 0.0);  // pairs left out counted nothing
    for (const auto& [e, v] : experts) {
      if (e >= n_experts)
        return corrupt_data(source + ": layer " + std::to_string(layer) + " names expert " + std::to_string(e) +
                            " of " + std::to_string(n_experts));
      row[static_cast<size_t>(e)] = v;
    }
    out.layer_ids.push_back(layer);
    out.counts.push_back(std::move(row));
  }
  return out;
}

void fill_expert_workers(LayerPlacement* p, int64_t n_experts) {
  p->expert_workers.assign(static_cast<size_t>(n_experts), {});
  for (size_t w = 0; w < p->worker_experts.size(); ++w)
    for (int32_t e : p->worker_experts[w])
      if (e >= 0 && e < n_experts) p->expert_workers[static_cast<size_t>(e)].push_back(static_cast<int32_t>(w));
}

// Worker loads from the counts when each expert's tokens are split evenly over its replicas.
void fill_loads(LayerPlacement* p, const std::vector<double>& counts) {
  p->worker_load.assign(p->worker_experts.size(), 0.0);
  for (size_t w = 0; w < p->worker_experts.size(); ++w)
    for (int32_t e : p->worker_experts[w])
      p->worker_load[w] += counts[static_cast<size_t>(e)] /
                           static_cast<double>(p->expert_workers[static_cast<size_t>(e)].size());
}

}  // namespace

Status ExpertCounts::validate() const {
  if (counts.empty()) return corrupt_data("expert counts: no layers");
  if (n_experts < 1) return corrupt_data("expert counts: no experts");
  if (n_experts > kMaxExperts) return corrupt_data("expert counts: more than 65536 experts per layer");
  if (layer_ids.size() != counts.size()) return corrupt_data("expert counts: layer ids and rows differ in number");
  for (size_t l = 0; l < counts.size(); ++l) {
    if (l > 0 && layer_ids[l] <= layer_ids[l - 1])
      return corrupt_data("expert counts: layer " + std::to_string(layer_ids[l]) +
                          (layer_ids[l] == layer_ids[l - 1] ? " is repeated" : " is out of ascending order"));
    if (static_cast<int64_t>(counts[l].size()) != n_experts)
      return corrupt_data("expert counts: layer " + std::to_string(layer_ids[l]) + " has " +
                          std::to_string(counts[l].size()) + " experts, expected " + std::to_string(n_experts));
    for (size_t e = 0; e < counts[l].size(); ++e)
      if (Status s = check_count(counts[l][e], "expert counts", layer_ids[l], static_cast<int64_t>(e)); !s.is_ok())
        return s;
  }
  return {};
}

Result<ExpertCounts> parse_expert_counts(const std::string& text, const std::string& source) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return corrupt_data(source + ": empty");
  ExpertCounts out;
  if (text[first] == '{' || text[first] == '[') {
    auto j = parse_json(text, source);
    if (!j.ok()) return j.status();
    auto c = counts_from_json(j.value(), source);
    if (!c.ok()) return c.status();
    out = std::move(c.value());
  } else {
    auto c = counts_from_prometheus(text, source);
    if (!c.ok()) return c.status();
    out = std::move(c.value());
  }
  if (Status s = out.validate(); !s.is_ok()) return corrupt_data(source + ": " + s.message());
  return out;
}

Status check_counts_cover_model(const ExpertCounts& c, const ModelConfig& m) {
  if (c.n_experts != m.n_experts)
    return invalid_argument("the counts have " + std::to_string(c.n_experts) + " experts per layer, the model " +
                            std::to_string(m.n_experts));
  size_t row = 0;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const bool in_counts = row < c.layer_ids.size() && c.layer_ids[row] == l;
    if (m.is_moe_layer(l) && !in_counts)
      return invalid_argument("the counts have no row for layer " + std::to_string(l) + ", a MoE layer of the model");
    if (!m.is_moe_layer(l) && in_counts)
      return invalid_argument("the counts have a row for layer " + std::to_string(l) + ", which has no routed experts");
    if (in_counts) ++row;
  }
  if (row < c.layer_ids.size())
    return invalid_argument("the counts have a row for layer " + std::to_string(c.layer_ids[row]) + ", past the model's " +
                            std::to_string(m.n_layers) + " layers");
  return {};
}

Result<ExpertCounts> load_expert_counts(const std::string& path) {
  auto text = read_text_file(path, "expert counts file");
  if (!text.ok()) return text.status();
  return parse_expert_counts(text.value(), path);
}

double LayerPlacement::max_load() const {
  return worker_load.empty() ? 0.0 : *std::max_element(worker_load.begin(), worker_load.end());
}

double LayerPlacement::mean_load() const {
  if (worker_load.empty()) return 0.0;
  return std::accumulate(worker_load.begin(), worker_load.end(), 0.0) / static_cast<double>(worker_load.size());
}

double LayerPlacement::max_over_mean() const {
  const double mean = mean_load();
  return mean > 0 ? max_load() / mean : 1.0;
}

LayerPlacement contiguous_placement(const std::vector<double>& counts, int n_workers) {
  const int64_t n = static_cast<int64_t>(counts.size());
  LayerPlacement p;
  p.worker_experts.resize(static_cast<size_t>(n_workers));
  for (int q = 0; q < n_workers; ++q)
    for (int64_t e = q * n / n_workers; e < (q + 1) * n / n_workers; ++e)
      p.worker_experts[static_cast<size_t>(q)].push_back(static_cast<int32_t>(e));
  fill_expert_workers(&p, n);
  fill_loads(&p, counts);
  return p;
}

Status check_eplb_options(int64_t n_experts, const EplbOptions& o) {
  if (o.n_workers < 1) return invalid_argument("EPLB: the number of FFN workers must be at least 1");
  if (o.redundant < 0) return invalid_argument("EPLB: the number of redundant experts cannot be negative");
  if (n_experts > kMaxExperts || static_cast<int64_t>(o.n_workers) * n_experts > kMaxWorkerExperts)
    return invalid_argument("EPLB: " + std::to_string(n_experts) + " experts on " + std::to_string(o.n_workers) +
                            " workers is past the planner's size (experts <= 65536, workers * experts <= 2^26)");
  const int64_t slots = n_experts + o.redundant;
  if (slots % o.n_workers != 0)
    return invalid_argument("EPLB: " + std::to_string(n_experts) + " experts + " + std::to_string(o.redundant) +
                            " redundant = " + std::to_string(slots) + " replicas do not divide over " +
                            std::to_string(o.n_workers) + " workers (every worker holds the same number)");
  if (slots / o.n_workers > n_experts)
    return invalid_argument("EPLB: " + std::to_string(slots / o.n_workers) + " replicas per worker exceed the " +
                            std::to_string(n_experts) + " experts (a worker would hold an expert twice)");
  return {};
}

Result<LayerPlacement> eplb_placement(const std::vector<double>& counts, const EplbOptions& o) {
  const int64_t n = static_cast<int64_t>(counts.size());
  if (n < 1) return invalid_argument("EPLB: no experts");
  if (Status s = check_eplb_options(n, o); !s.is_ok()) return s;
  for (size_t e = 0; e < counts.size(); ++e)
    if (!std::isfinite(counts[e]) || counts[e] < 0)
      return invalid_argument("EPLB: expert " + std::to_string(e) + " has an invalid count");
  const int y = o.n_workers;
  const int64_t per_worker = (n + o.redundant) / y;

  // 1. Replicate: the expert with the most tokens per replica gets the next replica (ties: the
  //    lower id, so the plan is deterministic).
  std::vector<int64_t> replicas(static_cast<size_t>(n), 1);
  for (int64_t r = 0; r < o.redundant; ++r) {
    int64_t best = -1;
    double best_load = -1;
    for (int64_t e = 0; e < n; ++e) {
      if (replicas[static_cast<size_t>(e)] >= y) continue;  // one replica per worker at most
      const double l = counts[static_cast<size_t>(e)] / static_cast<double>(replicas[static_cast<size_t>(e)]);
      if (l > best_load) best_load = l, best = e;
    }
    if (best < 0) return invalid_argument("EPLB: more redundant replicas than workers to hold them");
    ++replicas[static_cast<size_t>(best)];
  }
  // check_eplb_options bounds the replicas per worker by E, so R <= (y - 1) * E and every
  // redundant replica found an expert with fewer than y replicas.
  const int64_t total = std::accumulate(replicas.begin(), replicas.end(), int64_t{0});

  // 2. Pack, heaviest replica first, onto the least-loaded worker with a free slot that does
  //    not hold the expert yet.
  struct Replica {
    double load;
    int32_t expert;
  };
  std::vector<Replica> items;
  items.reserve(static_cast<size_t>(total));
  for (int64_t e = 0; e < n; ++e)
    for (int64_t k = 0; k < replicas[static_cast<size_t>(e)]; ++k)
      items.push_back({counts[static_cast<size_t>(e)] / static_cast<double>(replicas[static_cast<size_t>(e)]),
                       static_cast<int32_t>(e)});
  std::stable_sort(items.begin(), items.end(), [](const Replica& a, const Replica& b) { return a.load > b.load; });
  LayerPlacement p;
  p.worker_experts.assign(static_cast<size_t>(y), {});
  std::vector<double> load(static_cast<size_t>(y), 0.0);
  std::vector<std::vector<uint8_t>> holds(static_cast<size_t>(y), std::vector<uint8_t>(static_cast<size_t>(n), 0));
  for (const Replica& it : items) {
    int best = -1;
    for (int w = 0; w < y; ++w) {
      if (static_cast<int64_t>(p.worker_experts[static_cast<size_t>(w)].size()) >= per_worker) continue;
      if (holds[static_cast<size_t>(w)][static_cast<size_t>(it.expert)]) continue;
      if (best < 0 || load[static_cast<size_t>(w)] < load[static_cast<size_t>(best)]) best = w;
    }
    if (best < 0) {
      // Every worker with a free slot holds this expert already (possible near the end of
      // the packing): a worker w2 that lacks it gives one of its replicas that the free worker
      // lacks to the free worker and takes this one.
      int free_w = -1;
      for (int w = 0; w < y && free_w < 0; ++w)
        if (static_cast<int64_t>(p.worker_experts[static_cast<size_t>(w)].size()) < per_worker) free_w = w;
      bool placed = false;
      for (int w2 = 0; w2 < y && !placed && free_w >= 0; ++w2) {
        if (holds[static_cast<size_t>(w2)][static_cast<size_t>(it.expert)]) continue;
        auto& v2 = p.worker_experts[static_cast<size_t>(w2)];
        for (size_t k = 0; k < v2.size(); ++k) {
          const int32_t other = v2[k];
          if (holds[static_cast<size_t>(free_w)][static_cast<size_t>(other)]) continue;
          const double lo = counts[static_cast<size_t>(other)] / static_cast<double>(replicas[static_cast<size_t>(other)]);
          v2[k] = it.expert;
          holds[static_cast<size_t>(w2)][static_cast<size_t>(other)] = 0;
          holds[static_cast<size_t>(w2)][static_cast<size_t>(it.expert)] = 1;
          load[static_cast<size_t>(w2)] += it.load - lo;
          p.worker_experts[static_cast<size_t>(free_w)].push_back(other);
          holds[static_cast<size_t>(free_w)][static_cast<size_t>(other)] = 1;
          load[static_cast<size_t>(free_w)] += lo;
          placed = true;
          break;
        }
      }
      if (!placed) return invalid_argument("EPLB: no worker can take a replica of expert " + std::to_string(it.expert));
      continue;
    }
    p.worker_experts[static_cast<size_t>(best)].push_back(it.expert);
    holds[static_cast<size_t>(best)][static_cast<size_t>(it.expert)] = 1;
    load[static_cast<size_t>(best)] += it.load;
  }

  // 3. Refine: swap a replica of the most-loaded worker with one of another worker when that
  //    lowers the larger of the two loads; stop when no swap helps or after a bounded number.
  auto replica_load = [&](int32_t e) {
    return counts[static_cast<size_t>(e)] / static_cast<double>(replicas[static_cast<size_t>(e)]);
  };
  // Each pass looks at (y - 1) * per_worker^2 pairs; the passes stop after kRefinePairs in all.
  constexpr int64_t kRefinePairs = int64_t{1} << 27;
  const int64_t pairs_per_pass = std::max<int64_t>(1, static_cast<int64_t>(y - 1) * per_worker * per_worker);
  const int64_t passes = std::min<int64_t>(4 * static_cast<int64_t>(y), kRefinePairs / pairs_per_pass);
  for (int64_t pass = 0; pass < passes; ++pass) {
    const int hi = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    double best_gain = 0;
    int best_w = -1;
    size_t best_a = 0, best_b = 0;
    auto& va = p.worker_experts[static_cast<size_t>(hi)];
    for (int w = 0; w < y; ++w) {
      if (w == hi) continue;
      auto& vb = p.worker_experts[static_cast<size_t>(w)];
      for (size_t a = 0; a < va.size(); ++a) {
        const double la = replica_load(va[a]);
        for (size_t b = 0; b < vb.size(); ++b) {
          const double lb = replica_load(vb[b]);
          if (lb >= la) continue;
          if (holds[static_cast<size_t>(w)][static_cast<size_t>(va[a])] ||
              holds[static_cast<size_t>(hi)][static_cast<size_t>(vb[b])])
            continue;
          const double new_hi = load[static_cast<size_t>(hi)] - la + lb;
          const double new_w = load[static_cast<size_t>(w)] - lb + la;
          const double gain = load[static_cast<size_t>(hi)] - std::max(new_hi, new_w);
          if (gain > best_gain + 1e-12 * load[static_cast<size_t>(hi)]) best_gain = gain, best_w = w, best_a = a, best_b = b;
        }
      }
    }
    if (best_w < 0) break;
    auto& vb = p.worker_experts[static_cast<size_t>(best_w)];
    const int32_t ea = va[best_a], eb = vb[best_b];
    const double la = replica_load(ea), lb = replica_load(eb);
    va[best_a] = eb;
    vb[best_b] = ea;
    holds[static_cast<size_t>(hi)][static_cast<size_t>(ea)] = 0;
    holds[static_cast<size_t>(hi)][static_cast<size_t>(eb)] = 1;
    holds[static_cast<size_t>(best_w)][static_cast<size_t>(eb)] = 0;
    holds[static_cast<size_t>(best_w)][static_cast<size_t>(ea)] = 1;
    load[static_cast<size_t>(hi)] += lb - la;
    load[static_cast<size_t>(best_w)] += la - lb;
  }
  for (auto& v : p.worker_experts) std::sort(v.begin(), v.end());
  fill_expert_workers(&p, n);
  fill_loads(&p, counts);
  return p;
}

Status check_placement(const LayerPlacement& p, int64_t n_experts) {
  if (p.worker_experts.empty()) return invalid_argument("placement: no workers");
  const size_t per = p.worker_experts[0].size();
  std::vector<int64_t> seen(static_cast<size_t>(n_experts), 0);
  for (size_t w = 0; w < p.worker_experts.size(); ++w) {
    if (p.worker_experts[w].size() != per)
      return invalid_argument("placement: worker " + std::to_string(w) + " holds " +
                              std::to_string(p.worker_experts[w].size()) + " replicas, worker 0 holds " +
                              std::to_string(per));
    std::vector<int32_t> v = p.worker_experts[w];
    std::sort(v.begin(), v.end());
    for (size_t k = 0; k < v.size(); ++k) {
      if (v[k] < 0 || v[k] >= n_experts)
        return invalid_argument("placement: worker " + std::to_string(w) + " names expert " + std::to_string(v[k]) +
                                " outside [0, " + std::to_string(n_experts) + ")");
      if (k > 0 && v[k] == v[k - 1])
        return invalid_argument("placement: worker " + std::to_string(w) + " holds expert " + std::to_string(v[k]) +
                                " twice");
      ++seen[static_cast<size_t>(v[k])];
    }
  }
  for (int64_t e = 0; e < n_experts; ++e)
    if (seen[static_cast<size_t>(e)] == 0)
      return invalid_argument("placement: expert " + std::to_string(e) + " has no replica");
  if (static_cast<int64_t>(p.expert_workers.size()) != n_experts)
    return invalid_argument("placement: expert_workers does not list every expert");
  for (int64_t e = 0; e < n_experts; ++e)
    if (static_cast<int64_t>(p.expert_workers[static_cast<size_t>(e)].size()) != seen[static_cast<size_t>(e)])
      return invalid_argument("placement: expert " + std::to_string(e) + "'s worker list disagrees with the workers'");
  return {};
}

Result<PlacementPlan> plan_eplb(const ExpertCounts& counts, const EplbOptions& o) {
  if (Status s = counts.validate(); !s.is_ok()) return s;
  PlacementPlan plan;
  plan.layer_ids = counts.layer_ids;
  for (const auto& row : counts.counts) {
    auto p = eplb_placement(row, o);
    if (!p.ok()) return p.status();
    plan.layers.push_back(std::move(p.value()));
  }
  return plan;
}

PlacementPlan plan_contiguous(const ExpertCounts& counts, int n_workers) {
  PlacementPlan plan;
  plan.layer_ids = counts.layer_ids;
  for (const auto& row : counts.counts) plan.layers.push_back(contiguous_placement(row, n_workers));
  return plan;
}

Status check_replica_memory(int64_t n_experts, const EplbOptions& o, int64_t n_layers, double expert_bytes,
                            double worker_bytes) {
  if (o.n_workers < 1) return invalid_argument("EPLB: the number of FFN workers must be at least 1");
  const double per_worker = static_cast<double>((n_experts + o.redundant + o.n_workers - 1) / o.n_workers);
  const double need = per_worker * expert_bytes * static_cast<double>(n_layers);
  if (need > worker_bytes) {
    std::ostringstream m;
    m.precision(4);
    m << "EPLB: " << static_cast<int64_t>(per_worker) << " expert replicas per layer x " << n_layers
      << " layers need " << need / (1024.0 * 1024 * 1024) << " GiB per FFN worker, " << worker_bytes / (1024.0 * 1024 * 1024)
      << " GiB available (fewer --redundant experts, or more workers)";
    return resource_exhausted(m.str());
  }
  return {};
}

std::string placement_to_json(const PlacementPlan& p, int n_workers, int64_t redundant) {
  json layers = json::array();
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerPlacement& lp = p.layers[l];
    layers.push_back({{"layer", p.layer_ids[l]},
                      {"workers", lp.worker_experts},
                      {"load", lp.worker_load},
                      {"max_over_mean", lp.max_over_mean()}});
  }
  json j = {{"n_workers", n_workers}, {"redundant", redundant}, {"layers", layers}};
  return j.dump();
}

}  // namespace afd::plan
