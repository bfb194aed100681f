// The simulator's random numbers: afd::Rng (core/rng.h).
#pragma once

#include "core/rng.h"

namespace afd::plan {
using afd::Rng;
}  // namespace afd::plan
