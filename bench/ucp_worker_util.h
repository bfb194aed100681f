// For the benchmarks that compare afd with bare UCP: a ucp context and worker set up as
// afd's UcxTransport sets up its own (tag + wakeup features, a single-threaded worker), and a
// completion flag for bare requests.
#pragma once

#include <ucp/api/ucp.h>

namespace afd::bench {

// A completion flag set by the callbacks below (user_data of a UCP request).
struct Flag {
  volatile bool done = false;
};
inline void send_done(void*, ucs_status_t, void* user) { static_cast<Flag*>(user)->done = true; }
inline void recv_done(void*, ucs_status_t, const ucp_tag_recv_info_t*, void* user) {
  static_cast<Flag*>(user)->done = true;
}

// Creates *ctx and *worker; false (with whatever was created left in them) on failure.
inline bool make_ucp_worker(ucp_context_h* ctx, ucp_worker_h* worker) {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
  ucs_status_t st = ucp_init(&params, config, ctx);
  ucp_config_release(config);
  if (st != UCS_OK) return false;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  return ucp_worker_create(*ctx, &wp, worker) == UCS_OK;
}

}  // namespace afd::bench
