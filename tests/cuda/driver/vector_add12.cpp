// A CUDA 12 program: built against CUDA 12.9's runtime headers and NVIDIA's libcudart.so.12
// (PyPI nvidia-cuda-runtime-cu12), it runs in the guest over our libcuda.so.1, as any CUDA 12
// application does over a CUDA 13 driver. Its kernel comes from a library image
// (cudaLibraryLoadData, CUDA 12.0+), compiled apart: no PyPI wheel of CUDA 12 ships nvcc.
// Prints PASS/FAIL/SKIP like tests/cuda/selfcheck.cuh and exits 0/1/2.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vector_add12.kernels.h" // fatbin_image[]

#define NAME "vector_add12"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            std::printf("FAIL " NAME ": %s -> %s at line %d\n", #call, cudaGetErrorName(e_),      \
                        __LINE__);                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main() {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        std::printf("SKIP " NAME ": no CUDA device (%s)\n", cudaGetErrorName(e));
        return 2;
    }
    CK(e);
    int runtime = 0;
    CK(cudaRuntimeGetVersion(&runtime));
    if (runtime / 1000 != 12) {
        std::printf("FAIL " NAME ": runtime version %d is not CUDA 12\n", runtime);
        return 1;
    }
    cudaLibrary_t lib;
    CK(cudaLibraryLoadData(&lib, fatbin_image, nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t kernel;
    CK(cudaLibraryGetKernel(&kernel, lib, "vec_add"));

    const int n = 1 << 20;
    std::vector<float> a(n), b(n), c(n);
    for (int i = 0; i < n; i++) {
        a[i] = 0.5f * i;
        b[i] = float(n - i);
    }
    float *da, *db, *dc;
    CK(cudaMalloc((void **)&da, n * sizeof(float)));
    CK(cudaMalloc((void **)&db, n * sizeof(float)));
    CK(cudaMalloc((void **)&dc, n * sizeof(float)));
    CK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int nn = n;
    void *args[] = {&da, &db, &dc, &nn};
    CK(cudaLaunchKernel((const void *)kernel, dim3((n + 255) / 256), dim3(256), args, 0, s));
    CK(cudaMemcpyAsync(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
        if (c[i] != a[i] + b[i]) {
            std::printf("FAIL " NAME ": c[%d] = %f, want %f\n", i, c[i], a[i] + b[i]);
            return 1;
        }
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    CK(cudaStreamDestroy(s));
    CK(cudaLibraryUnload(lib));
    std::printf("vector_add12: %d elements with CUDA runtime %d\n", n, runtime);
    std::printf("PASS " NAME "\n");
    return 0;
}
