"""CuPy on qcuda: arrays, cuBLAS, NVRTC kernels, cuFFT, sort and cuRAND, each checked against
NumPy. scripts/run-torch-test.sh --check cupy_check runs it natively and in the guest.

CuPy links NVIDIA's static runtime into its modules, so its cudaXxx calls run in NVIDIA's runtime
over the driver (qcuda's libcuda.so.1 in the guest); its own driver calls (modules, launches,
NVRTC's cubins) go to the driver by name, cuBLAS, cuFFT and cuRAND are NVIDIA's libraries over
the same driver. The first lines (DIAG) say which driver and runtime files the process mapped
and whether each is qcuda's, so a failure in the guest log explains itself.

Prints "PASS name" / "FAIL name: why" lines and "TORCH total <s> s"; exits 0 if all passed, 1 if
one failed, 2 with a SKIP line without a CUDA device.
"""

import os
import sys
import time

import numpy as np

import cupy as cp

NAME = "cupy_check"
IN_GUEST = os.path.exists("/dev/qcuda")


def mapped():
    """The driver, NVML and runtime files this process has mapped, and whether each is qcuda's
    (the same file as the one in /usr/lib/qcuda: a bind mount over NVIDIA's file is)."""
    paths = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/" in l
                    and any(k in l for k in ("libcuda.so", "libnvidia-ml", "libcudart"))})
    out = []
    for p in paths:
        base = os.path.basename(p)
        ours = {"libcuda": "libcuda.so.1", "libnvidia-ml": "libnvidia-ml.so.1",
                "libcudart": "libcudart.so.13"}
        tag = ""
        for k, f in ours.items():
            q = os.path.join("/usr/lib/qcuda", f)
            if base.startswith(k + ".so") and os.path.exists(q):
                try:
                    a, b = os.stat(p), os.stat(q)
                    tag = " (qcuda's)" if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) else " (not qcuda's)"
                except OSError:
                    pass
        out.append(p + tag)
    return out


def diag(when):
    print(f"DIAG {when}: mapped {mapped()}", flush=True)


def main():
    t0 = time.time()
    diag("after import")
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # cudaErrorNoDevice and friends
        print(f"SKIP {NAME}: no CUDA device ({type(e).__name__}: {e})")
        return 2
    if n == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"{NAME}: cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, "
          f"driver {cp.cuda.runtime.driverGetVersion()}, {props['name'].decode()}", flush=True)
    failed = 0

    def check(name, fn):
        nonlocal failed
        try:
            ok, why = fn()
        except Exception as e:  # a CUDA error is a failure of that check, not of the run
            ok, why = False, f"{type(e).__name__}: {e}"
        failed += not ok
        print(f"PASS {name} ({why})" if ok else f"FAIL {name}: {why}", flush=True)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 384), dtype=np.float32)
    b = rng.standard_normal((384, 256), dtype=np.float32)

    def asarray():
        # An ordinary pageable NumPy array: CuPy first asks the runtime whether it is pinned.
        d = cp.asarray(a)
        back = cp.asnumpy(d)
        return np.array_equal(back, a), f"{a.nbytes >> 10} KiB there and back"

    def pinned():
        mem = cp.cuda.alloc_pinned_memory(a.nbytes)
        h = np.frombuffer(mem, a.dtype, a.size).reshape(a.shape)
        h[...] = a
        s = cp.cuda.Stream(non_blocking=True)
        d = cp.empty_like(a)
        d.set(h, stream=s)
        out = np.empty_like(a)
        d.get(stream=s, out=out)
        s.synchronize()
        return np.array_equal(out, a), "async copies through pinned memory on a stream"

    def gemm():
        c = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
        ref = a.astype(np.float64) @ b.astype(np.float64)
        err = float(np.abs(c - ref).max() / np.abs(ref).max())
        return err < 1e-3, f"512x384 @ 384x256, relative error {err:.1e}"

    def elementwise():
        k = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * y + 1.0f", "qcuda_fma1")
        z = cp.asnumpy(k(cp.asarray(a[:256, :256]), cp.asarray(np.ascontiguousarray(b[:256, :].T))))
        ref = a[:256, :256] * b[:256, :].T + 1
        return np.allclose(z, ref, rtol=1e-6, atol=1e-6), "ElementwiseKernel through NVRTC"

    def raw_kernel():
        src = r'''
        extern "C" __global__ void qcuda_scan_sq(const float *x, float *y, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = x[i] * x[i] + (float)i;
        }'''
        k = cp.RawKernel(src, "qcuda_scan_sq")
        x = cp.asarray(a.ravel())
        y = cp.empty_like(x)
        n = np.uint32(x.size)
        k(((x.size + 255) // 256,), (256,), (x, y, n))
        ref = a.ravel() ** 2 + np.arange(a.size, dtype=np.float32)
        return np.allclose(cp.asnumpy(y), ref, rtol=1e-6), f"RawKernel over {x.size} elements"

    def fft():
        sig = (rng.standard_normal(4096) + 1j * rng.standard_normal(4096)).astype(np.complex64)
        f = cp.asnumpy(cp.fft.fft(cp.asarray(sig)))
        ref = np.fft.fft(sig.astype(np.complex128))
        err = float(np.abs(f - ref).max() / np.abs(ref).max())
        f2 = cp.asnumpy(cp.fft.rfft2(cp.asarray(a)))
        err2 = float(np.abs(f2 - np.fft.rfft2(a.astype(np.float64))).max())
        return err < 1e-4 and err2 < 1e-1, f"c2c 4096 relative error {err:.1e}, r2c 2-D max error {err2:.1e}"

    def sort():
        x = rng.standard_normal(1 << 20).astype(np.float32)
        s = cp.asnumpy(cp.sort(cp.asarray(x)))
        i = rng.integers(0, 1 << 30, 1 << 16, dtype=np.int64)
        arg = cp.asnumpy(cp.argsort(cp.asarray(i)))
        return np.array_equal(s, np.sort(x)) and np.array_equal(i[arg], np.sort(i)), \
            "2^20 floats, argsort of 2^16 integers"

    def curand():
        g1 = cp.random.RandomState(seed=1234).standard_normal(1 << 22, dtype=cp.float32)
        g2 = cp.random.RandomState(seed=1234).standard_normal(1 << 22, dtype=cp.float32)
        x = cp.asnumpy(g1)
        same = bool(cp.all(g1 == g2))
        m, s = float(x.mean()), float(x.std())
        u = cp.asnumpy(cp.random.RandomState(seed=7).uniform(size=1 << 20))
        hist = np.histogram(u, bins=16, range=(0, 1))[0] / u.size
        return same and abs(m) < 5e-3 and abs(s - 1) < 5e-3 and np.abs(hist - 1 / 16).max() < 2e-3, \
            f"normal mean {m:.1e} std {s:.4f}, uniform bins within {np.abs(hist - 1 / 16).max():.1e}, seeded twice equal {same}"

    def reduce_and_sync():
        x = cp.arange(1 << 24, dtype=cp.float64)
        total = float(x.sum())
        cp.cuda.Device(0).synchronize()
        want = (1 << 24) * ((1 << 24) - 1) / 2
        return total == want, f"sum of 2^24 = {total:.6g}"

    check("asarray of a pageable host array", asarray)
    check("pinned memory and a stream", pinned)
    check("cuBLAS GEMM", gemm)
    check("ElementwiseKernel (NVRTC)", elementwise)
    check("RawKernel (NVRTC)", raw_kernel)
    check("cuFFT", fft)
    check("sort (CUB)", sort)
    check("cuRAND", curand)
    check("reduction and device synchronize", reduce_and_sync)
    diag("at the end")
    print(f"TORCH total {time.time() - t0:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
