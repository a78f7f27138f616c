// The kernel of vector_add12.cpp, compiled apart (nvcc -fatbin) and loaded as a library.
extern "C" __global__ void vec_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
