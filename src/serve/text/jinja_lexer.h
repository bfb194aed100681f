// Jinja lexer: splits a template into text and tag chunks (applying whitespace control,
// trim_blocks and lstrip_blocks as Hugging Face's apply_chat_template configures them),
// and tokenises the inside of a tag.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace afd::serve::jinja {

enum class ChunkKind { text, expr, stmt };  // text, {{ ... }}, {% ... %}

struct Chunk {
  ChunkKind kind;
  std::string body;  // text, or the tag's inside without delimiters and '-'
  int line;
};

// Comments are dropped. trim_blocks and lstrip_blocks are on (as in transformers).
Result<std::vector<Chunk>> split_chunks(const std::string& tmpl);

enum class TokKind { name, string, integer, number, op, end };

struct Tok {
  TokKind kind;
  std::string text;  // name, decoded string, number text, or operator
};

Result<std::vector<Tok>> tokenize(const std::string& body, int line);

}  // namespace afd::serve::jinja
