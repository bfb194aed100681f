// Instruction-set level the CPU kernels dispatch on (internal to kernels/ and its tests).
#pragma once

namespace afd::kernels {

// Ordered: a level implies the ones below it.
//   scalar: portable C++ (plus OpenBLAS sgemm for large products).
//   avx2:   AVX2 + FMA + F16C.
//   avx512: AVX-512 F/BW/VL/DQ + BF16 (vdpbf16ps).
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };

// Highest level this CPU supports, after AFD_CPU_DISABLE masking (core/cpu_features.h).
Isa detected_isa();
// Level the kernels use now: min(detected_isa(), limit set below).
Isa active_isa();
// Test/benchmark hook: caps the level (e.g. Isa::scalar to exercise the portable path
// on an AVX-512 machine). Not thread-safe against concurrent kernel calls.
void set_isa_limit(Isa limit);
// The cap set by set_isa_limit (Isa::avx512 unless set): for kernels whose paths need CPU
// features other than a level's (gqa_attention.h), so that the cap reaches them too.
Isa isa_limit();
const char* isa_name(Isa isa);

}  // namespace afd::kernels
