"""PyTorch's expandable segments on qcuda: the caching allocator built on the driver's virtual
memory management (cuMemAddressReserve of a large range, cuMemCreate/cuMemMap of 2 MiB pages as it
grows, cuMemSetAccess, cuMemUnmap/cuMemRelease as it shrinks). scripts/run-torch-test.sh
--check vmm_check runs it natively and in the guest.

Tensors of growing sizes are made, computed with and checked against the CPU, freed, and the
cache emptied (pages unmapped) and grown again; the allocator's snapshot must show expandable
segments, so a silent fall-back to cudaMalloc cannot pass.

Prints "PASS name" / "FAIL name: why" lines and "TORCH total <s> s"; exits 0 if all passed, 1 if
one failed, 2 with a SKIP line without a CUDA device.
"""

import os
import sys
import time

# Before torch is imported: the allocator reads it at its first allocation.
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402

NAME = "vmm_check"


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    t0 = time.time()
    dev = torch.device("cuda", 0)
    print(f"{NAME}: torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    failed = 0

    def check(name, fn):
        nonlocal failed
        try:
            ok, why = fn()
        except Exception as e:  # a CUDA error is a failure of that check, not of the run
            ok, why = False, f"{type(e).__name__}: {e}"
        failed += not ok
        print(f"PASS {name} ({why})" if ok else f"FAIL {name}: {why}", flush=True)

    def grow_and_compute():
        torch.manual_seed(0)
        worst = 0.0
        kept = []
        for n in (256, 1024, 2048, 3072):
            a, b = torch.randn(n, n), torch.randn(n, n)
            c = a.to(dev) @ b.to(dev)
            kept.append(c)  # the segment must grow under live tensors
            # Checked against the CPU by Freivalds' test (c v against a (b v), two
            # matrix-vector products): a full CPU product of 3072 x 3072 takes minutes in a
            # guest whose CPU is emulated (TCG), and would be all the check measured.
            v = torch.randn(n, 1, dtype=torch.float64)
            ref = a.double() @ (b.double() @ v)
            got = c.cpu().double() @ v
            worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
        total = sum(t.numel() for t in kept)
        return worst < 1e-4, f"{total * 4 >> 20} MiB live, relative error {worst:.1e}"

    def expandable():
        segs = torch.cuda.memory._snapshot()["segments"]
        exp = [s for s in segs if s.get("is_expandable")]
        return bool(exp), f"{len(exp)} expandable of {len(segs)} segments"

    def shrink_and_grow():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # unmaps and releases the free pages
        before = torch.cuda.memory_reserved(dev)
        x = torch.arange(1 << 24, device=dev, dtype=torch.float32)
        s = x.sum().item()
        want = float((1 << 24) * ((1 << 24) - 1) / 2)
        del x
        torch.cuda.empty_cache()
        return abs(s - want) / want < 1e-3, f"reserved {before >> 20} MiB, sum {s:.6g}"

    check("grow an expandable segment under live tensors", grow_and_compute)
    check("the allocator uses expandable segments", expandable)
    check("empty the cache and grow again", shrink_and_grow)
    print(f"TORCH total {time.time() - t0:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
