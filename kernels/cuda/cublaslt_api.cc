#include "kernels/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <string>

namespace pdserve::cuda {
namespace {

absl::StatusOr<CublasLtApi> Load() {
  void* lib = ::dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    return absl::UnavailableError(std::string("cannot load cuBLASLt (libcublasLt.so.13, the CUDA "
                                              "13 toolkit's or the libcublas-13-0 package's): ") +
                                  (err != nullptr ? err : "?"));
  }
  CublasLtApi api;
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
    ok = ok && fn != nullptr;
  };
  get(api.Create, "cublasLtCreate");
  get(api.Destroy, "cublasLtDestroy");
  get(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  get(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  get(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  get(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  get(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  get(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  get(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  get(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  get(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(api.Matmul, "cublasLtMatmul");
  if (!ok) return absl::UnavailableError("libcublasLt.so.13 lacks a function pdserve calls");
  return api;  // The library stays loaded for the process's life.
}

}  // namespace

absl::StatusOr<const CublasLtApi*> LoadCublasLt() {
  static const absl::StatusOr<CublasLtApi>* api = new absl::StatusOr<CublasLtApi>(Load());
  if (!api->ok()) return api->status();
  return &**api;
}

}  // namespace pdserve::cuda
