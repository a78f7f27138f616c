"""Two-process, two-GPU DistributedDataParallel on qcuda (scripts/run-torch-test.sh --check ddp_check
runs it natively and in the guest): the shape torchrun starts, one process per GPU over the NCCL
backend, which needs memory the two processes share (IPC, cuMem shareable handles, host-registered
shared memory).

Each rank trains the same small network for some steps on its half of every batch; DDP averages
the gradients, so both ranks must end with identical parameters, and those must match a
single-process reference that trains on whole batches (same seed, same data). The ranks compare
their parameters through an all_gather (NCCL again) and through files, so a broken collective
cannot hide a mismatch.

Prints "PASS name" / "FAIL name: why" lines and "TORCH total <s> s"; exits 0 if all passed, 1 if
one failed, 2 with a SKIP line without two CUDA devices ("SKIP ddp_check: no CUDA device" or
"SKIP ddp_check: needs 2 GPUs").
"""

import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NAME = "ddp_check"
STEPS = 20
BATCH = 64  # whole batch; each rank takes half
WORLD = 2


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)
    )


def batches():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 4, generator=g)
    for _ in range(STEPS):
        x = torch.randn(BATCH, 32, generator=g)
        yield x, x @ w


def flat(m):
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in m.parameters()])


def reference(device):
    """The single-process run on whole batches: what DDP's averaged gradients amount to."""
    m = model().to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for x, y in batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x.to(device)), y.to(device)).backward()
        opt.step()
    return flat(m)


def rank_main(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    try:
        m = torch.nn.parallel.DistributedDataParallel(model().to(dev), device_ids=[rank])
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        half = BATCH // WORLD
        losses = []
        for x, y in batches():
            xs, ys = x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(xs.to(dev)), ys.to(dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        params = flat(m.module).to(dev)
        gathered = [torch.empty_like(params) for _ in range(WORLD)]
        dist.all_gather(gathered, params)
        torch.cuda.synchronize(dev)
        torch.save(
            {"params": params.cpu(), "gathered": [g.cpu() for g in gathered], "losses": losses},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    if torch.cuda.device_count() < WORLD:
        print(f"SKIP {NAME}: needs 2 GPUs ({torch.cuda.device_count()} visible)")
        return 2
    if not dist.is_nccl_available():
        print(f"FAIL {NAME}: this PyTorch has no NCCL backend")
        return 1
    t0 = time.time()
    print(f"{NAME}: torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.device_count()} devices", flush=True)
    failed = 0

    def report(ok, name, why=""):
        nonlocal failed
        print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)
        failed += not ok

    with tempfile.TemporaryDirectory() as out:
        try:
            mp.spawn(rank_main, args=(free_port(), out), nprocs=WORLD, join=True)
        except Exception as e:  # a rank's exception, re-raised by spawn
            report(False, "ddp_train", f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
            print(f"TORCH total {time.time() - t0:.2f} s")
            return 1
        r = [torch.load(os.path.join(out, f"rank{i}.pt")) for i in range(WORLD)]
    report(True, "ddp_train")
    falls = all(x["losses"][-1] < x["losses"][0] for x in r)
    report(falls, "ddp_loss_falls", f"losses {[(x['losses'][0], x['losses'][-1]) for x in r]}")
    same = torch.equal(r[0]["params"], r[1]["params"])
    report(same, "ddp_ranks_identical",
           f"max difference {(r[0]['params'] - r[1]['params']).abs().max().item():.3e}")
    gathered_ok = all(torch.equal(x["gathered"][i], r[i]["params"]) for x in r for i in range(WORLD))
    report(gathered_ok, "ddp_all_gather", "all_gather disagrees with each rank's own parameters")
    ref = reference(torch.device("cuda", 0))
    err = ((r[0]["params"] - ref).abs().max() / ref.abs().max()).item()
    report(err <= 1e-4, "ddp_matches_single_process", f"relative error {err:.2e} (limit 1e-04)")
    print(f"TORCH total {time.time() - t0:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
