// afd eval: teacher-forced evaluation of a text file (perplexity, top-1 accuracy).
//   afd eval --model DIR --text FILE [--json] [--separator SEP|none] [--window N --stride S]
//            [--add-bos true|false] [--dump-tokens FILE] [--mtp] [engine flags: --precision, --topology, ...]
// The file is cut into documents at --separator (default: a blank line), each document is
// encoded with the model's tokenizer (serve/text, as afd serve loads it; special-token text
// becomes its token, as transformers' tokenizer(text) does) with BOS first when the tokenizer
// adds one to prompts (or as --add-bos says), and every token after the first is scored
// (runtime/perplexity.h: sliding windows for documents longer than --window); --mtp also scores
// DeepSeek's MTP module on the token after next (runtime/mtp_head.h).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine_flags.h"
#include "local_ffn.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/mtp_head.h"
#include "runtime/perplexity.h"
#include "serve/text/documents.h"
#include "serve/text/tokenizer.h"

namespace afd::cli {

namespace {

struct EvalFlags {
  EngineFlags engine;
  std::string text;
  bool json = false;
  std::string separator = "\\n\\n";
  int64_t window = 0;   // 0: min(max_position_embeddings, 1024)
  int64_t stride = 0;   // 0: window / 2
  std::string add_bos;  // "" : as the tokenizer adds it to prompts; "true" | "false"
  std::string dump_tokens;
  bool mtp = false;  // also score DeepSeek's MTP module 0 on the token after next
};

// --separator's value: "none" (one document) or text with the escapes \n, \r, \t and \\.
Result<std::string> parse_separator(const std::string& s) {
  if (s == "none") return std::string();
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size()) return invalid_argument("--separator '" + s + "': a lone '\\' at the end");
    switch (s[i]) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\\': out += '\\'; break;
      default:
        return invalid_argument("--separator '" + s + "': unknown escape '\\" + s[i] + "' (\\n, \\r, \\t, \\\\)");
    }
  }
  if (out.empty()) return invalid_argument("--separator: empty (use 'none' for one document)");
  return out;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) return io_error(path + ": read failed");
  return ss.str();
}

// The documents' token ids: each encoded on its own, BOS first when add_bos.
Result<std::vector<std::vector<int32_t>>> encode_documents(const serve::Tokenizer& tok,
                                                           const std::vector<std::string_view>& docs, bool add_bos,
                                                           int32_t bos) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    auto ids = tok.encode(docs[d], /*parse_special=*/true);
    if (!ids.ok()) return ids.status().with_context("document " + std::to_string(d));
    std::vector<int32_t> v;
    v.reserve(ids->size() + 1);
    if (add_bos) v.push_back(bos);
    v.insert(v.end(), ids->begin(), ids->end());
    out.push_back(std::move(v));
  }
  return out;
}

// A one-line progress bar on stderr, redrawn in place.
void draw_progress(int64_t done, int64_t total) {
  constexpr int kWidth = 40;
  const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int fill = static_cast<int>(f * kWidth);
  std::fprintf(stderr, "\r[%.*s%*s] %3.0f%% %lld/%lld tokens", fill, "########################################",
               kWidth - fill, "", 100.0 * f, static_cast<long long>(done), static_cast<long long>(total));
  if (done >= total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void run_eval(const EvalFlags& f) {
  auto sep = parse_separator(f.separator);
  if (!sep.ok()) fail("eval", sep.status());
  auto text = read_text(f.text);
  if (!text.ok()) fail("eval", text.status());
  if (Status s = serve::check_text_file(*text, f.text); !s.is_ok()) fail("eval", s);
  const std::vector<std::string_view> docs = serve::split_documents(*text, *sep);
  if (docs.empty()) fail("eval", invalid_argument(f.text + ": empty (no document with text)"));

  auto opt = f.engine.to_options();
  if (!opt.ok()) fail("eval", opt.status());
  auto cfg = load_model_config(opt->model_dir);
  if (!cfg.ok()) fail("eval", cfg.status());
  if (f.mtp && cfg->num_nextn_predict_layers < 1)
    fail("eval", invalid_argument("--mtp: " + opt->model_dir +
                                  " has no MTP module (config.json num_nextn_predict_layers is 0)"));
  auto tok = serve::Tokenizer::load_dir(opt->model_dir);
  if (!tok.ok()) fail("eval", tok.status().with_context("eval needs the model's tokenizer.json"));

  bool add_bos = (*tok)->add_bos();
  if (f.add_bos == "true") add_bos = true;
  else if (f.add_bos == "false") add_bos = false;
  else if (!f.add_bos.empty()) fail("eval", invalid_argument("--add-bos '" + f.add_bos + "': expected true or false"));
  int32_t bos = (*tok)->bos_id() >= 0 ? (*tok)->bos_id() : static_cast<int32_t>(cfg->bos_token_id);
  if (add_bos && bos < 0)
    fail("eval", invalid_argument("--add-bos: neither tokenizer_config.json's bos_token nor config.json's "
                                  "bos_token_id names a BOS token"));
  auto ids = encode_documents(**tok, docs, add_bos, bos);
  if (!ids.ok()) fail("eval", ids.status().with_context(f.text));
  int64_t n_tokens = 0, longest = 0;
  for (const auto& d : *ids) {
    n_tokens += static_cast<int64_t>(d.size());
    longest = std::max(longest, static_cast<int64_t>(d.size()));
  }
  if (longest < 2)
    fail("eval", invalid_argument(f.text + ": fewer than two tokens in every document (" + std::to_string(ids->size()) +
                                  " document(s), " + std::to_string(n_tokens) + " token(s)): nothing to score"));
  if (!f.dump_tokens.empty()) {
    std::ofstream out(f.dump_tokens, std::ios::binary | std::ios::trunc);
    for (const auto& d : *ids) {
      for (size_t i = 0; i < d.size(); ++i) out << (i ? "," : "") << d[i];
      out << "\n";
    }
    if (!out) fail("eval", io_error(f.dump_tokens + ": cannot write"));
  }

  ScoreOptions so;
  so.window = f.window > 0 ? f.window : std::min<int64_t>(cfg->max_position_embeddings, 1024);
  so.stride = f.stride > 0 ? f.stride : std::max<int64_t>(1, so.window / 2);
  if (f.window < 0 || f.stride < 0) fail("eval", invalid_argument("--window / --stride: must be positive"));
  if (isatty(STDERR_FILENO)) so.progress = draw_progress;

  LocalFfnProcesses ffn_procs;  // outlives the engine (declared first)
  if (Status s = ffn_procs.start(f.engine, &*opt); !s.is_ok()) fail("eval", s);
  auto weights = load_model(opt->model_dir);
  if (!weights.ok()) fail("eval", weights.status());
  auto engine = make_engine(*opt, *weights);
  if (!engine.ok()) fail("eval", engine.status());
  std::unique_ptr<MtpHead> mtp;
  if (f.mtp) {
    auto module = load_mtp_module(*weights, 0);
    if (!module.ok()) fail("eval", module.status().with_context("--mtp"));
    // The module's cache holds what the engine's does (score_documents reserves windows there).
    EngineOptions mo = *opt;
    const KvUsage kv = (*engine)->kv_usage();
    mo.kv.capacity_tokens = kv.blocks_total * kv.block_size;
    auto head = MtpHead::create(std::move(*module), mo);
    if (!head.ok()) fail("eval", head.status().with_context("--mtp"));
    mtp = std::move(*head);
    so.mtp = mtp.get();
  }
  auto r = score_documents(**engine, *ids, so);
  if (!r.ok()) fail("eval", r.status());

  const double nll = r->nll_mean();
  const double ppl = std::exp(nll);
  const double top1 = r->tokens > 0 ? static_cast<double>(r->top1_correct) / static_cast<double>(r->tokens) : 0.0;
  const double mtp_n = static_cast<double>(std::max<int64_t>(r->mtp_tokens, 1));
  const double mtp_top1 = static_cast<double>(r->mtp_top1_correct) / mtp_n;
  const double mtp_nll = r->mtp_nll_sum / mtp_n;
  if (f.json) {
    nlohmann::ordered_json j;
    j["documents"] = r->documents;
    j["tokens"] = r->tokens;
    j["nll_mean"] = nll;
    j["perplexity"] = ppl;
    j["top1_accuracy"] = top1;
    j["seconds"] = r->seconds;
    j["forwarded_tokens"] = r->forwarded_tokens;
    j["window"] = so.window;
    j["stride"] = so.stride;
    j["add_bos"] = add_bos;
    if (mtp) {
      j["mtp_tokens"] = r->mtp_tokens;
      j["mtp_top1_accuracy"] = mtp_top1;
      j["mtp_nll_mean"] = mtp_nll;
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  const double tps = r->seconds > 0 ? static_cast<double>(r->forwarded_tokens) / r->seconds : 0.0;
  std::printf("%-10s %10s %12s %12s %8s %12s\n", "documents", "tokens", "nll (nats)", "perplexity", "top-1",
              "tokens/s");
  std::printf("%-10lld %10lld %12.6f %12.4f %8.4f %12.1f\n", static_cast<long long>(r->documents),
              static_cast<long long>(r->tokens), nll, ppl, top1, tps);
  if (mtp)
    std::printf("MTP module (token after next): %lld tokens, top-1 %.4f, nll %.6f nats\n",
                static_cast<long long>(r->mtp_tokens), mtp_top1, mtp_nll);
  std::printf("(window %lld, stride %lld, BOS %s; %lld tokens forwarded in %.2f s)\n",
              static_cast<long long>(so.window), static_cast<long long>(so.stride), add_bos ? "added" : "not added",
              static_cast<long long>(r->forwarded_tokens), r->seconds);
}

}  // namespace

void register_eval(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  auto* cmd = app.add_subcommand(
      "eval",
      "Teacher-forced evaluation of a text file: mean negative log-likelihood (nats), perplexity and top-1 accuracy "
      "of every token after each document's first. Documents longer than --window are scored in windows of "
      "--window tokens starting every --stride tokens, each window scoring only the tokens the previous one did "
      "not (the standard sliding-window perplexity)");
  f->engine.add_to(cmd);
  cmd->add_option("--text", f->text, "UTF-8 text file to score")->required();
  cmd->add_flag("--json", f->json,
                "Print one JSON object: documents, tokens, nll_mean, perplexity, top1_accuracy, seconds "
                "(and forwarded_tokens, window, stride, add_bos)");
  cmd->add_option("--separator", f->separator,
                  "Text between documents, with the escapes \\n \\r \\t \\\\ (default: a blank line, \\n\\n); none: "
                  "the whole file is one document. Documents are trimmed of surrounding whitespace; empty ones "
                  "are skipped")
      ->capture_default_str();
  cmd->add_option("--window", f->window, "Tokens per window (default: min(max_position_embeddings, 1024))");
  cmd->add_option("--stride", f->stride,
                  "Tokens between window starts, <= --window (default: window / 2); each token after a "
                  "document's first is scored once when stride < window");
  cmd->add_option("--add-bos", f->add_bos,
                  "true | false: put the BOS token before each document (default: as the tokenizer does for "
                  "prompts, tokenizer_config.json's add_bos_token or its post-processor)");
  cmd->add_option("--dump-tokens", f->dump_tokens,
                  "Write each document's token ids (BOS included), comma-separated, one line per document");
  cmd->add_flag("--mtp", f->mtp,
                "Also report DeepSeek's MTP module (num_nextn_predict_layers > 0; module 0): its top-1 accuracy and "
                "NLL on the token after next (from the main model's final-normed hidden state and the next token; "
                "the module runs in this process whatever the wiring)");
  cmd->callback([f] { run_eval(*f); });
}

}  // namespace afd::cli
