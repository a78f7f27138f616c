"""Two-GPU cuFFT on qcuda: a 1D complex transform planned over GPUs 0 and 1 with cufftXt
(scripts/run-torch-test.sh --check cufft_xt_check runs it natively and in the guest). cuFFT is
the library PyTorch brings, called through ctypes; its multi-GPU plans move data between the
GPUs with peer copies (cuMemcpyPeerAsync, cuMemcpy3DPeerAsync) through NVIDIA's runtime and our
driver face.

The data goes host -> descriptor (cufftXtMemcpy host to device), is transformed in place
(cufftXtExecDescriptorC2C), copied device to device into a second descriptor (the shuffled
result into natural order: the copy that failed with CUFFT_INTERNAL_ERROR) and back to the host,
and must match the CPU's FFT.

Prints "PASS name" / "FAIL name: why" lines and "TORCH total <s> s"; exits 0 if all passed, 1 if
one failed, 2 with a SKIP line without two CUDA devices ("SKIP cufft_xt_check: needs 2 GPUs").
"""

import ctypes
import glob
import os
import sys
import time

import torch

NAME = "cufft_xt_check"
N = 1 << 16
CUFFT_C2C = 0x29
CUFFT_FORWARD = -1
XT_FORMAT_INPLACE = 0x02
COPY_HOST_TO_DEVICE, COPY_DEVICE_TO_HOST, COPY_DEVICE_TO_DEVICE = 0, 1, 2


def load_cufft():
    """The libcufft PyTorch uses: already loaded once torch ran an FFT on the GPU."""
    torch.fft.fft(torch.ones(8, dtype=torch.complex64, device="cuda"))
    try:
        return ctypes.CDLL("libcufft.so.12")
    except OSError:
        pass
    roots = [os.path.dirname(torch.__file__)] + sys.path + ["/usr/local/cuda/lib64"]
    for root in roots:
        for pattern in ("nvidia/*/lib/libcufft.so*", "nvidia/cufft/lib/libcufft.so*", "lib/libcufft.so*",
                        "libcufft.so*"):
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                try:
                    return ctypes.CDLL(path)
                except OSError:
                    continue
    raise OSError("libcufft not found")


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    if torch.cuda.device_count() < 2:
        print(f"SKIP {NAME}: needs 2 GPUs ({torch.cuda.device_count()} visible)")
        return 2
    t0 = time.time()
    failed = 0

    def report(ok, name, why):
        nonlocal failed
        print(f"PASS {name} ({why})" if ok else f"FAIL {name}: {why}", flush=True)
        failed += not ok

    try:
        cufft = load_cufft()
    except OSError as e:
        report(False, "cufft_load", str(e))
        print(f"TORCH total {time.time() - t0:.2f} s")
        return 1
    c = ctypes

    def call(what, result):
        if result != 0:
            raise RuntimeError(f"{what} returned cufftResult {result}")

    x = torch.randn(N, dtype=torch.complex64)
    want = torch.fft.fft(x)
    plan = c.c_int(0)
    descs = []
    try:
        call("cufftCreate", cufft.cufftCreate(c.byref(plan)))
        gpus = (c.c_int * 2)(0, 1)
        call("cufftXtSetGPUs", cufft.cufftXtSetGPUs(plan, 2, gpus))
        work = (c.c_size_t * 2)()
        call("cufftMakePlan1d", cufft.cufftMakePlan1d(plan, N, CUFFT_C2C, 1, work))
        data, natural = c.c_void_p(), c.c_void_p()
        call("cufftXtMalloc", cufft.cufftXtMalloc(plan, c.byref(data), XT_FORMAT_INPLACE))
        descs.append(data)
        call("cufftXtMalloc", cufft.cufftXtMalloc(plan, c.byref(natural), XT_FORMAT_INPLACE))
        descs.append(natural)
        call("cufftXtMemcpy H2D", cufft.cufftXtMemcpy(plan, data, c.c_void_p(x.data_ptr()), COPY_HOST_TO_DEVICE))
        call("cufftXtExecDescriptorC2C", cufft.cufftXtExecDescriptorC2C(plan, data, data, CUFFT_FORWARD))
        call("cufftXtMemcpy D2D", cufft.cufftXtMemcpy(plan, natural, data, COPY_DEVICE_TO_DEVICE))
        got = torch.empty(N, dtype=torch.complex64)
        call("cufftXtMemcpy D2H", cufft.cufftXtMemcpy(plan, c.c_void_p(got.data_ptr()), natural, COPY_DEVICE_TO_HOST))
        direct = torch.empty(N, dtype=torch.complex64)
        call("cufftXtMemcpy D2H", cufft.cufftXtMemcpy(plan, c.c_void_p(direct.data_ptr()), data, COPY_DEVICE_TO_HOST))
    except RuntimeError as e:
        report(False, "cufft_xt_two_gpus", str(e))
        print(f"TORCH total {time.time() - t0:.2f} s")
        return 1
    finally:
        for d in descs:
            cufft.cufftXtFree(d)
        cufft.cufftDestroy(plan)

    def err(a):
        r, w = torch.view_as_real(a), torch.view_as_real(want)
        return ((r - w).abs().max() / w.abs().max()).item()

    e1, e2 = err(got), err(direct)
    report(e1 < 1e-4, "cufft_xt_device_to_device", f"natural order after the D2D copy: relative error {e1:.1e}")
    report(e2 < 1e-4, "cufft_xt_device_to_host", f"relative error {e2:.1e}")
    print(f"TORCH total {time.time() - t0:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
