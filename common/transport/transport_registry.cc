// The backend registry: names to factories. Adding a backend (ucx, nccl) is one line here and a
// library of its own.
#include "common/base/strings.h"
#include "common/transport/kv_transport.h"
#include "common/transport/local_transport.h"
#include "common/transport/staging_transport.h"
#include "common/transport/tcp_transport.h"
#ifdef PDSERVE_HAVE_UCX
#include "common/transport/ucx_transport.h"
#endif
#if PDSERVE_WITH_CUDA
#include "common/transport/device_transport.h"
#include "common/transport/ipc_data_path.h"
#include "common/transport/nccl_data_path.h"
#include "kernels/cuda/nccl_communicator.h"
#include "kernels/cuda/cuda_pool_device.h"
#endif

namespace pdserve {

std::string_view KvPagesDevice(std::string_view backend, std::string_view pool_device) {
  return backend == "tcp" || backend == "ucx" ? "cpu" : pool_device;
}

absl::StatusOr<std::unique_ptr<PoolDevice>> CreatePoolDevice(std::string_view device) {
  if (device != "cuda") return absl::InvalidArgumentError(Str("no pool device for '", device, "'"));
#if PDSERVE_WITH_CUDA
  return cuda::CreateCudaPoolDevice();
#else
  return absl::InvalidArgumentError("this pdserve was built without CUDA");
#endif
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(std::string_view backend,
                                                               const KvTransportOptions& options) {
  if (options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(Str("KV transport: unknown device '", options.device, "'"));
  }
  const bool gpu_pool = options.device == "cuda";
  if (gpu_pool && (backend == "tcp" || backend == "ucx")) {
    // Pages of host memory: staged through a host mirror of the GPU pool.
#if PDSERVE_WITH_CUDA
    KvTransportOptions host = options;
    host.device = "cpu";
    auto inner = CreateKvTransport(backend, host);
    if (!inner.ok()) return inner.status();
    auto device = cuda::CreateCudaPoolDevice();
    if (!device.ok()) return device.status();
    return CreateStagingKvTransport(std::move(*inner), std::move(*device));
#else
    return absl::InvalidArgumentError("this pdserve was built without CUDA");
#endif
  }
  if (!gpu_pool && (backend == "cuda_ipc" || backend == "nccl")) {
    return absl::InvalidArgumentError(
        Str("KV transport '", backend, "' moves pages between GPU pools: it needs --device cuda"));
  }
  if (backend == "local") {
    if (!gpu_pool) return CreateLocalKvTransport(options);
#if PDSERVE_WITH_CUDA
    auto device = cuda::CreateCudaPoolDevice();
    if (!device.ok()) return device.status();
    return CreateLocalKvTransport(options, std::move(*device));
#else
    return absl::InvalidArgumentError("this pdserve was built without CUDA");
#endif
  }
  if (backend == "tcp") return CreateTcpKvTransport(options);
  if (backend == "nccl") {
#if PDSERVE_WITH_CUDA
    auto device = cuda::CreateCudaPoolDevice();
    if (!device.ok()) return device.status();
    auto comms = cuda::CreateNcclCommunicatorFactory(0, options.send_timeout_ms);
    if (!comms.ok()) return comms.status();
    return CreateDeviceKvTransport(
        options, CreateNcclDataPath(std::move(*device), std::move(*comms), options.send_timeout_ms),
        "nccl");
#else
    return absl::InvalidArgumentError(
        "KV transport 'nccl' is not built in (this pdserve was built without CUDA)");
#endif
  }
  if (backend == "cuda_ipc") {
#if PDSERVE_WITH_CUDA
    auto device = cuda::CreateCudaPoolDevice();
    if (!device.ok()) return device.status();
    return CreateDeviceKvTransport(options, CreateIpcDataPath(std::move(*device)), "cuda_ipc");
#else
    return absl::InvalidArgumentError(
        "KV transport 'cuda_ipc' is not built in (this pdserve was built without CUDA)");
#endif
  }
#ifdef PDSERVE_HAVE_UCX
  if (backend == "ucx") return CreateUcxKvTransport(options);
  constexpr const char* kAvailable = "local, tcp, ucx, cuda_ipc, nccl";
#else
  if (backend == "ucx") {
    return absl::InvalidArgumentError(
        "KV transport 'ucx' is not built in (PDSERVE_UCX needs libucx-dev: scripts/setup.sh)");
  }
  constexpr const char* kAvailable = "local, tcp, cuda_ipc, nccl";
#endif
  return absl::InvalidArgumentError(
      Str("unknown KV transport '", backend, "' (available: ", kAvailable, ")"));
}

}  // namespace pdserve
