#include "common/transport/payload_hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pdserve {
namespace {

XXH3_state_t* State(unsigned char* bytes) { return reinterpret_cast<XXH3_state_t*>(bytes); }

}  // namespace

PayloadHash::PayloadHash() {
  static_assert(sizeof(XXH3_state_t) <= kStateBytes, "PayloadHash::kStateBytes too small");
  static_assert(alignof(XXH3_state_t) <= 64, "PayloadHash state alignment");
  XXH3_64bits_reset(State(state_));
}

void PayloadHash::Update(const uint8_t* data, uint64_t len) {
  XXH3_64bits_update(State(state_), data, static_cast<size_t>(len));
}

uint64_t PayloadHash::Digest() const {
  return XXH3_64bits_digest(reinterpret_cast<const XXH3_state_t*>(state_));
}

}  // namespace pdserve
