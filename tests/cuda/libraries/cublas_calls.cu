// cublas_calls: NVIDIA's cuBLAS and cuBLASLt over qcuda's driver face, with no GPU: run over the
// test double of /dev/qcuda (tests/device-double) by scripts/check-libraries-double.sh, whose
// kernels do nothing. What it checks is the driver calls the libraries make, not their numbers:
// the handle's creation, SGEMMs of the shapes a small network's forward and backward passes
// take (square, tall and thin, split-K-like long inner dimensions), and cuBLASLt matmuls with a
// bias epilogue (PyTorch's fused Linear), each of which must answer CUBLAS_STATUS_SUCCESS. A
// driver call that fails under them (the script runs with QCUDA_TRACE_ERRORS=1) fails the check
// too. Prints "CALL <what> <status>" per call and "RESULT ok|FAIL".
#include <cstdio>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

static int failures = 0;

static void report(const char *what, int status) {
    printf("CALL %s %d\n", what, status);
    fflush(stdout);
    if (status != 0) failures++;
}

static void sgemm(cublasHandle_t h, int m, int n, int k, bool ta, bool tb) {
    float *a = nullptr, *b = nullptr, *c = nullptr;
    const float alpha = 1.0f, beta = 0.0f;
    cudaMalloc(&a, sizeof(float) * m * k);
    cudaMalloc(&b, sizeof(float) * k * n);
    cudaMalloc(&c, sizeof(float) * m * n);
    char what[96];
    snprintf(what, sizeof what, "cublasSgemm(m=%d,n=%d,k=%d,%c%c)", m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N');
    report(what, cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                             &alpha, a, ta ? k : m, b, tb ? n : k, &beta, c, m));
    report("cudaDeviceSynchronize", cudaDeviceSynchronize());
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
}

static void lt_bias(cublasLtHandle_t h, int m, int n, int k) {
    float *a = nullptr, *b = nullptr, *c = nullptr, *bias = nullptr;
    void *ws = nullptr;
    size_t ws_bytes = 32u << 20;
    const float alpha = 1.0f, beta = 0.0f;
    cudaMalloc(&a, sizeof(float) * m * k);
    cudaMalloc(&b, sizeof(float) * k * n);
    cudaMalloc(&c, sizeof(float) * m * n);
    cudaMalloc(&bias, sizeof(float) * m);
    cudaMalloc(&ws, ws_bytes);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    char what[96];
    snprintf(what, sizeof what, "cublasLtMatmulAlgoGetHeuristic(bias,m=%d,n=%d,k=%d)", m, n, k);
    report(what, cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &result, &found));
    if (found == 0) {
        report("cublasLtMatmulAlgoGetHeuristic found an algorithm", 1);
    } else {
        snprintf(what, sizeof what, "cublasLtMatmul(bias,m=%d,n=%d,k=%d)", m, n, k);
        report(what, cublasLtMatmul(h, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &result.algo, ws,
                                    ws_bytes, nullptr));
        report("cudaDeviceSynchronize", cudaDeviceSynchronize());
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(bias);
    cudaFree(ws);
}

int main() {
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    report("cublasCreate", s);
    if (s != CUBLAS_STATUS_SUCCESS) {
        printf("RESULT FAIL\n");
        return 1;
    }
    // A 32-64-1 network on a batch of 1024: forward, then both gradients of each layer.
    const int shapes[][5] = {
        {512, 512, 512, 0, 0}, {64, 1024, 32, 1, 0}, {32, 64, 1024, 0, 1}, {64, 1, 1024, 0, 1},
        {1, 64, 1024, 0, 1},   {64, 1024, 1, 0, 0},  {256, 64, 384, 1, 0},
    };
    for (const auto &g : shapes) sgemm(h, g[0], g[1], g[2], g[3] != 0, g[4] != 0);
    report("cublasDestroy", cublasDestroy(h));
    cublasLtHandle_t lt;
    report("cublasLtCreate", cublasLtCreate(&lt));
    lt_bias(lt, 256, 64, 384);
    lt_bias(lt, 64, 1024, 32);
    report("cublasLtDestroy", cublasLtDestroy(lt));
    printf("RESULT %s\n", failures == 0 ? "ok" : "FAIL");
    return failures == 0 ? 0 : 1;
}
