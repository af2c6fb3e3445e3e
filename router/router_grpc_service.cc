#include "router/router_grpc_service.h"

#include "common/base/strings.h"
#include "common/rpc/byte_buffer.h"
#include "common/rpc/grpc_status.h"
#include "router/generate_call.h"
#include "router/lenient_request.h"

namespace pdserve {

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return StartGenerateCall(router_, context, *request);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status auth = router_->api_keys().Check(*context); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  auto parsed = ParseTokenizeRequest(ByteBufferToString(*request));
  if (!parsed.ok()) {
    reactor->Finish(ToGrpcStatus(parsed.status()));
    return reactor;
  }
  auto ids = router_->tokenizer().Encode(parsed->text(), parsed->add_special_tokens());
  if (!ids.ok()) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(Str("text: ", ids.status().message()))));
    return reactor;
  }
  v1::TokenizeResponse out;
  out.mutable_token_ids()->Assign(ids->begin(), ids->end());
  *response = MessageToByteBuffer(out);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest* request,
                                                          v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status auth = router_->api_keys().Check(*context); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  *response = router_->model_info();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pdserve

namespace pdserve {

grpc::ServerUnaryReactor* RouterAdminService::GetRouterStats(
    grpc::CallbackServerContext* context, const internal::v1::GetRouterStatsRequest* request,
    internal::v1::RouterStats* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status auth = router_->api_keys().Check(*context); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  *response = router_->Stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

template <typename Start>
grpc::ServerUnaryReactor* RouterAdminService::LoraChange(grpc::CallbackServerContext* context,
                                                         internal::v1::LoraAdapterChange* response,
                                                         Start start) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status auth = router_->api_keys().Check(*context); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  LoraUpdates* updates = router_->lora_updates();
  if (updates == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "runtime LoRA adapter updates are off on this router (start it "
                                 "with --enable-lora-runtime-updates)"));
    return reactor;
  }
  start(updates, [reactor, response](absl::StatusOr<internal::v1::LoraAdapterChange> change) {
    if (change.ok()) *response = *std::move(change);
    reactor->Finish(ToGrpcStatus(change.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* RouterAdminService::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const internal::v1::LoadLoraAdapterRequest* request,
    internal::v1::LoraAdapterChange* response) {
  return LoraChange(context, response, [request](LoraUpdates* u, LoraUpdates::Done done) {
    u->Load(request->lora_name(), request->lora_path(), std::move(done));
  });
}

grpc::ServerUnaryReactor* RouterAdminService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const internal::v1::UnloadLoraAdapterRequest* request,
    internal::v1::LoraAdapterChange* response) {
  return LoraChange(context, response, [request](LoraUpdates* u, LoraUpdates::Done done) {
    u->Unload(request->lora_name(), std::move(done));
  });
}

}  // namespace pdserve
