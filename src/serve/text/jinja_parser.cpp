// Recursive-descent parser for the Jinja subset: statements over chunks, expressions
// over tokens, with Jinja's precedence (or < and < not < compare < + - < ~ < * / // % <
// ** < unary - < postfix: .attr [index] (call) |filter is test). Recursion is bounded:
// an expression's tree height and the parser's own nesting by Limits::max_expr_depth,
// statement blocks by Limits::max_block_depth.
#include <set>

#include "serve/text/jinja.h"
#include "serve/text/jinja_ast.h"
#include "serve/text/jinja_lexer.h"

namespace afd::serve::jinja {
namespace {

using ExprP = std::unique_ptr<Expr>;

std::string limit_message(const char* what, const char* name, int value) {
  return std::string(what) + " (limit " + name + " = " + std::to_string(value) + ")";
}

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line, const Limits& lim) : t_(std::move(toks)), line_(line), lim_(lim) {}

  // Counts the parser's own recursion (parentheses, `not`, unary minus, nested literals);
  // tree height is checked separately by adopt().
  class Nest {
   public:
    explicit Nest(ExprParser* p) : p_(p) { ++p_->nest_; }
    ~Nest() { --p_->nest_; }
    Status check() const {
      if (p_->nest_ > p_->lim_.max_expr_depth)
        return p_->error(limit_message("expression nested too deeply", "max_expr_depth", p_->lim_.max_expr_depth));
      return Status();
    }

   private:
    ExprParser* p_;
  };
  // Makes `child` an argument of `parent`, keeping parent->height within the limit.
  Status adopt(Expr* parent, ExprP child) {
    if (child) {
      if (child->height + 1 > lim_.max_expr_depth)
        return error(limit_message("expression nested too deeply", "max_expr_depth", lim_.max_expr_depth));
      parent->height = std::max(parent->height, child->height + 1);
    }
    parent->args.push_back(std::move(child));
    return Status();
  }
  Status adopt_kw(Expr* parent, std::string key, ExprP child) {
    if (child->height + 1 > lim_.max_expr_depth)
      return error(limit_message("expression nested too deeply", "max_expr_depth", lim_.max_expr_depth));
    parent->height = std::max(parent->height, child->height + 1);
    parent->kwargs.push_back({std::move(key), std::move(child)});
    return Status();
  }

  Status error(const std::string& m) const {
    return invalid_argument("chat template line " + std::to_string(line_) + ": " + m);
  }
  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == TokKind::end; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).kind == TokKind::op && peek(k).text == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).kind == TokKind::name && peek(k).text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++p_;
    return true;
  }
  Status expect_op(const char* op) {
    if (!accept_op(op)) return error(std::string("expected '") + op + "' near '" + peek().text + "'");
    return Status();
  }
  Result<std::string> expect_name() {
    if (peek().kind != TokKind::name) return error("expected a name near '" + peek().text + "'");
    return t_[p_++].text;
  }

  ExprP make(Expr::Kind k, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->name = std::move(name);
    e->line = line_;
    return e;
  }

  // Full expression including the inline conditional.
  Result<ExprP> expression(bool allow_cond = true) {
    Nest nest(this);
    AFD_RETURN_IF_ERROR(nest.check());
    AFD_ASSIGN_OR_RETURN(ExprP e, or_expr());
    if (allow_cond && accept_name("if")) {
      AFD_ASSIGN_OR_RETURN(ExprP c, or_expr());
      ExprP els;
      if (accept_name("else")) {
        AFD_ASSIGN_OR_RETURN(els, expression());
      }
      ExprP n = make(Expr::cond);
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(e)));
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(c)));
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(els)));
      return n;
    }
    return e;
  }

  Result<ExprP> binary(Result<ExprP> (ExprParser::*next)(), std::initializer_list<const char*> ops, bool names) {
    AFD_ASSIGN_OR_RETURN(ExprP l, (this->*next)());
    for (;;) {
      const char* hit = nullptr;
      for (const char* op : ops)
        if (names ? is_name(op) : is_op(op)) hit = op;
      if (!hit) return l;
      ++p_;
      AFD_ASSIGN_OR_RETURN(ExprP r, (this->*next)());
      ExprP n = make(Expr::binary, hit);
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(l)));
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(r)));
      l = std::move(n);
    }
  }
  Result<ExprP> or_expr() { return binary(&ExprParser::and_expr, {"or"}, true); }
  Result<ExprP> and_expr() { return binary(&ExprParser::not_expr, {"and"}, true); }
  Result<ExprP> not_expr() {
    if (accept_name("not")) {
      Nest nest(this);
      AFD_RETURN_IF_ERROR(nest.check());
      AFD_ASSIGN_OR_RETURN(ExprP x, not_expr());
      ExprP n = make(Expr::unary, "not");
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(x)));
      return n;
    }
    return compare();
  }
  Result<ExprP> compare() {
    AFD_ASSIGN_OR_RETURN(ExprP l, add());
    for (;;) {
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
        op = peek().text;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "notin";
        p_ += 2;
      } else {
        return l;
      }
      AFD_ASSIGN_OR_RETURN(ExprP r, add());
      ExprP n = make(Expr::binary, op);
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(l)));
      AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(r)));
      l = std::move(n);
    }
  }
  Result<ExprP> add() { return binary(&ExprParser::concat, {"+", "-"}, false); }
  Result<ExprP> concat() { return binary(&ExprParser::mul, {"~"}, false); }
  Result<ExprP> mul() { return binary(&ExprParser::pow, {"*", "/", "//", "%"}, false); }
  Result<ExprP> pow() { return binary(&ExprParser::unary_filtered, {"**"}, false); }
  Result<ExprP> unary_filtered() { return unary(true); }
  // As jinja2: a unary minus/plus applies to its operand with postfix operators (.a [i]
  // (args)) but without filters and tests, which then apply to the negated value
  // (-5|abs is 5).
  Result<ExprP> unary(bool with_filter = true) {
    ExprP x;
    if (is_op("-") || is_op("+")) {
      std::string op = peek().text;
      ++p_;
      Nest nest(this);
      AFD_RETURN_IF_ERROR(nest.check());
      AFD_ASSIGN_OR_RETURN(ExprP operand, unary(false));
      x = make(Expr::unary, op);
      AFD_RETURN_IF_ERROR(adopt(x.get(), std::move(operand)));
    } else {
      AFD_ASSIGN_OR_RETURN(x, primary());
    }
    AFD_ASSIGN_OR_RETURN(x, postfix(std::move(x)));
    if (with_filter) return filter_expr(std::move(x));
    return x;
  }

  Status call_args(Expr* n) {
    // after '('
    if (accept_op(")")) return Status();
    for (;;) {
      if (peek().kind == TokKind::name && is_op("=", 1)) {
        std::string k = peek().text;
        p_ += 2;
        AFD_ASSIGN_OR_RETURN(ExprP v, expression());
        AFD_RETURN_IF_ERROR(adopt_kw(n, k, std::move(v)));
      } else {
        AFD_ASSIGN_OR_RETURN(ExprP v, expression());
        AFD_RETURN_IF_ERROR(adopt(n, std::move(v)));
      }
      if (accept_op(")")) return Status();
      AFD_RETURN_IF_ERROR(expect_op(","));
    }
  }

  // .name  [index or slice]  (call args)
  Result<ExprP> postfix(ExprP x) {
    for (;;) {
      if (accept_op(".")) {
        AFD_ASSIGN_OR_RETURN(std::string name, expect_name());
        ExprP n = make(Expr::attr, name);
        AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(x)));
        x = std::move(n);
      } else if (accept_op("[")) {
        ExprP parts[3];
        int n_colons = 0;
        while (!is_op("]")) {
          if (accept_op(":")) {
            if (++n_colons > 2) return error("bad slice");
            continue;
          }
          if (parts[n_colons]) return error("bad subscript");
          AFD_ASSIGN_OR_RETURN(parts[n_colons], expression());
        }
        AFD_RETURN_IF_ERROR(expect_op("]"));
        ExprP n = make(n_colons ? Expr::slice : Expr::index);
        AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(x)));
        if (n_colons) {
          for (auto& p : parts) AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(p)));
        } else {
          if (!parts[0]) return error("empty subscript");
          AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(parts[0])));
        }
        x = std::move(n);
      } else if (accept_op("(")) {
        AFD_ASSIGN_OR_RETURN(x, call(std::move(x)));
      } else {
        return x;
      }
    }
  }

  Result<ExprP> call(ExprP callee) {  // after '('
    ExprP n = make(Expr::call);
    AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(callee)));
    AFD_RETURN_IF_ERROR(call_args(n.get()));
    return n;
  }

  // |filter[(args)]  is [not] test [arg | (args)]  (call args)
  Result<ExprP> filter_expr(ExprP x) {
    for (;;) {
      if (accept_op("|")) {
        AFD_ASSIGN_OR_RETURN(std::string name, expect_name());
        while (accept_op(".")) {  // jinja2 allows dotted filter names
          AFD_ASSIGN_OR_RETURN(std::string more, expect_name());
          name += "." + more;
        }
        ExprP n = make(Expr::filter, name);
        AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(x)));
        if (accept_op("(")) AFD_RETURN_IF_ERROR(call_args(n.get()));
        x = std::move(n);
      } else if (accept_name("is")) {
        bool neg = accept_name("not");
        AFD_ASSIGN_OR_RETURN(std::string name, expect_name());
        while (accept_op(".")) {
          AFD_ASSIGN_OR_RETURN(std::string more, expect_name());
          name += "." + more;
        }
        ExprP n = make(Expr::test, name);
        n->negate = neg;
        AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(x)));
        if (accept_op("(")) {
          AFD_RETURN_IF_ERROR(call_args(n.get()));
        } else if (test_argument_follows()) {
          // `is divisibleby 3`, `is in [1, 2]`, `is sameas none`: one bare argument
          if (is_name("is")) return error("cannot chain tests with 'is'");
          AFD_ASSIGN_OR_RETURN(ExprP a, primary());
          AFD_ASSIGN_OR_RETURN(a, postfix(std::move(a)));
          AFD_RETURN_IF_ERROR(adopt(n.get(), std::move(a)));
        }
        x = std::move(n);
      } else if (accept_op("(")) {
        AFD_ASSIGN_OR_RETURN(x, call(std::move(x)));
      } else {
        return x;
      }
    }
  }

  Result<ExprP> primary() {
    const Tok& t = peek();
    if (t.kind == TokKind::string) {
      std::string s;
      while (peek().kind == TokKind::string) s += t_[p_++].text;  // adjacent literals concatenate
      ExprP n = make(Expr::literal);
      n->value = s;
      return n;
    }
    if (t.kind == TokKind::integer) {
      ExprP n = make(Expr::literal);
      try {
        n->value = std::stoll(t.text);
      } catch (...) {
        return error("integer literal out of range: " + t.text);
      }
      ++p_;
      return n;
    }
    if (t.kind == TokKind::number) {
      ExprP n = make(Expr::literal);
      n->value = std::strtod(t.text.c_str(), nullptr);
      ++p_;
      return n;
    }
    if (t.kind == TokKind::name) {
      std::string name = t.text;
      ++p_;
      ExprP n = make(Expr::literal);
      if (name == "true" || name == "True") n->value = true;
      else if (name == "false" || name == "False") n->value = false;
      else if (name == "none" || name == "None") n->value = nullptr;
      else n = make(Expr::var, name);
      return n;
    }
    if (accept_op("(")) {
      AFD_ASSIGN_OR_RETURN(ExprP e, expression());
      if (accept_op(",")) {  // tuple: treated as a list
        ExprP l = make(Expr::list);
        AFD_RETURN_IF_ERROR(adopt(l.get(), std::move(e)));
        while (!is_op(")")) {
          AFD_ASSIGN_OR_RETURN(ExprP x, expression());
          AFD_RETURN_IF_ERROR(adopt(l.get(), std::move(x)));
          if (!accept_op(",")) break;
        }
        e = std::move(l);
      }
      AFD_RETURN_IF_ERROR(expect_op(")"));
      return e;
    }
    if (accept_op("[")) {
      ExprP l = make(Expr::list);
      while (!is_op("]")) {
        AFD_ASSIGN_OR_RETURN(ExprP x, expression());
        AFD_RETURN_IF_ERROR(adopt(l.get(), std::move(x)));
        if (!accept_op(",")) break;
      }
      AFD_RETURN_IF_ERROR(expect_op("]"));
      return l;
    }
    if (accept_op("{")) {
      ExprP d = make(Expr::dict);
      while (!is_op("}")) {
        AFD_ASSIGN_OR_RETURN(ExprP k, expression());
        AFD_RETURN_IF_ERROR(expect_op(":"));
        AFD_ASSIGN_OR_RETURN(ExprP v, expression());
        AFD_RETURN_IF_ERROR(adopt(d.get(), std::move(k)));
        AFD_RETURN_IF_ERROR(adopt(d.get(), std::move(v)));
        if (!accept_op(",")) break;
      }
      AFD_RETURN_IF_ERROR(expect_op("}"));
      return d;
    }
    return error("unexpected '" + t.text + "' in expression");
  }

  // After `is name`: a bare argument starts here (as jinja2: a name other than
  // else/or/and, a literal, or a bracket).
  bool test_argument_follows() const {
    const Tok& t = peek();
    if (t.kind == TokKind::string || t.kind == TokKind::integer || t.kind == TokKind::number) return true;
    if (t.kind == TokKind::op) return t.text == "[" || t.text == "{";
    if (t.kind != TokKind::name) return false;
    return t.text != "else" && t.text != "or" && t.text != "and";
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  int line_;
  const Limits& lim_;
  int nest_ = 0;
};

class StmtParser {
 public:
  StmtParser(std::vector<Chunk> c, const Limits& lim) : c_(std::move(c)), lim_(lim) {}

  // Parses nodes until a statement whose first word is in `ends` (left unconsumed), or
  // the end of the template when `ends` is empty.
  Status body(NodeList* out, const std::set<std::string>& ends, std::string* end_word) {
    struct Depth {
      int* d;
      ~Depth() { --*d; }
    } depth{&depth_};
    if (++depth_ > lim_.max_block_depth + 1) {  // the template's top level is depth 1
      int line = i_ < c_.size() ? c_[i_].line : (c_.empty() ? 1 : c_.back().line);
      return invalid_argument("chat template line " + std::to_string(line) + ": " +
                              limit_message("statement blocks nested too deeply", "max_block_depth",
                                            lim_.max_block_depth));
    }
    while (i_ < c_.size()) {
      const Chunk& ch = c_[i_];
      if (ch.kind == ChunkKind::text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::text;
        n->content = ch.body;
        out->push_back(std::move(n));
        ++i_;
        continue;
      }
      AFD_ASSIGN_OR_RETURN(std::vector<Tok> toks, tokenize(ch.body, ch.line));
      if (ch.kind == ChunkKind::expr) {
        ExprParser p(std::move(toks), ch.line, lim_);
        AFD_ASSIGN_OR_RETURN(ExprP e, p.expression());
        if (!p.at_end()) return p.error("unexpected '" + p.peek().text + "' after expression");
        auto n = std::make_unique<Node>();
        n->kind = Node::output;
        n->line = ch.line;
        n->expr = std::move(e);
        out->push_back(std::move(n));
        ++i_;
        continue;
      }
      if (toks.empty() || toks[0].kind != TokKind::name)
        return invalid_argument("chat template line " + std::to_string(ch.line) + ": empty statement");
      std::string word = toks[0].text;
      if (ends.count(word)) {
        *end_word = word;
        return Status();
      }
      ++i_;
      ExprParser p(std::move(toks), ch.line, lim_);
      p.p_ = 1;
      AFD_RETURN_IF_ERROR(statement(word, p, ch.line, out));
    }
    if (!ends.empty())
      return invalid_argument("chat template: missing {% " + *ends.begin() + " %} before the end");
    return Status();
  }

  Status finish_tag(ExprParser& p) {
    if (!p.at_end()) return p.error("unexpected '" + p.peek().text + "' in statement");
    return Status();
  }
  // Consumes the end statement found by body().
  Status consume_end() {
    AFD_ASSIGN_OR_RETURN(std::vector<Tok> toks, tokenize(c_[i_].body, c_[i_].line));
    ++i_;
    last_end_ = std::make_unique<ExprParser>(std::move(toks), c_[i_ - 1].line, lim_);
    last_end_->p_ = 1;
    return Status();
  }

  Status statement(const std::string& word, ExprParser& p, int line, NodeList* out) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string end;
    if (word == "if") {
      n->kind = Node::if_;
      AFD_ASSIGN_OR_RETURN(ExprP c, p.expression());
      AFD_RETURN_IF_ERROR(finish_tag(p));
      for (;;) {
        NodeList b;
        AFD_RETURN_IF_ERROR(body(&b, {"elif", "else", "endif"}, &end));
        n->branches.push_back({std::move(c), std::move(b)});
        AFD_RETURN_IF_ERROR(consume_end());
        if (end == "endif") break;
        if (end == "elif") {
          AFD_ASSIGN_OR_RETURN(c, last_end_->expression());
          AFD_RETURN_IF_ERROR(finish_tag(*last_end_));
        } else {
          c = nullptr;
          AFD_RETURN_IF_ERROR(finish_tag(*last_end_));
          NodeList eb;
          AFD_RETURN_IF_ERROR(body(&eb, {"endif"}, &end));
          AFD_RETURN_IF_ERROR(consume_end());
          n->branches.push_back({nullptr, std::move(eb)});
          break;
        }
      }
    } else if (word == "for") {
      n->kind = Node::for_;
      for (;;) {
        AFD_ASSIGN_OR_RETURN(std::string v, p.expect_name());
        n->targets.push_back(v);
        if (!p.accept_op(",")) break;
      }
      if (!p.accept_name("in")) return p.error("expected 'in' in for");
      AFD_ASSIGN_OR_RETURN(n->expr, p.expression(false));
      if (p.accept_name("if")) {
        AFD_ASSIGN_OR_RETURN(n->filter, p.expression(false));
      }
      p.accept_name("recursive");
      AFD_RETURN_IF_ERROR(finish_tag(p));
      AFD_RETURN_IF_ERROR(body(&n->body, {"else", "endfor"}, &end));
      AFD_RETURN_IF_ERROR(consume_end());
      if (end == "else") {
        AFD_RETURN_IF_ERROR(body(&n->else_body, {"endfor"}, &end));
        AFD_RETURN_IF_ERROR(consume_end());
      }
    } else if (word == "set") {
      AFD_ASSIGN_OR_RETURN(std::string v, p.expect_name());
      n->targets.push_back(v);
      if (p.accept_op(".")) {
        AFD_ASSIGN_OR_RETURN(std::string a, p.expect_name());
        n->targets.push_back(a);
      }
      if (p.accept_op("=")) {
        n->kind = Node::set;
        AFD_ASSIGN_OR_RETURN(n->expr, p.expression());
        AFD_RETURN_IF_ERROR(finish_tag(p));
      } else {
        n->kind = Node::set_block;
        AFD_RETURN_IF_ERROR(finish_tag(p));
        AFD_RETURN_IF_ERROR(body(&n->body, {"endset"}, &end));
        AFD_RETURN_IF_ERROR(consume_end());
      }
    } else if (word == "macro") {
      n->kind = Node::macro;
      AFD_ASSIGN_OR_RETURN(std::string name, p.expect_name());
      n->targets.push_back(name);
      AFD_RETURN_IF_ERROR(p.expect_op("("));
      while (!p.accept_op(")")) {
        AFD_ASSIGN_OR_RETURN(std::string a, p.expect_name());
        ExprP def;
        if (p.accept_op("=")) {
          AFD_ASSIGN_OR_RETURN(def, p.expression());
        }
        n->params.push_back({a, std::move(def)});
        if (!p.accept_op(",")) {
          AFD_RETURN_IF_ERROR(p.expect_op(")"));
          break;
        }
      }
      AFD_RETURN_IF_ERROR(finish_tag(p));
      AFD_RETURN_IF_ERROR(body(&n->body, {"endmacro"}, &end));
      AFD_RETURN_IF_ERROR(consume_end());
    } else if (word == "break" || word == "continue") {
      n->kind = word == "break" ? Node::break_ : Node::continue_;
      AFD_RETURN_IF_ERROR(finish_tag(p));
    } else if (word == "generation") {
      // transformers' {% generation %} marks assistant text; it renders its body.
      n->kind = Node::passthrough;
      AFD_RETURN_IF_ERROR(body(&n->body, {"endgeneration"}, &end));
      AFD_RETURN_IF_ERROR(consume_end());
    } else {
      return invalid_argument("chat template line " + std::to_string(line) + ": unsupported statement '" + word + "'");
    }
    out->push_back(std::move(n));
    return Status();
  }

  std::vector<Chunk> c_;
  size_t i_ = 0;
  std::unique_ptr<ExprParser> last_end_;
  const Limits& lim_;
  int depth_ = 0;
};

}  // namespace

Template::~Template() = default;

Result<std::shared_ptr<const Template>> Template::parse(const std::string& text, const Limits& limits) {
  AFD_ASSIGN_OR_RETURN(std::vector<Chunk> chunks, split_chunks(text));
  StmtParser sp(std::move(chunks), limits);
  std::shared_ptr<Template> t(new Template());
  t->limits_ = limits;
  std::string end;
  AFD_RETURN_IF_ERROR(sp.body(&t->body_, {}, &end));
  return std::shared_ptr<const Template>(std::move(t));
}

}  // namespace afd::serve::jinja
