// Kernels of driver_api.cpp, compiled apart (nvcc -fatbin and -ptx) and loaded by the driver API.
extern "C" __device__ int scale = 1;

extern "C" __global__ void vec_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = scale * (a[i] + b[i]);
}

struct Pair {
    int x;
    double y;
};

// Mixed parameter sizes and alignments, for the packed `extra` buffer path.
extern "C" __global__ void fill_pair(Pair *out, char tag, Pair p, long long k) {
    out[threadIdx.x].x = p.x + tag + static_cast<int>(k);
    out[threadIdx.x].y = p.y * threadIdx.x;
}
