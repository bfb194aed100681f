#include "plan/text_file.h"

#include <fstream>
#include <sstream>

namespace afd::plan {

Result<std::string> read_text_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error("cannot open " + what + " '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<nlohmann::json> parse_json(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return corrupt_data(source + ": invalid JSON: " + e.what());
  }
}

}  // namespace afd::plan
