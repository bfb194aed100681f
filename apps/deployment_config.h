// DeploymentConfig: the effective settings of one afd command and where each came from.
//
// A command's flag table (CLI11 options, each with its AFD_* environment mirror) is the one
// schema: a setting's key is its flag's long name without "--", '-' as '_' (--kv-dtype is
// "kv_dtype"), which is also its key in a topology file (runtime/topology_file.h). Values are
// filled in one order, a later layer winning:
//   1. the flag's default;
//   2. the topology file (apply(), for the settings no flag or variable gave);
//   3. the environment mirror AFD_X;
//   4. the flag --x.
// CLI11 fills 1, 3 and 4 while it parses; of() records which one each value came from, and
// apply() adds layer 2 through the same options, so a file value passes the flag's own type
// conversion and checks. The command then validates the result once (its validate() /
// to_options(), errors passed through with_sources()) before it starts anything and, with
// --print-config, prints to_json() instead of running.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "runtime/topology_file.h"

namespace afd::cli {

enum class ConfigSource { default_value, topology_file, environment, flag };

// "--kv-dtype" or "kv-dtype" -> "kv_dtype".
std::string config_key(const std::string& flag_name);

class DeploymentConfig {
 public:
  struct Setting {
    std::string key;
    CLI::Option* option = nullptr;
    ConfigSource source = ConfigSource::default_value;
    std::string origin;  // "default", "topology file F: scheduler.max_running", "env AFD_X", "flag --x"
  };

  // The settings of `cmd` after CLI11 parsed its command line and environment: every option
  // with a long name except --help and --print-config. `cmd` must outlive the object.
  static DeploymentConfig of(CLI::App* cmd);

  // Layer 2: sets each setting the flags and environment left at its default from
  // `settings`, in order (within the file a later value wins); `file` names the file in
  // origins and errors. A key that names no setting of this command, or a value the flag's
  // conversion or checks reject, is an invalid_argument naming the file, the place in it and
  // the flag.
  Status apply(const std::vector<TopologySetting>& settings, const std::string& file);

  const Setting* find(const std::string& key) const;

  // `s` (an error of the one validation, which names flags) with where the values of the
  // flags it names came from, for those not at their default: "<message> (--ffn-parts: topology
  // file t.json: ffn_parts; --ffn-tp: flag --ffn-tp)". ok and errors naming no such flag are
  // returned unchanged.
  Status with_sources(const Status& s) const;
  const std::vector<Setting>& settings() const { return settings_; }

  // {"<key>": {"value": <typed value>, "source": "<origin>"}, ...}: integers, numbers and
  // flags typed as the option declares them; a non-empty api_key is printed as "(set)".
  nlohmann::json to_json() const;

 private:
  std::vector<Setting> settings_;
};

// Adds --print-config to `cmd` (bound to *print) and makes every option added after it record
// its default (CLI11 always_capture_default), which to_json() prints. Call before the
// command's other options are added.
void add_print_config(CLI::App* cmd, bool* print);

}  // namespace afd::cli
