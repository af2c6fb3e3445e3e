#include "common/http/http_request.h"

#include "common/base/strings.h"

namespace pdserve::http {
namespace {

// RFC 9110 token characters.
bool IsTchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return c != 0 && std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTchar(c)) return false;
  }
  return true;
}

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::string LowerCopy(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool Fail(RequestError* e, int status, std::string message) {
  e->status = status;
  e->message = std::move(message);
  return false;
}

// The comma-separated tokens of a header value, lowercased.
std::vector<std::string> Tokens(std::string_view v) {
  std::vector<std::string> out;
  while (!v.empty()) {
    const size_t comma = v.find(',');
    const std::string_view t = Trim(v.substr(0, comma));
    if (!t.empty()) out.push_back(LowerCopy(t));
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

const std::string* HttpRequest::Header(std::string_view lowercase_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lowercase_name) return &value;
  }
  return nullptr;
}

size_t FindHeadEnd(std::string_view data) {
  const size_t at = data.find("\r\n\r\n");
  return at == std::string_view::npos ? 0 : at + 4;
}

bool ParseRequestHead(std::string_view head, const HeadLimits& limits, HttpRequest* out,
                      RequestError* error) {
  if (head.size() > limits.max_head_bytes) {
    return Fail(error, 431,
                Str("the request head is larger than ", limits.max_head_bytes, " bytes"));
  }
  if (head.size() < 4 || head.substr(head.size() - 4) != "\r\n\r\n") {
    return Fail(error, 400, "the request head does not end with an empty line");
  }
  head.remove_suffix(2);  // Every line now ends with "\r\n".
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  head.remove_prefix(eol + 2);

  // Request line: method SP target SP HTTP-version.
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(error, 400, "the request line is not 'METHOD target HTTP/1.1'");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Fail(error, 400, "the request method is not a token");
  if (target.empty()) return Fail(error, 400, "the request target is empty");
  for (unsigned char c : target) {
    if (c <= 0x20 || c == 0x7f) {
      return Fail(error, 400, "the request target holds a control character");
    }
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' ||
      version[5] < '0' || version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return Fail(error, 400, "the request line's version is not HTTP/1.x");
  }
  if (version[5] != '1') {
    return Fail(error, 505, Str("HTTP version ", version, " is not supported (use HTTP/1.1)"));
  }
  out->method = std::string(method);
  out->target = std::string(target);
  out->path = std::string(target.substr(0, target.find('?')));
  out->minor_version = version[7] - '0';
  out->headers.clear();

  bool has_length = false, has_host = false;
  std::string transfer_encoding;
  bool close = false, keep_alive = false;
  out->content_length = 0;
  out->expect_continue = false;
  while (!head.empty()) {
    eol = head.find("\r\n");
    line = head.substr(0, eol);
    head.remove_prefix(eol + 2);
    if (line.empty()) return Fail(error, 400, "an empty line inside the request head");
    if (line.front() == ' ' || line.front() == '\t') {
      return Fail(error, 400, "a folded header line (obsolete line folding is not accepted)");
    }
    if (out->headers.size() == limits.max_headers) {
      return Fail(error, 431, Str("the request has more than ", limits.max_headers, " headers"));
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Fail(error, 400, "a header line is not 'Name: value'");
    }
    const std::string_view value = Trim(line.substr(colon + 1));
    for (unsigned char c : value) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        return Fail(error, 400,
                    Str("header '", line.substr(0, colon), "' holds a control character"));
      }
    }
    std::string name = LowerCopy(line.substr(0, colon));
    if (name == "content-length") {
      if (value.empty() || value.size() > 18) {
        return Fail(error, 400, "Content-Length is not a number");
      }
      size_t n = 0;
      for (char c : value) {
        if (c < '0' || c > '9') return Fail(error, 400, "Content-Length is not a number");
        n = n * 10 + static_cast<size_t>(c - '0');
      }
      if (has_length && n != out->content_length) {
        return Fail(error, 400, "two different Content-Length headers");
      }
      has_length = true;
      out->content_length = n;
    } else if (name == "transfer-encoding") {
      if (!transfer_encoding.empty()) transfer_encoding += ", ";
      transfer_encoding += LowerCopy(value);
    } else if (name == "host") {
      if (has_host) return Fail(error, 400, "two Host headers");
      has_host = true;
    } else if (name == "connection") {
      for (const std::string& t : Tokens(value)) {
        close = close || t == "close";
        keep_alive = keep_alive || t == "keep-alive";
      }
    } else if (name == "expect") {
      out->expect_continue = LowerCopy(value) == "100-continue";
    }
    out->headers.emplace_back(std::move(name), std::string(value));
  }
  if (out->minor_version >= 1 && !has_host) {
    return Fail(error, 400, "an HTTP/1.1 request needs a Host header");
  }
  out->chunked = false;
  if (!transfer_encoding.empty()) {
    // Both framings at once is how requests are smuggled past proxies: refused, not resolved.
    if (has_length) return Fail(error, 400, "both Transfer-Encoding and Content-Length");
    if (out->minor_version == 0) {
      return Fail(error, 400, "Transfer-Encoding in an HTTP/1.0 request");
    }
    if (transfer_encoding != "chunked") {
      return Fail(
          error, 501,
          Str("Transfer-Encoding '", transfer_encoding, "' is not supported (only chunked)"));
    }
    out->chunked = true;
  }
  if (out->content_length > limits.max_body_bytes) {
    return Fail(error, 413,
                Str("the request body (", out->content_length,
                    " bytes) is larger than the limit of ", limits.max_body_bytes, " bytes"));
  }
  out->keep_alive = out->minor_version >= 1 ? !close : keep_alive && !close;
  return true;
}

ChunkedDecoder::Result ChunkedDecoder::Feed(std::string* in, std::string* body,
                                            RequestError* error) {
  auto fail = [error](int status, std::string message) {
    Fail(error, status, std::move(message));
    return Result::kError;
  };
  size_t at = 0;  // Consumed from the front of `in`; erased once, on the way out.
  Result result = Result::kMore;
  while (result == Result::kMore) {
    const std::string_view rest = std::string_view(*in).substr(at);
    if (state_ == State::kSize) {
      const size_t eol = rest.find("\r\n");
      // The same bound whether the line's end has arrived or not (else the verdict would depend
      // on how the bytes were split).
      if (eol == std::string_view::npos ? rest.size() > 1025
                                        : eol > 1024) {  // 1025: a '\r' may end it.
        return fail(400, "a chunk-size line is longer than 1 KiB");
      }
      if (eol == std::string_view::npos) break;
      std::string_view line = rest.substr(0, eol);
      line = Trim(line.substr(0, line.find(';')));  // Extensions are ignored.
      if (line.empty() || line.size() > 15) return fail(400, "a chunk size is not a hex number");
      size_t size = 0;
      for (char c : line) {
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
        if (d < 0) return fail(400, "a chunk size is not a hex number");
        size = size * 16 + static_cast<size_t>(d);
      }
      at += eol + 2;
      if (size == 0) {
        state_ = State::kTrailer;
      } else {
        if (size > max_body_ - std::min(max_body_, body->size())) {
          return fail(413,
                      Str("the request body is larger than the limit of ", max_body_, " bytes"));
        }
        remaining_ = size;
        state_ = State::kData;
      }
    } else if (state_ == State::kData) {
      const size_t n = std::min(remaining_, rest.size());
      body->append(rest.data(), n);
      at += n;
      remaining_ -= n;
      if (remaining_ > 0) break;
      state_ = State::kDataEnd;
    } else if (state_ == State::kDataEnd) {
      if (rest.size() < 2) break;
      if (rest.substr(0, 2) != "\r\n") return fail(400, "a chunk's data is not followed by CRLF");
      at += 2;
      state_ = State::kSize;
    } else {  // kTrailer: field lines up to an empty one.
      const size_t eol = rest.find("\r\n");
      if (eol == std::string_view::npos) {
        if (trailer_bytes_ + rest.size() > 8192) {
          return fail(431, "the trailers are larger than 8 KiB");
        }
        break;
      }
      at += eol + 2;
      if (eol == 0) {
        result = Result::kDone;
      } else if ((trailer_bytes_ += eol + 2) > 8192) {
        return fail(431, "the trailers are larger than 8 KiB");
      }
    }
  }
  in->erase(0, at);
  return result;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace pdserve::http
