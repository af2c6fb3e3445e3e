// TEST INFRASTRUCTURE, never in the pdserve binary: a Communicator between two ranks of this
// process, standing in for NCCL (which needs GPUs, and two of them: it refuses two ranks on one)
// so the nccl data path's logic runs in CI. Sends are buffered copies; the receiver's Recv and
// Skip take them in order, and a size that does not match the next send is an error (on NCCL a
// hang or a fault). A rank that goes away makes the other's Wait fail; Wait gives up after its
// timeout, as the NCCL communicator aborts.
#ifndef PDSERVE_COMMON_TRANSPORT_FAKE_COMMUNICATOR_H_
#define PDSERVE_COMMON_TRANSPORT_FAKE_COMMUNICATOR_H_

#include <memory>

#include "common/transport/communicator.h"

namespace pdserve {

std::unique_ptr<CommunicatorFactory> CreateFakeCommunicatorFactory();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_FAKE_COMMUNICATOR_H_
