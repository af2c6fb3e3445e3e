#include "common/rpc/lora_admin.h"

#include <grpcpp/server_context.h>

#include <thread>
#include <utility>

#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/load_publisher.h"

namespace pdserve {
namespace {

void FillChange(const LoraInfo& l, internal::v1::LoraAdapterChange* change) {
  v1::LoraAdapterInfo* info = change->mutable_info();
  info->set_name(l.name);
  info->set_base_model(l.base_model);
  info->set_rank(static_cast<int32_t>(l.rank));
  internal::v1::LoraAdapterState* state = change->mutable_state();
  state->set_name(l.name);
  state->set_kv_root(EncodeBlockHash(l.kv_root));
  state->set_loaded(l.loaded);
}

std::optional<LoraInfo> Find(const LoraRegistry& registry, std::string_view name) {
  for (LoraInfo& l : registry.List()) {
    if (l.name == name) return std::move(l);
  }
  return std::nullopt;
}

absl::Status CheckUpdatable(const LoraRegistry* registry) {
  if (registry == nullptr || !registry->options().runtime_updates) {
    return absl::FailedPreconditionError(
        "runtime LoRA adapter updates are off on this worker (start it with "
        "--enable-lora-runtime-updates)");
  }
  return absl::OkStatus();
}

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("lora_name: must not be empty");
  if (name.size() > kMaxLoraNameBytes) {
    return absl::InvalidArgumentError(Str("lora_name: ", name.size(), " bytes; at most ", kMaxLoraNameBytes));
  }
  return absl::OkStatus();
}

template <typename Request, typename Fn>
grpc::ServerUnaryReactor* RunDetached(grpc::CallbackServerContext* context,
                                      std::shared_ptr<LoraRegistry> registry,
                                      std::function<void()> published, const Request* request,
                                      internal::v1::LoraAdapterChange* response, Fn fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The request and response live until Finish; the registry is held by the thread.
  std::thread([reactor, registry = std::move(registry), published = std::move(published), request,
               response, fn] {
    auto change = fn(registry.get(), *request);
    // Also after a refusal: a registry shared by a process's two tiers may have been changed
    // through the other one, and this worker's report must show it.
    published();
    if (change.ok()) *response = *std::move(change);
    reactor->Finish(ToGrpcStatus(change.status()));
  }).detach();
  return reactor;
}

}  // namespace

absl::StatusOr<internal::v1::LoraAdapterChange> LoadLoraAdapter(
    LoraRegistry* registry, const internal::v1::LoadLoraAdapterRequest& request) {
  if (absl::Status s = CheckUpdatable(registry); !s.ok()) return s;
  if (absl::Status s = CheckName(request.lora_name()); !s.ok()) return s;
  if (request.lora_path().empty()) return absl::InvalidArgumentError("lora_path: must not be empty");
  if (request.lora_path().size() > 4096) {
    return absl::InvalidArgumentError(Str("lora_path: ", request.lora_path().size(), " bytes; at most 4096"));
  }
  absl::Status added = registry->Add(request.lora_name(), request.lora_path());
  std::optional<LoraInfo> now = Find(*registry, request.lora_name());
  if (added.code() == absl::StatusCode::kAlreadyExists && now && now->path == request.lora_path()) {
    added = absl::OkStatus();  // The same adapter: this process's other tier, or a retry.
  }
  if (!added.ok()) return added;
  if (!now) return absl::AbortedError(Str("LoRA adapter '", request.lora_name(), "' was unloaded meanwhile"));
  internal::v1::LoraAdapterChange change;
  FillChange(*now, &change);
  return change;
}

absl::StatusOr<internal::v1::LoraAdapterChange> UnloadLoraAdapter(
    LoraRegistry* registry, const internal::v1::UnloadLoraAdapterRequest& request) {
  if (absl::Status s = CheckUpdatable(registry); !s.ok()) return s;
  if (absl::Status s = CheckName(request.lora_name()); !s.ok()) return s;
  std::optional<LoraInfo> was = Find(*registry, request.lora_name());
  if (absl::Status s = registry->Remove(request.lora_name()); !s.ok()) return s;
  internal::v1::LoraAdapterChange change;
  if (was) FillChange(*was, &change);
  return change;
}

grpc::ServerUnaryReactor* ServeLoadLoraAdapter(grpc::CallbackServerContext* context,
                                               std::shared_ptr<LoraRegistry> registry,
                                               std::function<void()> published,
                                               const internal::v1::LoadLoraAdapterRequest* request,
                                               internal::v1::LoraAdapterChange* response) {
  return RunDetached(context, std::move(registry), std::move(published), request, response, LoadLoraAdapter);
}

grpc::ServerUnaryReactor* ServeUnloadLoraAdapter(grpc::CallbackServerContext* context,
                                                 std::shared_ptr<LoraRegistry> registry,
                                                 std::function<void()> published,
                                                 const internal::v1::UnloadLoraAdapterRequest* request,
                                                 internal::v1::LoraAdapterChange* response) {
  return RunDetached(context, std::move(registry), std::move(published), request, response,
                     UnloadLoraAdapter);
}

void FillLoraInfo(const LoraRegistry& registry, internal::v1::WorkerInfo* info) {
  for (const LoraInfo& l : registry.List()) {
    v1::LoraAdapterInfo* a = info->add_lora_adapters();
    a->set_name(l.name);
    a->set_base_model(l.base_model);
    a->set_rank(static_cast<int32_t>(l.rank));
    internal::v1::LoraAdapterState* s = info->add_lora_states();
    s->set_name(l.name);
    s->set_kv_root(EncodeBlockHash(l.kv_root));
    s->set_loaded(l.loaded);
  }
  info->set_lora_loads(registry.loads());
  info->set_max_cpu_loras(static_cast<int32_t>(registry.options().max_loaded));
  info->set_lora_runtime_updates(registry.options().runtime_updates);
}

}  // namespace pdserve
