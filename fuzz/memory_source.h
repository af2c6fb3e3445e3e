// The fuzzers' byte streams: a ByteSource over the input (kv_wire::ByteSource, frame_reader.h).
#ifndef PDSERVE_FUZZ_MEMORY_SOURCE_H_
#define PDSERVE_FUZZ_MEMORY_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/transport/frame_reader.h"

namespace pdserve::fuzz {

class MemorySource : public kv_wire::ByteSource {
 public:
  MemorySource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool Read(void* buf, size_t len) override {
    if (len > size_ - pos_) return false;
    std::memcpy(buf, data_ + pos_, len);
    pos_ += len;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace pdserve::fuzz

#endif  // PDSERVE_FUZZ_MEMORY_SOURCE_H_
