// Internal: afd runs OpenBLAS single-threaded inside its own ThreadPool threads (see linear.cpp).
#pragma once

namespace afd::kernels {
// Calls openblas_set_num_threads(1) once per process; cheap after the first call.
void ensure_openblas_single_threaded();
}  // namespace afd::kernels
