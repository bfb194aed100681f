// Subcommand registration: each cmd_<name>.cpp defines one register_<name>() that adds
// its CLI11 subcommand and sets the callback. Callbacks throw CLI::RuntimeError(code)
// for a non-zero exit after printing a clear error to stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace afd::cli {

void register_version(CLI::App& app);
void register_make_model(CLI::App& app);
// quantize (--fp8 | --dequantize): apps/cmd_quantize.cpp
void register_quantize(CLI::App& app);
void register_generate(CLI::App& app);
// eval (teacher-forced perplexity of a text file): apps/cmd_eval.cpp
void register_eval(CLI::App& app);
void register_bench(CLI::App& app);
void register_worker(CLI::App& app);
void register_serve(CLI::App& app);
// plan (cost|sparsity|hardware|ratio): apps/cmd_plan.cpp
void register_plan(CLI::App& app);
// sim (the discrete-event AFD bundle simulator): apps/cmd_sim.cpp
void register_sim(CLI::App& app);
// calibrate (latency profile fits): apps/cmd_calibrate.cpp
void register_calibrate(CLI::App& app);
// trace merge: apps/cmd_trace.cpp
void register_trace(CLI::App& app);

}  // namespace afd::cli
