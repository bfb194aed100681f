// Model identity for the AFD handshake (docs/PROTOCOL.md, "Handshake"): both sides of a
// connection must compute equal fingerprints, so the hash's inputs and order are part of
// the protocol.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace afd {

// Hash of the model's identity: architecture, shape-defining config fields, the position,
// dtype and shape of every weight matrix, and a sample of every checkpoint tensor's stored
// bytes (16 from its middle). Equal on both sides of a handshake that load one checkpoint.
uint64_t model_fingerprint(const ModelWeights& w);
// The part of model_fingerprint that the config alone gives (architecture and dimensions):
// for processes that load no weights (a serving front end checks its attention workers'
// /health against it).
uint64_t model_config_fingerprint(const ModelConfig& c);


}  // namespace afd
