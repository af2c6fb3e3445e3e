#include "router/lora_updates.h"

#include <grpcpp/client_context.h>

#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/model/lora_registry.h"
#include "common/rpc/grpc_status.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;
using Change = internal::v1::LoraAdapterChange;
constexpr auto kCallDeadline = std::chrono::seconds(120);
constexpr auto kRepairBackoff = std::chrono::seconds(30);

// One call to a worker, kept alive by the call's callback and by Shared::calls (to cancel it).
struct Call {
  grpc::ClientContext context;
  internal::v1::LoadLoraAdapterRequest load;
  internal::v1::UnloadLoraAdapterRequest unload;
  Change response;
};

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("lora_name: must be given");
  if (name.size() > kMaxLoraNameBytes) {
    return absl::InvalidArgumentError(Str("lora_name: ", name.size(), " bytes; at most ", kMaxLoraNameBytes));
  }
  return absl::OkStatus();
}

std::string Key(const std::string& address, const std::string& name) { return Str(address, "\n", name); }

}  // namespace

struct LoraUpdates::Shared {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  absl::flat_hash_set<std::shared_ptr<Call>> calls;  // In flight.
  absl::flat_hash_map<std::string, std::string> loaded;  // Loaded through this router: name -> path.
  absl::flat_hash_set<std::string> unloaded;             // Unloaded through it (and not loaded since).
  absl::flat_hash_set<std::string> busy;                 // A Load or Unload of these is under way.
  absl::flat_hash_set<std::string> repairing;            // Key(address, name) of repairs in flight.
  absl::flat_hash_map<std::string, Clock::time_point> retry_at;  // Key -> after a failed repair.
};

struct LoraUpdates::Target {
  WorkerPool* pool;
  std::shared_ptr<WorkerPool::Worker> worker;
  grpc::Status status;
  Change change;
};

namespace {

// Sends a load (`path` set) or unload of `name` to `t.worker`; `done` runs once with t's status
// and change filled, on a gRPC thread (or at once when stopping).
void Send(const std::shared_ptr<LoraUpdates::Shared>& shared, LoraUpdates::Target t,
          const std::string& name, const std::string* path,
          std::function<void(LoraUpdates::Target)> done) {
  auto call = std::make_shared<Call>();
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    if (shared->stop) {
      t.status = grpc::Status(grpc::StatusCode::CANCELLED, "the router is stopping");
      done(std::move(t));
      return;
    }
    shared->calls.insert(call);
  }
  call->context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  auto finish = [shared, call, t, done = std::move(done)](grpc::Status status) mutable {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->calls.erase(call);
    }
    t.status = std::move(status);
    t.change = call->response;
    done(std::move(t));
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->cv.notify_all();
  };
  const WorkerPool::Worker& w = *t.worker;
  if (path != nullptr) {
    call->load.set_lora_name(name);
    call->load.set_lora_path(*path);
    if (auto* stub = WorkerPool::PrefillStub(w)) {
      stub->async()->LoadLoraAdapter(&call->context, &call->load, &call->response, std::move(finish));
    } else {
      WorkerPool::DecodeStub(w)->async()->LoadLoraAdapter(&call->context, &call->load, &call->response,
                                                          std::move(finish));
    }
  } else {
    call->unload.set_lora_name(name);
    if (auto* stub = WorkerPool::PrefillStub(w)) {
      stub->async()->UnloadLoraAdapter(&call->context, &call->unload, &call->response, std::move(finish));
    } else {
      WorkerPool::DecodeStub(w)->async()->UnloadLoraAdapter(&call->context, &call->unload,
                                                            &call->response, std::move(finish));
    }
  }
}

// Calls every target and runs `done` once with all of them answered.
void SendAll(const std::shared_ptr<LoraUpdates::Shared>& shared, std::vector<LoraUpdates::Target> targets,
             const std::string& name, const std::string* path,
             std::function<void(std::vector<LoraUpdates::Target>)> done) {
  struct Join {
    std::mutex mu;
    std::vector<LoraUpdates::Target> results;
    size_t left = 0;
    std::function<void(std::vector<LoraUpdates::Target>)> done;
  };
  auto join = std::make_shared<Join>();
  join->left = targets.size();
  join->done = std::move(done);
  if (targets.empty()) return join->done({});
  for (LoraUpdates::Target& t : targets) {
    Send(shared, std::move(t), name, path, [join](LoraUpdates::Target r) {
      bool last;
      {
        std::lock_guard<std::mutex> lock(join->mu);
        join->results.push_back(std::move(r));
        last = --join->left == 0;
      }
      if (last) join->done(std::move(join->results));
    });
  }
}

std::string Describe(const LoraUpdates::Target& t) {
  return Str(WorkerPool::PrefillStub(*t.worker) != nullptr ? "prefill" : "decode", " worker ",
             WorkerPool::Address(*t.worker));
}

absl::Status Failure(const LoraUpdates::Target& t) {
  const absl::Status s = FromGrpcStatus(t.status);
  return absl::Status(s.code(), Str(Describe(t), ": ", s.message()));
}

}  // namespace

LoraUpdates::LoraUpdates(WorkerPool* decode, WorkerPool* prefill, std::string base_model,
                         std::chrono::milliseconds interval)
    : decode_(decode),
      prefill_(prefill),
      base_model_(std::move(base_model)),
      interval_(interval),
      shared_(std::make_shared<Shared>()) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(shared_->mu);
    while (!shared_->stop) {
      shared_->cv.wait_for(lock, interval_);
      if (shared_->stop) break;
      lock.unlock();
      Repair();
      lock.lock();
    }
  });
}

LoraUpdates::~LoraUpdates() { Stop(); }

void LoraUpdates::Stop() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;
    calls.assign(shared_->calls.begin(), shared_->calls.end());
    shared_->cv.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  for (const auto& c : calls) c->context.TryCancel();  // Outside the lock: callbacks may run inline.
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [&] { return shared_->calls.empty(); });
}

void LoraUpdates::Load(const std::string& name, const std::string& path, Done done) {
  if (absl::Status s = CheckName(name); !s.ok()) return done(s);
  if (path.empty()) return done(absl::InvalidArgumentError("lora_path: must be given"));
  if (path.size() > 4096) {
    return done(absl::InvalidArgumentError(Str("lora_path: ", path.size(), " bytes; at most 4096")));
  }
  if (name == base_model_) {
    return done(absl::InvalidArgumentError(Str("lora_name: '", name, "' is the base model's name")));
  }
  const auto already = absl::AlreadyExistsError(Str("The lora adapter '", name, "' has already been loaded."));
  std::vector<Target> targets;
  for (WorkerPool* pool : {decode_, prefill_}) {
    for (auto& [w, info] : pool->UsableWorkers()) targets.push_back({pool, w, {}, {}});
  }
  const bool any_decode = !targets.empty() && targets.front().pool == decode_;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->stop) return done(absl::UnavailableError("the router is stopping"));
    if (shared_->busy.contains(name) || shared_->loaded.contains(name) || decode_->ServesLora(name)) {
      return done(already);
    }
    if (!any_decode) return done(absl::UnavailableError("no decode worker is available"));
    shared_->busy.insert(name);
  }
  auto shared = shared_;
  SendAll(shared, std::move(targets), name, &path,
          [shared, name, path, done = std::move(done)](std::vector<Target> results) {
            const Target* failed = nullptr;
            const Target* first = nullptr;
            for (const Target& r : results) {
              if (!r.status.ok() && failed == nullptr) failed = &r;
              if (r.status.ok() && first == nullptr) first = &r;
            }
            if (failed != nullptr) {
              // Undone where it succeeded (a process's two tiers may share one registry: undone
              // once is enough; the second answers NOT_FOUND, ignored).
              std::vector<Target> undo;
              for (const Target& r : results) {
                if (r.status.ok()) undo.push_back({r.pool, r.worker, {}, {}});
              }
              const absl::Status why = Failure(*failed);
              PD_LOG(Warning) << "LoRA adapter '" << name << "' from " << path << " not loaded: " << why;
              // Answered once undone: a caller that sees the error sees no worker with it.
              SendAll(shared, std::move(undo), name, nullptr, [shared, name, why, done](std::vector<Target>) {
                {
                  std::lock_guard<std::mutex> lock(shared->mu);
                  shared->busy.erase(name);
                }
                done(why);
              });
              return;
            }
            for (const Target& r : results) r.pool->NoteLoraChange(r.worker, r.change, true);
            {
              std::lock_guard<std::mutex> lock(shared->mu);
              shared->loaded[name] = path;
              shared->unloaded.erase(name);
              shared->busy.erase(name);
            }
            PD_LOG(Info) << "LoRA adapter '" << name << "' loaded from " << path << " on "
                         << results.size() << " workers";
            done(first->change);
          });
}

void LoraUpdates::Unload(const std::string& name, Done done) {
  if (absl::Status s = CheckName(name); !s.ok()) return done(s);
  std::vector<Target> targets;
  for (WorkerPool* pool : {decode_, prefill_}) {
    for (auto& [w, info] : pool->UsableWorkers()) {
      if (WorkerPool::LoraState(info, name) != nullptr) targets.push_back({pool, w, {}, {}});
    }
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->stop) return done(absl::UnavailableError("the router is stopping"));
    if (shared_->busy.contains(name)) {
      return done(absl::AbortedError(Str("lora_name: a load or unload of '", name, "' is under way; retry")));
    }
    if (targets.empty() && !shared_->loaded.contains(name)) {
      return done(absl::NotFoundError(Str("The lora adapter '", name, "' cannot be found.")));
    }
    shared_->busy.insert(name);
    shared_->loaded.erase(name);
  }
  auto shared = shared_;
  SendAll(shared, std::move(targets), name, nullptr,
          [shared, name, done = std::move(done)](std::vector<Target> results) {
            const Target* failed = nullptr;
            Change change;
            change.mutable_info()->set_name(name);
            change.mutable_state()->set_name(name);
            for (Target& r : results) {
              // Gone already (a process's other tier shares the registry): as good as removed.
              if (r.status.error_code() == grpc::StatusCode::NOT_FOUND) r.status = grpc::Status::OK;
              if (!r.status.ok()) {
                if (failed == nullptr) failed = &r;
                continue;
              }
              if (!r.change.info().name().empty()) change = r.change;
              r.pool->NoteLoraChange(r.worker, change, false);
            }
            {
              std::lock_guard<std::mutex> lock(shared->mu);
              shared->unloaded.insert(name);
              shared->busy.erase(name);
            }
            if (failed != nullptr) {
              const absl::Status why = Failure(*failed);
              PD_LOG(Warning) << "LoRA adapter '" << name << "' not unloaded everywhere: " << why;
              return done(why);
            }
            PD_LOG(Info) << "LoRA adapter '" << name << "' unloaded from " << results.size() << " workers";
            done(change);
          });
}

void LoraUpdates::Repair() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->loaded.empty() && shared_->unloaded.empty()) return;  // Nothing to send anyone.
  }
  const auto now = Clock::now();
  for (WorkerPool* pool : {decode_, prefill_}) {
    for (auto& [w, info] : pool->UsableWorkers()) {
      if (!info.lora_runtime_updates()) continue;
      // What this worker should be sent: (name, path) to load, or (name, null) to unload.
      std::vector<std::pair<std::string, std::optional<std::string>>> todo;
      const std::string& address = WorkerPool::Address(*w);
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        auto ready = [&](const std::string& name) {
          const std::string key = Key(address, name);
          if (shared_->busy.contains(name) || shared_->repairing.contains(key)) return false;
          auto it = shared_->retry_at.find(key);
          return it == shared_->retry_at.end() || now >= it->second;
        };
        for (const auto& [name, path] : shared_->loaded) {
          if (WorkerPool::LoraState(info, name) == nullptr && ready(name)) todo.emplace_back(name, path);
        }
        for (const std::string& name : shared_->unloaded) {
          if (WorkerPool::LoraState(info, name) != nullptr && ready(name)) todo.emplace_back(name, std::nullopt);
        }
        for (const auto& [name, path] : todo) shared_->repairing.insert(Key(address, name));
      }
      for (const auto& item : todo) {
        const std::string& name = item.first;  // Not a structured binding: lambdas capture it.
        const std::optional<std::string>& path = item.second;
        const bool load = path.has_value();
        PD_LOG(Info) << (load ? "sending" : "unloading") << " LoRA adapter '" << name << "' "
                     << (load ? "to" : "on") << " worker " << address << " (loaded or unloaded "
                     << "through this router while it was away)";
        auto shared = shared_;
        Send(shared, Target{pool, w, {}, {}}, name, load ? &*path : nullptr,
             [shared, name, load, key = Key(address, name)](Target r) {
               // An unload that finds it gone: as good as done (the worker's report was older).
               const bool done = r.status.ok() || (!load && r.status.error_code() == grpc::StatusCode::NOT_FOUND);
               if (done) {
                 if (!load && r.change.info().name().empty()) r.change.mutable_info()->set_name(name);
                 r.pool->NoteLoraChange(r.worker, r.change, load);
               } else if (r.status.error_code() != grpc::StatusCode::CANCELLED) {
                 PD_LOG(Warning) << "LoRA adapter '" << name << "': " << Failure(r)
                                 << " (retrying in 30 s)";
               }
               std::lock_guard<std::mutex> lock(shared->mu);
               shared->repairing.erase(key);
               if (!done) shared->retry_at[key] = Clock::now() + kRepairBackoff;
             });
      }
    }
  }
}

}  // namespace pdserve
