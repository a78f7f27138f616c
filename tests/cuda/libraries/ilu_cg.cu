// SPDX-License-Identifier: Apache-2.0 OR MIT
// An ILU(0)-preconditioned conjugate gradient on cuSPARSE and cuBLAS, as NVIDIA's
// conjugateGradientPrecond sample builds one: the 2-D Poisson matrix (5-point Laplacian on a
// 256 x 256 grid, CSR), its incomplete LU factors by cusparseDcsrilu02, the two triangular
// solves per iteration by cusparseSpSV on the factors' lower (unit) and upper halves, SpMV and
// the vector updates by cuSPARSE and cuBLAS. The solution must match x = 1 (b = A * 1) and its
// residual, computed again on the host, must be small; then everything is destroyed, each
// destroy checked: cusparseDestroyCsrilu02Info among them, whose failure in a guest
// (CUSPARSE_STATUS_INVALID_VALUE) is what this program is for.
//
// cuSPARSE and cuBLAS carry NVIDIA's runtime linked in statically, which reaches the driver
// (qcuda's libcuda.so.1 in a guest) through cuGetProcAddress; this program itself uses our
// libcudart.so.13. When a destroy fails it runs itself again with QCUDA_DRIVER_TRACE=1 (qcuda's
// driver face then prints every driver call and its result on stderr) and prints the driver
// calls from the start of the teardown on, so that the log names the call that answered
// differently from native.
//
// Built by scripts/build-cuda-tests.sh --src=tests/cuda/libraries (headers and link-time
// libraries from scripts/cuda-toolchain.sh --libraries); run-gpu-tests.sh --libraries runs it
// natively and in a chrooted guest with the host toolkit's libraries.
#define TEST_NAME "ilu_cg"
#include "../selfcheck.cuh"

// csrilu02 is what the sample uses, and what fails: deprecated, still in cuSPARSE 12.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cusparse.h>
#include <unistd.h>

// Set in the traced re-run: print the teardown marker, and do not re-run again.
static bool traced_child() { return std::getenv("QCUDA_ILU_CG_TRACED") != nullptr; }

// The first destroy that failed, for the re-run's report.
static std::string teardown_failure;

#define CUSPARSE(call)                                                                           \
    do {                                                                                         \
        cusparseStatus_t s_ = (call);                                                            \
        if (s_ != CUSPARSE_STATUS_SUCCESS)                                                       \
            fail("%s returned %s (%d) at line %d", #call, cusparseGetErrorName(s_), (int)s_,     \
                 __LINE__);                                                                      \
    } while (0)

#define CUBLAS(call)                                                                             \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                         \
            fail("%s returned %s (%d) at line %d", #call, cublasGetStatusName(s_), (int)s_,      \
                 __LINE__);                                                                      \
    } while (0)

// A destroy call: its failure is recorded (the first one), the teardown goes on.
#define TEARDOWN(call, status_t, ok, name_of)                                                    \
    do {                                                                                         \
        status_t s_ = (call);                                                                    \
        std::printf("teardown: %-44s %s\n", #call, name_of(s_));                                 \
        if (s_ != (ok) && teardown_failure.empty())                                              \
            teardown_failure = std::string(#call) + " returned " + name_of(s_);                   \
    } while (0)
#define TEARDOWN_SPARSE(call) TEARDOWN(call, cusparseStatus_t, CUSPARSE_STATUS_SUCCESS, cusparseGetErrorName)
#define TEARDOWN_BLAS(call) TEARDOWN(call, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)
#define TEARDOWN_RT(call) TEARDOWN(call, cudaError_t, cudaSuccess, cudaGetErrorName)

// The 5-point Laplacian of an n x n grid (Dirichlet boundary), CSR with sorted columns.
static void laplacian(int n, std::vector<int> &rows, std::vector<int> &cols, std::vector<double> &vals)
{
    rows.assign(1, 0);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            int r = i * n + j;
            auto add = [&](int c, double v) {
                cols.push_back(c);
                vals.push_back(v);
            };
            if (i > 0) add(r - n, -1.0);
            if (j > 0) add(r - 1, -1.0);
            add(r, 4.0);
            if (j < n - 1) add(r + 1, -1.0);
            if (i < n - 1) add(r + n, -1.0);
            rows.push_back((int)cols.size());
        }
    }
}

// Runs this program again with the driver trace on, and prints its trace from the teardown on.
static void rerun_traced()
{
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return;
    exe[len] = 0;
    char trace[] = "/tmp/ilu_cg.trace.XXXXXX";
    int fd = mkstemp(trace);
    if (fd < 0) return;
    close(fd);
    std::string cmd = std::string("QCUDA_DRIVER_TRACE=1 QCUDA_ILU_CG_TRACED=1 '") + exe + "' >/dev/null 2>'" + trace + "'";
    std::printf("teardown failed: running again with QCUDA_DRIVER_TRACE=1 (qcuda's driver face "
                "prints each driver call)\n");
    std::fflush(stdout);
    int rc = std::system(cmd.c_str());
    FILE *f = std::fopen(trace, "r");
    if (!f) return;
    char line[1024];
    bool on = false;
    int shown = 0, before = 0;
    std::vector<std::string> tail;  // the last driver calls before the teardown
    while (std::fgets(line, sizeof line, f)) {
        if (std::strstr(line, "ilu_cg: teardown begins")) {
            on = true;
            for (auto &t : tail) std::printf("trace (before the teardown): %s", t.c_str());
            continue;
        }
        if (!on) {
            before++;
            tail.push_back(line);
            if (tail.size() > 12) tail.erase(tail.begin());
        } else if (shown++ < 400) {
            std::printf("trace: %s", line);
        }
    }
    std::fclose(f);
    unlink(trace);
    std::printf("traced run: exit %d, %d trace lines before the teardown, %d after it%s\n", rc, before,
                shown, shown == 0 && !on ? " (no qcuda trace: not qcuda's driver?)" : "");
}

int main()
{
    require_device();
    const int n = 256, N = n * n;
    std::vector<int> rows, cols;
    std::vector<double> vals;
    laplacian(n, rows, cols, vals);
    const int nnz = (int)vals.size();
    std::vector<double> x_true(N, 1.0), b(N, 0.0);
    for (int r = 0; r < N; r++)
        for (int k = rows[r]; k < rows[r + 1]; k++) b[r] += vals[k] * x_true[cols[k]];

    int *d_rows, *d_cols;
    double *d_vals, *d_ilu, *d_x, *d_r, *d_z, *d_p, *d_q, *d_y;
    CHECK(cudaMalloc(&d_rows, (N + 1) * sizeof(int)));
    CHECK(cudaMalloc(&d_cols, nnz * sizeof(int)));
    CHECK(cudaMalloc(&d_vals, nnz * sizeof(double)));
    CHECK(cudaMalloc(&d_ilu, nnz * sizeof(double)));
    for (double **v : {&d_x, &d_r, &d_z, &d_p, &d_q, &d_y}) CHECK(cudaMalloc(v, N * sizeof(double)));
    CHECK(cudaMemcpy(d_rows, rows.data(), (N + 1) * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_cols, cols.data(), nnz * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_vals, vals.data(), nnz * sizeof(double), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_ilu, vals.data(), nnz * sizeof(double), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_r, b.data(), N * sizeof(double), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_x, 0, N * sizeof(double)));

    cublasHandle_t blas;
    cusparseHandle_t sparse;
    CUBLAS(cublasCreate(&blas));
    CUSPARSE(cusparseCreate(&sparse));
    int version = 0;
    CUSPARSE(cusparseGetVersion(sparse, &version));
    std::printf("ilu_cg: cuSPARSE %d, N = %d, nnz = %d\n", version, N, nnz);

    // The incomplete LU factors, in place of a copy of A (legacy csrilu02: its info object).
    cusparseMatDescr_t descr;
    CUSPARSE(cusparseCreateMatDescr(&descr));
    CUSPARSE(cusparseSetMatType(descr, CUSPARSE_MATRIX_TYPE_GENERAL));
    CUSPARSE(cusparseSetMatIndexBase(descr, CUSPARSE_INDEX_BASE_ZERO));
    csrilu02Info_t ilu;
    CUSPARSE(cusparseCreateCsrilu02Info(&ilu));
    int ilu_bytes = 0;
    CUSPARSE(cusparseDcsrilu02_bufferSize(sparse, N, nnz, descr, d_ilu, d_rows, d_cols, ilu, &ilu_bytes));
    void *ilu_buffer;
    CHECK(cudaMalloc(&ilu_buffer, ilu_bytes));
    CUSPARSE(cusparseDcsrilu02_analysis(sparse, N, nnz, descr, d_ilu, d_rows, d_cols, ilu,
                                        CUSPARSE_SOLVE_POLICY_USE_LEVEL, ilu_buffer));
    int zero_pivot = 0;
    if (cusparseXcsrilu02_zeroPivot(sparse, ilu, &zero_pivot) == CUSPARSE_STATUS_ZERO_PIVOT)
        fail("structural zero pivot at %d", zero_pivot);
    CUSPARSE(cusparseDcsrilu02(sparse, N, nnz, descr, d_ilu, d_rows, d_cols, ilu,
                               CUSPARSE_SOLVE_POLICY_USE_LEVEL, ilu_buffer));
    if (cusparseXcsrilu02_zeroPivot(sparse, ilu, &zero_pivot) == CUSPARSE_STATUS_ZERO_PIVOT)
        fail("numerical zero pivot at %d", zero_pivot);

    // A for SpMV; L (unit lower) and U (upper) are views of the factors for SpSV.
    cusparseSpMatDescr_t matA, matL, matU;
    CUSPARSE(cusparseCreateCsr(&matA, N, N, nnz, d_rows, d_cols, d_vals, CUSPARSE_INDEX_32I,
                               CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    CUSPARSE(cusparseCreateCsr(&matL, N, N, nnz, d_rows, d_cols, d_ilu, CUSPARSE_INDEX_32I,
                               CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    CUSPARSE(cusparseCreateCsr(&matU, N, N, nnz, d_rows, d_cols, d_ilu, CUSPARSE_INDEX_32I,
                               CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
    cusparseFillMode_t lower = CUSPARSE_FILL_MODE_LOWER, upper = CUSPARSE_FILL_MODE_UPPER;
    cusparseDiagType_t unit = CUSPARSE_DIAG_TYPE_UNIT, non_unit = CUSPARSE_DIAG_TYPE_NON_UNIT;
    CUSPARSE(cusparseSpMatSetAttribute(matL, CUSPARSE_SPMAT_FILL_MODE, &lower, sizeof lower));
    CUSPARSE(cusparseSpMatSetAttribute(matL, CUSPARSE_SPMAT_DIAG_TYPE, &unit, sizeof unit));
    CUSPARSE(cusparseSpMatSetAttribute(matU, CUSPARSE_SPMAT_FILL_MODE, &upper, sizeof upper));
    CUSPARSE(cusparseSpMatSetAttribute(matU, CUSPARSE_SPMAT_DIAG_TYPE, &non_unit, sizeof non_unit));
    cusparseDnVecDescr_t vecR, vecY, vecZ, vecP, vecQ;
    CUSPARSE(cusparseCreateDnVec(&vecR, N, d_r, CUDA_R_64F));
    CUSPARSE(cusparseCreateDnVec(&vecY, N, d_y, CUDA_R_64F));
    CUSPARSE(cusparseCreateDnVec(&vecZ, N, d_z, CUDA_R_64F));
    CUSPARSE(cusparseCreateDnVec(&vecP, N, d_p, CUDA_R_64F));
    CUSPARSE(cusparseCreateDnVec(&vecQ, N, d_q, CUDA_R_64F));
    const double one = 1.0, zero = 0.0;
    cusparseSpSVDescr_t svL, svU;
    CUSPARSE(cusparseSpSV_createDescr(&svL));
    CUSPARSE(cusparseSpSV_createDescr(&svU));
    size_t bytesL = 0, bytesU = 0, bytesMv = 0;
    CUSPARSE(cusparseSpSV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matL, vecR, vecY,
                                     CUDA_R_64F, CUSPARSE_SPSV_ALG_DEFAULT, svL, &bytesL));
    CUSPARSE(cusparseSpSV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matU, vecY, vecZ,
                                     CUDA_R_64F, CUSPARSE_SPSV_ALG_DEFAULT, svU, &bytesU));
    CUSPARSE(cusparseSpMV_bufferSize(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matA, vecP, &zero,
                                     vecQ, CUDA_R_64F, CUSPARSE_SPMV_ALG_DEFAULT, &bytesMv));
    void *bufL, *bufU, *bufMv;
    CHECK(cudaMalloc(&bufL, bytesL ? bytesL : 1));
    CHECK(cudaMalloc(&bufU, bytesU ? bytesU : 1));
    CHECK(cudaMalloc(&bufMv, bytesMv ? bytesMv : 1));
    CUSPARSE(cusparseSpSV_analysis(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matL, vecR, vecY,
                                   CUDA_R_64F, CUSPARSE_SPSV_ALG_DEFAULT, svL, bufL));
    CUSPARSE(cusparseSpSV_analysis(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matU, vecY, vecZ,
                                   CUDA_R_64F, CUSPARSE_SPSV_ALG_DEFAULT, svU, bufU));

    // PCG: z = M^-1 r (L y = r, U z = y), p = z + beta p, alpha = rz / p.Ap.
    double bnorm = 0, rnorm = 0, rz = 0, rz_old = 0;
    CUBLAS(cublasDnrm2(blas, N, d_r, 1, &bnorm));
    const double tol = 1e-10;
    const int max_iter = 1000;
    int k = 0;
    rnorm = bnorm;
    auto t0 = std::chrono::steady_clock::now();
    while (rnorm / bnorm > tol && k < max_iter) {
        CUSPARSE(cusparseSpSV_solve(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matL, vecR, vecY,
                                    CUDA_R_64F, CUSPARSE_SPSV_ALG_DEFAULT, svL));
        CUSPARSE(cusparseSpSV_solve(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matU, vecY, vecZ,
                                    CUDA_R_64F, CUSPARSE_SPSV_ALG_DEFAULT, svU));
        rz_old = rz;
        CUBLAS(cublasDdot(blas, N, d_r, 1, d_z, 1, &rz));
        if (k == 0) {
            CUBLAS(cublasDcopy(blas, N, d_z, 1, d_p, 1));
        } else {
            double beta = rz / rz_old;
            CUBLAS(cublasDscal(blas, N, &beta, d_p, 1));
            CUBLAS(cublasDaxpy(blas, N, &one, d_z, 1, d_p, 1));
        }
        CUSPARSE(cusparseSpMV(sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, matA, vecP, &zero, vecQ,
                              CUDA_R_64F, CUSPARSE_SPMV_ALG_DEFAULT, bufMv));
        double pq = 0;
        CUBLAS(cublasDdot(blas, N, d_p, 1, d_q, 1, &pq));
        double alpha = rz / pq, neg_alpha = -alpha;
        CUBLAS(cublasDaxpy(blas, N, &alpha, d_p, 1, d_x, 1));
        CUBLAS(cublasDaxpy(blas, N, &neg_alpha, d_q, 1, d_r, 1));
        CUBLAS(cublasDnrm2(blas, N, d_r, 1, &rnorm));
        k++;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<double> x(N);
    CHECK(cudaMemcpy(x.data(), d_x, N * sizeof(double), cudaMemcpyDeviceToHost));
    double err = 0, res = 0;
    for (int r = 0; r < N; r++) {
        err = std::fmax(err, std::fabs(x[r] - x_true[r]));
        double ax = 0;
        for (int kk = rows[r]; kk < rows[r + 1]; kk++) ax += vals[kk] * x[cols[kk]];
        res += (b[r] - ax) * (b[r] - ax);
    }
    res = std::sqrt(res) / bnorm;
    std::printf("ilu_cg: %d iterations in %.3f s, |r|/|b| %.2e (host: %.2e), max |x - 1| %.2e\n", k, secs,
                rnorm / bnorm, res, err);
    if (k >= max_iter || !(res < 1e-8) || !(err < 1e-6))
        fail("did not converge: %d iterations, residual %.2e, error %.2e", k, res, err);

    // The teardown, every call checked.
    CHECK(cudaDeviceSynchronize());
    if (traced_child()) {
        std::fflush(stdout);
        std::fprintf(stderr, "ilu_cg: teardown begins\n");
        std::fflush(stderr);
    }
    TEARDOWN_SPARSE(cusparseDestroyCsrilu02Info(ilu));
    TEARDOWN_SPARSE(cusparseDestroyMatDescr(descr));
    TEARDOWN_SPARSE(cusparseSpSV_destroyDescr(svL));
    TEARDOWN_SPARSE(cusparseSpSV_destroyDescr(svU));
    TEARDOWN_SPARSE(cusparseDestroySpMat(matA));
    TEARDOWN_SPARSE(cusparseDestroySpMat(matL));
    TEARDOWN_SPARSE(cusparseDestroySpMat(matU));
    for (cusparseDnVecDescr_t v : {vecR, vecY, vecZ, vecP, vecQ}) TEARDOWN_SPARSE(cusparseDestroyDnVec(v));
    TEARDOWN_SPARSE(cusparseDestroy(sparse));
    TEARDOWN_BLAS(cublasDestroy(blas));
    for (void *p : {(void *)d_rows, (void *)d_cols, (void *)d_vals, (void *)d_ilu, (void *)d_x, (void *)d_r,
                    (void *)d_z, (void *)d_p, (void *)d_q, (void *)d_y, ilu_buffer, bufL, bufU, bufMv})
        TEARDOWN_RT(cudaFree(p));
    if (!teardown_failure.empty()) {
        if (!traced_child()) rerun_traced();
        fail("converged, but the teardown failed: %s", teardown_failure.c_str());
    }
    return pass();
}
