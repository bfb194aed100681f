// afd_test_write_tokenizer DIR VOCAB: writes tokenizer.json + tokenizer_config.json with
// afd::write_tokenizer_files (what `afd make-model` installs) for the serving e2e tests.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "serve/text/tokenizer_writer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DIR VOCAB_SIZE\n", argv[0]);
    return 2;
  }
  char* end = nullptr;
  long long v = std::strtoll(argv[2], &end, 10);
  if (!end || *end) {
    std::fprintf(stderr, "VOCAB_SIZE '%s' is not an integer\n", argv[2]);
    return 2;
  }
  auto info = afd::write_tokenizer_files(argv[1], v);
  if (!info.ok()) {
    std::fprintf(stderr, "error: %s\n", info.status().to_string().c_str());
    return 1;
  }
  std::printf("%d %d %d\n", info->endoftext_id, info->im_start_id, info->im_end_id);
  return 0;
}
