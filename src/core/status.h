// Status / Result<T>: how failures that come from outside (files, peers, requests,
// configuration) travel through afd. Broken internal invariants use AFD_CHECK (check.h).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace afd {

enum class StatusCode {
  ok = 0,
  invalid_argument,    // the caller's input is wrong (request, flag, config field)
  not_found,           // a file, tensor or key is missing
  io_error,            // the OS refused (open, read, mmap, socket)
  corrupt_data,        // bytes that lie: bad header, offsets, malformed frame
  out_of_range,        // a value outside what the model/config allows
  resource_exhausted,  // KV blocks, queue slots, memory
  unavailable,         // a peer is gone or not yet connected
  timeout,             // a peer or operation stalled past its deadline
  cancelled,           // the client went away or the request was aborted
  not_supported,       // an optional capability this backend/transport lacks
  internal,            // a bug surfaced as an error rather than a crash
};

const char* status_code_name(StatusCode c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(message.empty() ? nullptr : std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& o) : code_(o.code_), message_(o.message_ ? std::make_unique<std::string>(*o.message_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) {
      code_ = o.code_;
      message_ = o.message_ ? std::make_unique<std::string>(*o.message_) : nullptr;
    }
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  // A default-constructed Status is ok. ok() and is_ok() say the same (as Result<T>::ok()).
  bool ok() const { return is_ok(); }
  bool is_ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_ ? *message_ : empty_message(); }
  // "<code name>: <message>", or "ok".
  std::string to_string() const;
  // Returns a copy whose message is "<context>: <message>".
  Status with_context(const std::string& context) const;

 private:
  static const std::string& empty_message();
  StatusCode code_ = StatusCode::ok;
  // Null when empty (every ok Status): a Status is two words, and building, moving and
  // destroying an ok one — every completion on the transports' message path — touches no
  // string. Copies of a non-empty one copy the message.
  std::unique_ptr<std::string> message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::invalid_argument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::not_found, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::io_error, std::move(m)}; }
inline Status corrupt_data(std::string m) { return {StatusCode::corrupt_data, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::out_of_range, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::resource_exhausted, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::unavailable, std::move(m)}; }
inline Status timeout_error(std::string m) { return {StatusCode::timeout, std::move(m)}; }
inline Status cancelled(std::string m) { return {StatusCode::cancelled, std::move(m)}; }
inline Status not_supported(std::string m) { return {StatusCode::not_supported, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::internal, std::move(m)}; }

// Result<T>: either a value or a non-ok Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {     // NOLINT(implicit)
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::internal, "Result built from ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // Precondition: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }
  const T& operator*() const& { return std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace afd

#define AFD_CONCAT_INNER(a, b) a##b
#define AFD_CONCAT(a, b) AFD_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define AFD_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    ::afd::Status afd_status_ = (expr);            \
    if (!afd_status_.is_ok()) return afd_status_;  \
  } while (0)

// `lhs = value of expr` or return its Status. lhs may be a declaration: AFD_ASSIGN_OR_RETURN(auto x, f());
#define AFD_ASSIGN_OR_RETURN(lhs, expr) AFD_ASSIGN_OR_RETURN_IMPL(AFD_CONCAT(afd_result_, __LINE__), lhs, expr)
#define AFD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
