// An HTTP/1.1 request head and its parser (RFC 9112), bounded: the server (http_server.h) feeds
// it the bytes up to the blank line and reads the body the head announces.
#ifndef PDSERVE_COMMON_HTTP_HTTP_REQUEST_H_
#define PDSERVE_COMMON_HTTP_HTTP_REQUEST_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pdserve::http {

struct HttpRequest {
  std::string method;     // "GET", "POST", ... (case-sensitive, as sent).
  std::string target;     // As sent: path and query.
  std::string path;       // target up to '?'.
  int minor_version = 1;  // HTTP/1.<minor>.
  std::vector<std::pair<std::string, std::string>> headers;  // Names lowercased, values trimmed.
  size_t content_length = 0;
  bool chunked =
      false;  // "Transfer-Encoding: chunked": the body follows in chunks (ChunkedDecoder).
  bool keep_alive = true;  // HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with keep-alive.
  bool expect_continue = false;  // "Expect: 100-continue".
  std::string body;
  std::string remote;  // The peer's address (host:port).

  // The value of the first header named `lowercase_name`, or null.
  const std::string* Header(std::string_view lowercase_name) const;
};

// Why a head was refused: the status to answer with (400, 413, 431, 501, 505) and a message.
struct RequestError {
  int status = 400;
  std::string message;
};

struct HeadLimits {
  size_t max_head_bytes = 64 << 10;  // Request line and headers, blank line included.
  size_t max_headers = 128;
  size_t max_body_bytes = 16 << 20;
};

// Where the head ends in `data` (just past "\r\n\r\n"), or 0 while it has not arrived.
size_t FindHeadEnd(std::string_view data);

// Parses `head` (as FindHeadEnd delimits it). Returns false with `error` set when the request
// must be refused; the connection is then closed after the answer.
bool ParseRequestHead(std::string_view head, const HeadLimits& limits, HttpRequest* out,
                      RequestError* error);

// Decodes a chunked request body (RFC 9112 section 7.1) as its bytes arrive: chunk extensions are
// ignored, trailer fields read and dropped. Bounded: the decoded body by max_body_bytes (413), a
// chunk-size line by 1 KiB and the trailers by 8 KiB (400/431).
class ChunkedDecoder {
 public:
  enum class Result { kMore, kDone, kError };
  explicit ChunkedDecoder(size_t max_body_bytes) : max_body_(max_body_bytes) {}
  // Consumes what it can from the front of `in`, appending chunk data to `body`. kDone: the body
  // is complete and `in` starts with whatever followed it (the next request).
  Result Feed(std::string* in, std::string* body, RequestError* error);

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer };
  State state_ = State::kSize;
  size_t remaining_ = 0;  // Of the current chunk's data.
  size_t trailer_bytes_ = 0;
  size_t max_body_;
};

// The reason phrase of a status code ("OK", "Not Found", ...).
const char* ReasonPhrase(int status);

}  // namespace pdserve::http

#endif  // PDSERVE_COMMON_HTTP_HTTP_REQUEST_H_
