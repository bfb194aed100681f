// ModelSpec: what the decode cost model needs to know about a model, counted per layer
// group. Built from presets (model_presets.cpp, every model of the Step-3 paper, Tables 2-3) or
// from a Hugging Face config.json (hf_model_spec.cpp). Plain data; no globals.
//
// Counting conventions (docs/PLANNING.md has the full list and why they reproduce the
// paper's tables):
//  - "attention" = the core attention op only (QK^T, softmax·V or the linear-attention
//    state update); the projections before/after it are "linear".
//  - full / chunked layers: per decode token, bytes = kv_bytes_per_token * context
//    (chunked: min(context, chunk)), FLOPs = flops_per_ctx_token * that same length.
//  - linear-attention layers: a fixed state read and written per token.
//  - FFN: 2 FLOPs per activated weight (routed top-k + shared experts, or the dense MLP).
//  - router, norms, embedding and LM head are excluded (the Step-3 paper, §4.1: < 5%).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace afd::plan {

enum class AttnKind { full, chunked, linear };
const char* attn_kind_name(AttnKind k);

// A run of layers whose attention is counted the same way.
struct AttnGroup {
  std::string label;            // "MLA", "GQA", "MFA", "chunked GQA", "lightning", ...
  AttnKind kind = AttnKind::full;
  int64_t n_layers = 0;
  double kv_bytes_per_token = 0;   // full/chunked: KV bytes per context token per layer
  double flops_per_ctx_token = 0;  // full/chunked: FLOPs per decode token per context token per layer
  int64_t chunk = 0;               // chunked: attention window (tokens)
  double state_bytes = 0;          // linear: state bytes read + written per decode token per layer
  double state_flops = 0;          // linear: FLOPs per decode token per layer
  double o_proj_params = 0;        // output projection weights per layer
  double other_linear_params = 0;  // q/k/v (and gate, down/up-projection) weights per layer
  double linear_params() const { return o_proj_params + other_linear_params; }
};

// A run of layers with the same FFN shape.
struct FfnGroup {
  std::string label;           // "dense" or "MoE"
  int64_t n_layers = 0;
  double expert_params = 0;    // weights of one routed expert (3 * hidden * d_expert for SwiGLU); dense: 0
  int64_t n_routed = 0;        // routed experts (0 for dense)
  int64_t top_k = 0;           // routed experts per token
  double shared_params = 0;    // shared-expert weights (always active); dense MLP weights for dense layers
  // Weights touched per token.
  double active_params() const { return static_cast<double>(top_k) * expert_params + shared_params; }
  // Weights stored.
  double total_params() const { return static_cast<double>(n_routed) * expert_params + shared_params; }
};

struct ModelSpec {
  std::string id;        // preset id, e.g. "step3"
  std::string display;   // name as printed in the Step-3 paper tables, e.g. "Step-3"
  int64_t hidden = 0;
  int64_t n_layers = 0;
  double weight_bytes = 1.0;  // bytes per linear/FFN weight (FP8 = 1)
  int64_t vocab = 0;          // LM head rows; 0 where unknown (the paper's presets): the head is not counted
  std::vector<AttnGroup> attn;
  std::vector<FfnGroup> ffn;
  std::string notes;     // quantisation / counting notes shown with --verbose and in JSON

  // MoE sparsity S (the Step-3 paper, §5.3): activated expert weights / all expert weights of the
  // MoE layers, shared experts counted as always active. 1 for a dense model.
  double moe_sparsity() const;
  // Shared experts in units of one routed expert (for the "+1/-1" of the Step-3 paper, §5.4 fn. 6).
  double shared_expert_units() const;
  const FfnGroup* first_moe_group() const;
  // Total stored FFN weights (bytes) and attention projection weights (bytes).
  double ffn_weight_bytes() const;
  double linear_weight_bytes() const;
};

}  // namespace afd::plan
