// TopologyReload: `afd serve --topology-file F` re-reads F on POST /admin/reload and on SIGHUP
// (docs/MEMBERSHIP.md, "Attention workers joining and leaving"). The file's "attention"
// addresses become the active attention workers (AttentionAdmin::set: the new ones added, the
// missing ones drained and removed) and, when its "ffn" addresses differ from what the file
// said at start or at the last reload, they become the FFN membership of every attention
// worker (FfnFanout, as POST /admin/ffn {"members": [...]}). A file that cannot be read or
// parsed, or whose lists are not valid, changes nothing (the answer and the log say why).
// Everything else in the file (model, settings, the front end's own listen and key) takes a
// restart; a reload ignores it.
//
//   POST /admin/reload -> 200 {"attention": {"added": [...], "removed": [...]},
//                              "ffn": "unchanged" | {the /admin/ffn answer}}
//                         400 the file is not valid; else the refusing step's status and body.
// Thread-safe: one reload at a time.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/frontend/frontend_attention_admin.h"
#include "serve/frontend/frontend_ffn_admin.h"

namespace afd::serve {

class TopologyReload {
 public:
  // Reads path once now (its FFN addresses are the start-up membership); attention and ffn
  // outlive this.
  static Result<std::unique_ptr<TopologyReload>> create(std::string path, AttentionAdmin* attention, FfnFanout* ffn);
  // Re-reads the file and applies it; origin names the trigger in the log ("SIGHUP", ...).
  std::pair<int, std::string> reload(const std::string& origin);

 private:
  TopologyReload() = default;
  std::string path_;
  AttentionAdmin* attention_ = nullptr;
  FfnFanout* ffn_ = nullptr;
  std::mutex mu_;
  std::vector<std::string> ffn_addresses_;  // the file's, as last applied
};

}  // namespace afd::serve
