"""Numba (numba-cuda) on qcuda: @cuda.jit kernels with atomics timed by events, device arrays,
pinned and mapped host arrays and streams, each checked against NumPy.
scripts/run-torch-test.sh --check numba_check runs it natively and in the guest.

numba-cuda opens `libcuda.so` at import (then `libcuda.so.1`, then absolute paths), and makes
every driver call through NVIDIA's cuda-bindings, which find the driver through cuda-pathfinder
(`libcuda.so.1` by soname, an already loaded one first). Both must be qcuda's in the guest. The
DIAG lines say which driver files the process mapped, whether each is qcuda's, and what the
pathfinder answered, so that a failure in the guest log explains itself.

Prints "PASS name" / "FAIL name: why" lines and "TORCH total <s> s"; exits 0 if all passed, 1 if
one failed, 2 with a SKIP line without a CUDA device.
"""

import os
import sys
import time

import numpy as np

# numba-cuda 0.30 still names np.row_stack (an alias of np.vstack, deprecated in NumPy 2.0 and
# removed in 2.5) when it compiles its first kernel; on NumPy 2.5 that is an AttributeError,
# natively as in the guest. Give it the alias back, as NumPy had it.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

NAME = "numba_check"
IN_GUEST = os.path.exists("/dev/qcuda")


def mapped():
    """The driver, NVML and runtime files this process has mapped, and whether each is qcuda's
    (the same file as the one in /usr/lib/qcuda: a bind mount over NVIDIA's file is)."""
    paths = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/" in l
                    and any(k in l for k in ("libcuda.so", "libnvidia-ml", "libcudart"))})
    out = []
    for p in paths:
        base = os.path.basename(p)
        tag = ""
        for k, f in (("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1"),
                     ("libcudart", "libcudart.so.13")):
            q = os.path.join("/usr/lib/qcuda", f)
            if base.startswith(k + ".so") and os.path.exists(q):
                try:
                    a, b = os.stat(p), os.stat(q)
                    tag = " (qcuda's)" if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) else " (not qcuda's)"
                except OSError:
                    pass
        out.append(p + tag)
    return out


def pathfinder(name):
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        dl = load_nvidia_dynamic_lib(name)
        return f"{dl.abs_path} (already loaded: {getattr(dl, 'was_already_loaded_from_elsewhere', '?')})"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


@cuda.jit
def histogram(x, bins, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, x[i] % bins, 1)


@cuda.jit
def float_sum(x, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, 0, x[i])


@cuda.jit
def axpb(x, a, b, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = a * x[i] + b


def main():
    t0 = time.time()
    print(f"DIAG after import: mapped {mapped()}", flush=True)
    print(f"DIAG pathfinder: cuda {pathfinder('cuda')}; nvvm {pathfinder('nvvm')}", flush=True)
    try:
        available = cuda.is_available()
    except Exception as e:
        available, why = False, f"{type(e).__name__}: {e}"
    else:
        why = "cuda.is_available() is False"
    if not available:
        if IN_GUEST:
            # The guest has qcuda's device: Numba not finding it is the failure.
            print(f"FAIL numba finds the CUDA device: {why}")
            print(f"DIAG mapped {mapped()}")
            print(f"TORCH total {time.time() - t0:.2f} s")
            return 1
        print(f"SKIP {NAME}: no CUDA device ({why})")
        return 2
    dev = cuda.get_current_device()
    try:
        import numba_cuda
        version = numba_cuda.__version__
    except Exception:
        import numba
        version = numba.__version__
    print(f"{NAME}: numba-cuda {version}, {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}, "
          f"compute capability {dev.compute_capability}", flush=True)
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

    def atomics_and_events():
        x = rng.integers(0, 1 << 20, 1 << 22, dtype=np.int64)
        bins = 97
        dx, dout = cuda.to_device(x), cuda.to_device(np.zeros(bins, dtype=np.int64))
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        histogram[(x.size + 255) // 256, 256](dx, bins, dout)
        e1.record()
        e1.synchronize()
        ms = cuda.event_elapsed_time(e0, e1)
        got = dout.copy_to_host()
        want = np.bincount(x % bins, minlength=bins)
        f = rng.standard_normal(1 << 20)
        ds = cuda.to_device(np.zeros(1))
        float_sum[(f.size + 255) // 256, 256](cuda.to_device(f), ds)
        s = ds.copy_to_host()[0]
        ok = np.array_equal(got, want) and abs(s - f.sum()) < 1e-6 * np.abs(f).sum() and ms > 0
        return ok, f"2^22 integer atomics into {bins} bins, 2^20 float atomics, kernel {ms:.3f} ms by events"

    def device_arrays():
        x = rng.standard_normal(1 << 20).astype(np.float32)
        d = cuda.device_array_like(x)
        axpb[(x.size + 255) // 256, 256](cuda.to_device(x), np.float32(2.0), np.float32(-1.0), d)
        y = d.copy_to_host()
        part = d[1000:2000].copy_to_host()
        ok = np.allclose(y, 2 * x - 1, rtol=1e-6) and np.array_equal(part, y[1000:2000])
        return ok, f"{x.size} floats, a slice copied back"

    def pinned_and_stream():
        n = 1 << 20
        h = cuda.pinned_array(n, dtype=np.float32)
        h[:] = rng.standard_normal(n).astype(np.float32)
        out = cuda.pinned_array(n, dtype=np.float32)
        s = cuda.stream()
        d = cuda.to_device(h, stream=s)
        dy = cuda.device_array(n, dtype=np.float32, stream=s)
        axpb[(n + 255) // 256, 256, s](d, np.float32(3.0), np.float32(0.5), dy)
        dy.copy_to_host(out, stream=s)
        s.synchronize()
        # The GPU fuses 3*h+0.5 into one rounding, NumPy rounds twice: near 0 only atol holds.
        return np.allclose(out, 3 * h + 0.5, rtol=1e-6, atol=1e-6), "async copies of pinned arrays and a kernel on a stream"

    def mapped_array():
        n = 1 << 16
        m = cuda.mapped_array(n, dtype=np.float32)
        m[:] = np.arange(n, dtype=np.float32)
        out = cuda.mapped_array(n, dtype=np.float32)
        axpb[(n + 255) // 256, 256](m, np.float32(0.5), np.float32(1.0), out)
        cuda.synchronize()
        return np.allclose(out, 0.5 * np.arange(n) + 1), "a kernel reading and writing mapped host memory"

    def info():
        free, total = cuda.current_context().get_memory_info()
        return 0 < free <= total, f"memory {free >> 20} MiB free of {total >> 20} MiB"

    check("a @cuda.jit kernel with atomics, timed by events", atomics_and_events)
    check("device arrays", device_arrays)
    check("pinned arrays and a stream", pinned_and_stream)
    check("mapped arrays", mapped_array)
    check("context memory info", info)
    print(f"DIAG at the end: mapped {mapped()}", flush=True)
    print(f"TORCH total {time.time() - t0:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
