// afd: one executable, many subcommands (see commands.h).
#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/check.h"
#include "core/log.h"

int main(int argc, char** argv) {
  afd::init_logging();
  CLI::App app{"afd: Attention-FFN disaggregated MoE decoding engine"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->envname("AFD_LOG_LEVEL");
  app.parse_complete_callback([&] { afd::set_log_level(log_level.c_str()); });

  afd::cli::register_version(app);
  afd::cli::register_make_model(app);
  afd::cli::register_quantize(app);
  afd::cli::register_generate(app);
  afd::cli::register_eval(app);
  afd::cli::register_bench(app);
  afd::cli::register_worker(app);
  afd::cli::register_serve(app);
  afd::cli::register_plan(app);
  afd::cli::register_sim(app);
  afd::cli::register_calibrate(app);
  afd::cli::register_trace(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Prints the message (or --help). Commands fail with CLI::RuntimeError(1) (cli::fail);
    // CLI11's usage errors carry codes >= 100, which scripts would read as crashes: they
    // exit 2, as getopt-style tools do.
    const int rc = app.exit(e);
    return rc >= 100 ? 2 : rc;
  } catch (const afd::InternalError& e) {
    std::fprintf(stderr, "afd: internal error: %s\n", e.what());
    return 70;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "afd: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
