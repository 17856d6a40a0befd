// The cuBLAS entry points Baton calls, resolved from libcublas on first use
// (dlopen) instead of linking the library. Linking libcublas.so costs every
// process its relocated cuBLAS and cuBLASLt in host memory before main (the
// figure is in docs/CUDA.md); opened here, that memory is spent by the first
// stage that needs a GEMM, after its weights are loaded
// (engine/cuda/stage_base.h), so a load's peak host memory is the ring plus
// the CUDA context, not the ring plus cuBLAS. The definitions below carry
// the names cublas_v2.h maps its calls to, so call sites are unchanged; a
// missing library makes every call fail with CUBLAS_STATUS_NOT_INITIALIZED
// and cublasGetStatusString say which file was not found.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

namespace {

#define BATON_STR2(x) #x
#define BATON_STR(x) BATON_STR2(x)
constexpr const char* kSoname = "libcublas.so." BATON_STR(CUBLAS_VER_MAJOR);

struct Library {
  void* handle = nullptr;
  std::string error;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    l.handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
#ifdef BATON_CUDA_LIB_DIR
    if (l.handle == nullptr) l.handle = dlopen((std::string(BATON_CUDA_LIB_DIR) + "/" + kSoname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (l.handle == nullptr) {
      const char* e = dlerror();
      l.error = std::string("cuBLAS could not be opened (") + kSoname + "): " + (e ? e : "not found");
    }
    return l;
  }();
  return lib;
}

// The library's own definition of `name` (dlsym on its handle never finds
// the ones in this file).
template <class F>
F resolve(const char* name) {
  const Library& l = library();
  return l.handle ? reinterpret_cast<F>(dlsym(l.handle, name)) : nullptr;
}

}  // namespace

// The pointer type is spelled from the parameters: cublas_v2.h overloads
// some names in C++, so decltype(&name) would be ambiguous.
#define BATON_CUBLAS_FORWARD(name, params, args)                         \
  cublasStatus_t CUBLASWINAPI name params {                              \
    using Fn = cublasStatus_t(CUBLASWINAPI*) params;                     \
    static const Fn f = resolve<Fn>(#name);                              \
    return f ? f args : CUBLAS_STATUS_NOT_INITIALIZED;                   \
  }

extern "C" {

BATON_CUBLAS_FORWARD(cublasCreate_v2, (cublasHandle_t* handle), (handle))
BATON_CUBLAS_FORWARD(cublasDestroy_v2, (cublasHandle_t handle), (handle))
BATON_CUBLAS_FORWARD(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
BATON_CUBLAS_FORWARD(cublasGetStream_v2, (cublasHandle_t handle, cudaStream_t* stream), (handle, stream))
BATON_CUBLAS_FORWARD(cublasSetWorkspace_v2, (cublasHandle_t handle, void* workspace, size_t bytes),
                     (handle, workspace, bytes))
BATON_CUBLAS_FORWARD(cublasSgemm_v2,
                     (cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                      float* C, int ldc),
                     (handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
BATON_CUBLAS_FORWARD(cublasGemmEx,
                     (cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                      int ldb, const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                      cublasGemmAlgo_t algo),
                     (handle, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo))

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  if (library().handle == nullptr) return library().error.c_str();
  using Fn = const char*(CUBLASWINAPI*)(cublasStatus_t);
  static const Fn f = resolve<Fn>("cublasGetStatusString");
  return f ? f(status) : "cublasGetStatusString not found in libcublas";
}

}  // extern "C"
