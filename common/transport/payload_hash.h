// XXH3-64 of a KV transfer's payload, streamed page by page (sender and receiver compute it the
// same way). Compiled inline with this build's vector flags: Debian's libxxhash is built for
// baseline x86-64 and hashes at half the speed of the AVX2 code (10 vs 20 GB/s in cache), and the
// checksum is a fifth of a KV transfer's cost on loopback. Same function, same values.
#ifndef PDSERVE_COMMON_TRANSPORT_PAYLOAD_HASH_H_
#define PDSERVE_COMMON_TRANSPORT_PAYLOAD_HASH_H_

#include <cstddef>
#include <cstdint>

namespace pdserve {

class PayloadHash {
 public:
  PayloadHash();
  void Update(const uint8_t* data, uint64_t len);
  uint64_t Digest() const;

 private:
  static constexpr size_t kStateBytes = 640;  // >= sizeof(XXH3_state_t), checked in the .cc.
  alignas(64) unsigned char state_[kStateBytes];
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_PAYLOAD_HASH_H_
