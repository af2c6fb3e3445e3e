// The public API (pdserve.v1.Generation), a thin callback-API layer over Router: each Generate
// call validates and tokenizes, opens a stream to a decode worker, and relays its tokens with
// their text (streaming detokenizer, stop strings applied) to the client. Cancellation and
// deadlines travel down with the call.
#ifndef PDSERVE_ROUTER_ROUTER_GRPC_SERVICE_H_
#define PDSERVE_ROUTER_ROUTER_GRPC_SERVICE_H_

#include "pdserve/v1/generation.grpc.pb.h"
#include "router/router.h"

namespace pdserve {

// Generate and Tokenize take raw bytes: requests are parsed leniently (lenient_request.h) so that
// a string that is not UTF-8 is answered with INVALID_ARGUMENT naming the field.
class GenerationService
    : public v1::Generation::WithRawCallbackMethod_Generate<
          v1::Generation::WithRawCallbackMethod_Tokenize<v1::Generation::CallbackService>> {
 public:
  explicit GenerationService(Router* router) : router_(router) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  Router* router_;  // Not owned.
};

// The router's own view (internal.v1.RouterAdmin): per-worker decisions and load, policy
// counters. For operators, `pdserve bench` and tests.
class RouterAdminService : public internal::v1::RouterAdmin::CallbackService {
 public:
  explicit RouterAdminService(Router* router) : router_(router) {}
  grpc::ServerUnaryReactor* GetRouterStats(grpc::CallbackServerContext* context,
                                           const internal::v1::GetRouterStatsRequest* request,
                                           internal::v1::RouterStats* response) override;
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const internal::v1::LoadLoraAdapterRequest* request,
                                            internal::v1::LoraAdapterChange* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const internal::v1::UnloadLoraAdapterRequest* request,
                                              internal::v1::LoraAdapterChange* response) override;

 private:
  // The reactor for a LoRA change: auth, then `start` with the router's LoraUpdates.
  template <typename Start>
  grpc::ServerUnaryReactor* LoraChange(grpc::CallbackServerContext* context,
                                       internal::v1::LoraAdapterChange* response, Start start);
  Router* router_;  // Not owned.
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTER_GRPC_SERVICE_H_
