"""A training loop whose GPU timeline is recorded: natively under torch.profiler, in the guest
under `qcuda-smi trace` (scripts/test-trace.sh compares the two).

A small network with convolutions (cuDNN) and matrix products (cuBLAS) trains with SGD on
synthetic data from a fixed seed, deterministic algorithms, no TF32, so the same kernels run
natively and in the guest.

TRACE_MODE=native: warms up, then runs TRACE_STEPS steps under torch.profiler with
ProfilerActivity.CPU and .CUDA, and prints "TORCH_PROFILER_GPU_EVENTS <n>" and one line per
kernel, "KERNEL <count>|<total µs>|<median µs>|<shortest µs>|<name>", from the profiler's
events (the shortest run is what test-trace.sh compares: on a GPU shared with other processes a
kernel time-sliced against their contexts runs long, which moves a mean and even a median
several-fold); TRACE_EXPORT=FILE also
writes its Chrome trace there.
TRACE_MODE=loop (the guest): warms up, prints "TRAIN ready", trains for TRACE_SECONDS seconds
(a step synchronised each time), prints "TRAIN done <steps>"; then, with TRACE_PROFILER=1, runs
a few steps under torch.profiler and prints "TORCH_PROFILER_GPU_EVENTS <n>" (in the guest CUPTI
cannot attach: docs/profiling.md), writing its trace to TRACE_EXPORT if set.
Always ends with "PASS trace_check" when every loss was finite. Exits 0 on success, 1 on a
failure, 2 with a SKIP line without a CUDA device.
"""

import math
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

NAME = "trace_check"


def model_and_data(dev):
    torch.manual_seed(1234)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator().manual_seed(4321)
    images = torch.randn(256, 3, 64, 64, generator=gen).to(dev)
    labels = torch.randint(0, 10, (256,), generator=gen).to(dev)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(128 * 16 * 16, 1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, opt, images, labels


def step(model, opt, images, labels):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
    return loss.item()


def profiled(model, opt, images, labels, steps):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(model, opt, images, labels)
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"TORCH_PROFILER_GPU_EVENTS {len(gpu)}", flush=True)
    export = os.environ.get("TRACE_EXPORT")
    if export:
        prof.export_chrome_trace(export)
    return gpu


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    mode = os.environ.get("TRACE_MODE", "native")
    dev = torch.device("cuda", 0)
    print(f"{NAME}: torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    model, opt, images, labels = model_and_data(dev)
    losses = [step(model, opt, images, labels) for _ in range(5)]
    torch.cuda.synchronize()
    if mode == "native":
        gpu = profiled(model, opt, images, labels, int(os.environ.get("TRACE_STEPS", "20")))
        kernels = {}
        for e in gpu:
            # Kernels only: copies and memsets are named "Memcpy ..." / "Memset ...".
            if e.name.startswith(("Memcpy", "Memset")):
                continue
            us = getattr(e, "device_time", None)
            if us is None:
                us = e.cuda_time
            kernels.setdefault(e.name, []).append(us)
        for name, durs in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
            print(f"KERNEL {len(durs)}|{sum(durs):.3f}|{statistics.median(durs):.3f}|{min(durs):.3f}|{name}")
    else:
        print("TRAIN ready", flush=True)
        end = time.time() + float(os.environ.get("TRACE_SECONDS", "20"))
        n = 0
        while time.time() < end:
            losses.append(step(model, opt, images, labels))
            n += 1
        print(f"TRAIN done {n}", flush=True)
        if os.environ.get("TRACE_PROFILER") == "1":
            try:
                profiled(model, opt, images, labels, 3)
            except Exception as e:  # the profiler's own failure is a finding, not ours
                print(f"TORCH_PROFILER_ERROR {e}", flush=True)
    if not all(math.isfinite(x) for x in losses):
        print(f"FAIL {NAME}: a loss is not finite")
        return 1
    print(f"PASS {NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
