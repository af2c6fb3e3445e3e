// A worker's runtime LoRA adapter changes: the LoadLoraAdapter and UnloadLoraAdapter RPCs of both
// tiers (the router sends them for /v1/load_lora_adapter and /v1/unload_lora_adapter), and the
// adapters' part of its load reports.
#ifndef PDSERVE_COMMON_RPC_LORA_ADMIN_H_
#define PDSERVE_COMMON_RPC_LORA_ADMIN_H_

#include <functional>
#include <memory>

#include <grpcpp/support/server_callback.h>

#include "common/model/lora_registry.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

// Loads `request.lora_path` as `request.lora_name` into `registry` (null: the worker serves no
// adapters and takes none). FailedPrecondition unless the registry allows runtime updates
// (--enable-lora-runtime-updates); InvalidArgument naming the field for an empty or too long
// name or path; the loader's error (NotFound, InvalidArgument) for the files. Loading a name
// already served from the same path again succeeds (a process's tiers share one registry, and a
// router's retry is harmless); from another path it is AlreadyExists.
absl::StatusOr<internal::v1::LoraAdapterChange> LoadLoraAdapter(
    LoraRegistry* registry, const internal::v1::LoadLoraAdapterRequest& request);
// Stops serving an adapter (requests running with it finish). NotFound when it is not served.
absl::StatusOr<internal::v1::LoraAdapterChange> UnloadLoraAdapter(
    LoraRegistry* registry, const internal::v1::UnloadLoraAdapterRequest& request);

// The RPCs' reactors: the change runs on a thread of its own (reading an adapter takes tens of
// milliseconds; gRPC's callback threads must not block), holding the registry; `published` runs
// there before the answer (the worker's load report then shows the registry as it is).
grpc::ServerUnaryReactor* ServeLoadLoraAdapter(grpc::CallbackServerContext* context,
                                               std::shared_ptr<LoraRegistry> registry,
                                               std::function<void()> published,
                                               const internal::v1::LoadLoraAdapterRequest* request,
                                               internal::v1::LoraAdapterChange* response);
grpc::ServerUnaryReactor* ServeUnloadLoraAdapter(grpc::CallbackServerContext* context,
                                                 std::shared_ptr<LoraRegistry> registry,
                                                 std::function<void()> published,
                                                 const internal::v1::UnloadLoraAdapterRequest* request,
                                                 internal::v1::LoraAdapterChange* response);

// Its adapters in a load report: lora_adapters, lora_states, lora_loads, max_cpu_loras and
// lora_runtime_updates.
void FillLoraInfo(const LoraRegistry& registry, internal::v1::WorkerInfo* info);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_LORA_ADMIN_H_
