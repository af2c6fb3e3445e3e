// Runtime LoRA adapter changes through a router (--enable-lora-runtime-updates; the HTTP API's
// /v1/load_lora_adapter and /v1/unload_lora_adapter, RouterAdmin's RPCs). A load or unload goes
// to every usable worker of both tiers at once and answers when all have; a load that some worker
// refuses is undone on the others. The router keeps what was loaded and unloaded so: every
// `interval` it compares each worker's latest report with that record and sends a worker that
// joined later (or came back, or missed an unload) the same change. Workers started without
// --enable-lora-runtime-updates refuse (FAILED_PRECONDITION) and are left out of that repair.
//
// Each router keeps its own record: with several routers, send a change to each of them.
#ifndef PDSERVE_ROUTER_LORA_UPDATES_H_
#define PDSERVE_ROUTER_LORA_UPDATES_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "router/worker_pool.h"

namespace pdserve {

class LoraUpdates {
 public:
  using Done = std::function<void(absl::StatusOr<internal::v1::LoraAdapterChange>)>;

  // The pools outlive this object. `base_model` is the served model's name (no adapter takes it).
  LoraUpdates(WorkerPool* decode, WorkerPool* prefill, std::string base_model,
              std::chrono::milliseconds interval = std::chrono::seconds(1));
  ~LoraUpdates();  // Stop().
  // Ends the repairs and cancels the calls in flight (their Done still runs: CANCELLED), waiting
  // for them; later changes fail with Unavailable. Idempotent.
  void Stop();

  // `done` runs once, on another thread. Errors name the field, or the worker and its reason:
  // InvalidArgument (a name or path missing or too long, the base model's name, files the
  // workers refuse), AlreadyExists (an adapter of that name is served), NotFound (the files are
  // missing), Unavailable (no decode worker), FailedPrecondition (a worker takes no runtime
  // changes).
  void Load(const std::string& name, const std::string& path, Done done);
  // NotFound when no worker serves `name` (and none is being loaded).
  void Unload(const std::string& name, Done done);

  // The record and the calls in flight, shared with the calls' callbacks; one call's worker.
  struct Shared;
  struct Target;

 private:
  void Repair();

  WorkerPool* const decode_;
  WorkerPool* const prefill_;
  const std::string base_model_;
  const std::chrono::milliseconds interval_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_LORA_UPDATES_H_
