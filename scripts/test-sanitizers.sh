#!/usr/bin/env bash
# The sanitizer runs: a second test command beside scripts/test.sh (each one is a full build
# of its own, too long for scripts/test.sh's time budget on a 2-core CI machine).
#
#   scripts/test-sanitizers.sh [tsan|asan|all]      (default: all)
#
#   tsan  ThreadSanitizer build in build-tsan/ (AFD_SANITIZE=thread), runs the unit tests
#         of src/comm and src/runtime (ctest -L unit in tests/unit/comm, tests/unit/runtime).
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
#         (AFD_SANITIZE=address,undefined), runs every unit test (ctest -L unit -LE gpu).
#
# Any report fails the run (halt_on_error / exitcode). Environment: AFD_JOBS (default
# nproc), AFD_TSAN_DIR / AFD_ASAN_DIR (build folders), CMAKE_CXX_COMPILER_LAUNCHER (ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in tsan | asan | all) ;; *) echo "usage: $0 [tsan|asan|all]" >&2; exit 2 ;; esac
JOBS=${AFD_JOBS:-$(nproc)}

# UCX's memory hooks (libucm) intercept the madvise a thread makes when it exits; under
# ThreadSanitizer that crashes every binary that links UCX (the build's test discovery
# included), and under AddressSanitizer they fight its malloc interposition. Off for both.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=0 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"

configure() {  # dir sanitizer
  local launcher=()
  if [[ -n "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]]; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER" -DCMAKE_C_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER")
  elif command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # One unit per file (no unity build): a rerun after a fix recompiles only the file changed (and
  # ccache keeps the rest), and every file is compiled alone, so one that does not include what
  # it uses fails here.
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAFD_SANITIZE="$2" -DAFD_UNITY_BUILD=OFF \
        -DAFD_BUILD_TESTS=ON -DAFD_BUILD_BENCH=OFF -DAFD_BUILD_FUZZ=OFF -DAFD_CUDA=OFF -DAFD_WERROR=OFF "${launcher[@]}"
}

phase() {  # name command...: runs it and logs how long it took (docs/STYLE.md "Sanitizer schedule")
  local t0=$SECONDS
  "${@:2}"
  echo "test-sanitizers: $1 took $((SECONDS - t0)) s" >&2
}

if [[ "$what" == tsan || "$what" == all ]]; then
  dir=${AFD_TSAN_DIR:-build-tsan}
  configure "$dir" thread
  phase "tsan build" cmake --build "$dir" -j "$JOBS" --target tests/unit/comm/all tests/unit/runtime/all
  for sub in comm runtime; do
    phase "tsan $sub tests" ctest --test-dir "$dir/tests/unit/$sub" -L unit --output-on-failure -j "$JOBS" --timeout 1200
  done
fi

if [[ "$what" == asan || "$what" == all ]]; then
  dir=${AFD_ASAN_DIR:-build-asan}
  configure "$dir" address,undefined
  phase "asan build" cmake --build "$dir" -j "$JOBS"
  phase "asan tests" ctest --test-dir "$dir" -L unit -LE gpu --output-on-failure -j "$JOBS" --timeout 1200
fi
