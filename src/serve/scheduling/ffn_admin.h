// FFN membership administration on an attention worker (docs/MEMBERSHIP.md):
// what `GET /admin/ffn` and `POST /admin/ffn` answer, over the FFN clients of every AFD engine
// in the process (FfnClient::membership / set_members).
//
//   GET  /admin/ffn                               -> 200 {"engines": [membership of each engine]}
//   POST /admin/ffn {"add": "host:port"[, "name": "ffn2"]}
//                   {"remove": "host:port" | "ffn1"}
//                   {"members": ["host:port", {"address": "host:port", "name": "ffn1"}, ...]}
//                                               -> 200 and the membership after the change
// A membership change is applied to every engine's client; the experts move when the monitor
// sees the new set reachable (FfnClient class comment), so the reply may still show the old
// epoch. Errors: 400 (bad body, invalid membership), 404 (no such member; no AFD engine here),
// 409 (the FFN workers hold TP slices: membership changes are not supported).
#pragma once

#include <span>
#include <string>
#include <utility>

#include "runtime/afd/ffn_client.h"

namespace afd::serve {

// The membership of each client as JSON: {"engines": [{"worker": i, "epoch", "applied_epoch",
// "live", "takeovers", "rejoins", "leaves", "whole_experts", "members": [{"name", "address",
// "connected", "assigned", "removed", "experts": [begin, end], "shared", "unreachable_ms"}]}]}.
std::string ffn_membership_json(std::span<FfnClient* const> clients);

// Handles one request (method "GET" or "POST", its body): HTTP status and JSON body (the
// membership, or an OpenAI-style error body).
std::pair<int, std::string> ffn_admin_request(std::span<FfnClient* const> clients, const std::string& method,
                                              const std::string& body);

}  // namespace afd::serve
