// SPDX-License-Identifier: Apache-2.0 OR MIT
// gpu_meminfo: device memory in use on every GPU of this host as the driver counts it
// (cudaMemGetInfo, i.e. cuMemGetInfo: total - free), summed, in MiB. The load and kill
// harness (scripts/load-test.sh) runs it natively before and after guest programs; unlike
// nvidia-smi's per-process list it does not depend on the host showing other processes. The
// context this program creates for the query adds the same amount every time, so differences
// between two runs are exact.
#include <cstdio>

#include <cuda_runtime.h>

int main()
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        std::fprintf(stderr, "gpu_meminfo: no CUDA device\n");
        return 1;
    }
    unsigned long long used = 0;
    for (int i = 0; i < count; i++) {
        size_t free_b = 0, total_b = 0;
        cudaError_t err = cudaSetDevice(i);
        if (err == cudaSuccess)
            err = cudaMemGetInfo(&free_b, &total_b);
        if (err != cudaSuccess) {
            std::fprintf(stderr, "gpu_meminfo: device %d: %s\n", i, cudaGetErrorName(err));
            return 1;
        }
        used += total_b - free_b;
    }
    std::printf("%llu\n", used >> 20);
    return 0;
}
