#include "deployment_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace afd::cli {

namespace {

// The option's first long name, "--" prefixed.
std::string flag_of(const CLI::Option* o) { return "--" + o->get_lnames().front(); }

// The option's value type as CLI11 declares it: "INT", "UINT", "FLOAT", "BOOLEAN", "TEXT", ...
// (get_type_name() appends the checks' descriptions after ':').
std::string base_type(const CLI::Option* o) {
  std::string t = o->get_type_name();
  return t.substr(0, t.find(':'));
}

bool is_flag(const CLI::Option* o) { return o->get_expected_max() == 0; }  // add_flag: expected(0)

bool truthy(const std::string& s) { return s == "true" || s == "1" || s == "on" || s == "yes"; }

// `text` as the JSON value of the option's type; text that does not parse stays a string.
nlohmann::json typed(const CLI::Option* o, const std::string& text) {
  const std::string t = base_type(o);
  if (is_flag(o) || t == "BOOLEAN") return truthy(text);
  if (t == "INT" || t == "UINT") {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (!text.empty() && *end == '\0' && errno == 0) return v;
  } else if (t == "FLOAT") {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (!text.empty() && *end == '\0') return v;
  }
  return text;
}

}  // namespace

std::string config_key(const std::string& flag_name) {
  std::string k = flag_name;
  k.erase(0, k.find_first_not_of('-'));
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

DeploymentConfig DeploymentConfig::of(CLI::App* cmd) {
  DeploymentConfig c;
  const std::vector<CLI::Option*>& given = cmd->parse_order();  // command-line options only
  for (CLI::Option* o : cmd->get_options()) {
    if (o->get_lnames().empty()) continue;
    const std::string& name = o->get_lnames().front();
    if (name == "help" || name == "print-config") continue;
    Setting s;
    s.key = config_key(name);
    s.option = o;
    if (std::find(given.begin(), given.end(), o) != given.end()) {
      s.source = ConfigSource::flag;
      s.origin = "flag " + flag_of(o);
    } else if (o->count() > 0 && !o->get_envname().empty()) {  // CLI11 reads AFD_X only when no flag was given
      s.source = ConfigSource::environment;
      s.origin = "env " + o->get_envname();
    } else {
      s.origin = "default";
    }
    c.settings_.push_back(std::move(s));
  }
  return c;
}

Status DeploymentConfig::apply(const std::vector<TopologySetting>& in, const std::string& file) {
  for (const TopologySetting& ts : in) {
    const std::string where = "topology file " + file + ": " + ts.where;
    auto it = std::find_if(settings_.begin(), settings_.end(), [&](const Setting& s) { return s.key == ts.key; });
    if (it == settings_.end()) return invalid_argument(where + ": '" + ts.key + "' is not a setting of this command");
    if (it->source == ConfigSource::environment || it->source == ConfigSource::flag) continue;
    const std::string text = ts.value.is_string() ? ts.value.get<std::string>() : ts.value.dump();
    try {
      it->option->clear();
      it->option->add_result(text);
      it->option->run_callback();  // the flag's checks and conversion into the bound variable
    } catch (const CLI::Error& e) {
      return invalid_argument(where + " (" + flag_of(it->option) + "): " + e.what());
    }
    it->source = ConfigSource::topology_file;
    it->origin = where;
  }
  return Status();
}

const DeploymentConfig::Setting* DeploymentConfig::find(const std::string& key) const {
  for (const Setting& s : settings_)
    if (s.key == key) return &s;
  return nullptr;
}

Status DeploymentConfig::with_sources(const Status& s) const {
  if (s.is_ok()) return s;
  const std::string& msg = s.message();
  std::string sources;
  for (const Setting& st : settings_) {
    if (st.source == ConfigSource::default_value) continue;
    const std::string flag = flag_of(st.option);
    for (size_t at = msg.find(flag); at != std::string::npos; at = msg.find(flag, at + 1)) {
      const size_t end = at + flag.size();
      const bool whole = end == msg.size() || !(std::isalnum(static_cast<unsigned char>(msg[end])) || msg[end] == '-');
      if (!whole) continue;
      sources += (sources.empty() ? "" : "; ") + flag + ": " + st.origin;
      break;
    }
  }
  if (sources.empty()) return s;
  return Status(s.code(), msg + " (" + sources + ")");
}

nlohmann::json DeploymentConfig::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const Setting& s : settings_) {
    const CLI::Option* o = s.option;
    nlohmann::json v;
    if (o->count() > 0 && is_flag(o)) {
      v = o->as<bool>();
    } else {
      v = typed(o, o->count() > 0 ? o->results().back() : o->get_default_str());
    }
    if (s.key == "api_key" && v.is_string() && !v.get<std::string>().empty()) v = "(set)";
    out[s.key] = {{"value", v}, {"source", s.origin}};
  }
  return out;
}

void add_print_config(CLI::App* cmd, bool* print) {
  cmd->option_defaults()->always_capture_default();
  cmd->add_flag("--print-config", *print,
                "Print the effective configuration as JSON (each value with its source: default, topology file, "
                "env AFD_X or flag --x) and exit");
}

}  // namespace afd::cli
