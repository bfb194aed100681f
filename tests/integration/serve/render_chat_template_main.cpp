// afd_test_render_chat_template: renders chat templates with afd's Jinja engine for the
// differential test against python3-jinja2 (chat_template_jinja2_diff.py).
//
// stdin: a JSON array of jobs, each {"config": <tokenizer_config.json object>,
//        "cases": [{"messages": [...], "tools": [...] | null, "add_generation_prompt": bool}]}
// stdout: a JSON array with, per job, an array of results per case:
//        {"ok": true, "text": "..."} or {"ok": false, "error": "..."}; a job whose template
//        afd refuses answers {"ok": false, "error": ...} for every case.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/text/chat_template.h"

int main() {
  using json = nlohmann::ordered_json;
  std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  json jobs = json::parse(in, nullptr, false);
  if (jobs.is_discarded() || !jobs.is_array()) {
    std::fprintf(stderr, "stdin is not a JSON array of jobs\n");
    return 2;
  }
  json out = json::array();
  for (const json& job : jobs) {
    json results = json::array();
    auto ct = afd::serve::ChatTemplate::from_config_json(job.value("config", json::object()).dump(), "job config");
    for (const json& c : job.value("cases", json::array())) {
      if (!ct.ok()) {
        results.push_back({{"ok", false}, {"error", ct.status().message()}});
        continue;
      }
      auto r = ct->render(c.value("messages", json::array()), c.value("add_generation_prompt", false),
                          c.contains("tools") ? c["tools"] : json(nullptr));
      if (r.ok()) results.push_back({{"ok", true}, {"text", *r}});
      else results.push_back({{"ok", false}, {"error", r.status().message()}});
    }
    out.push_back(std::move(results));
  }
  std::string s = out.dump(-1, ' ', false, json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  return 0;
}
