// grpc::ByteBuffer <-> bytes, for the raw (leniently parsed) methods.
#ifndef PDSERVE_COMMON_RPC_BYTE_BUFFER_H_
#define PDSERVE_COMMON_RPC_BYTE_BUFFER_H_

#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <vector>

#include <google/protobuf/message.h>

namespace pdserve {

inline std::string ByteBufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

inline grpc::ByteBuffer MessageToByteBuffer(const google::protobuf::Message& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_BYTE_BUFFER_H_
