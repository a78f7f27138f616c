"""PyTorch on qcuda: the operations real models spend their time in, each on the GPU and checked
against the CPU (scripts/run-torch-test.sh runs it natively and in the guest).

  fp32 and bf16 matrix products (cuBLAS, cuBLASLt), a convolution forward and backward
  (cuDNN), a 2D FFT (cuFFT), a small network trained for some steps, whose loss must fall, CUDA
  graphs (torch.cuda.graph capture of a linear layer and elementwise ops, cuBLAS and cuBLASLt
  inside the capture, replayed with new inputs and compared with eager), an all_reduce through
  NCCL on one GPU, and, where there are two GPUs, a tensor moved between them.

Prints one "PASS name" or "FAIL name: why" line per check and "TORCH total <s> s" at the end;
exits 0 if all passed, 1 if one failed, 2 (with a SKIP line) without a CUDA device.
"""

import sys
import time

import torch

NAME = "torch_check"


def close(got, want, rtol, what):
    got, want = got.detach().cpu(), want.detach()
    if got.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-6)).item()
    return err <= rtol, f"{what}: relative error {err:.2e} (limit {rtol:.0e})"


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    t0 = time.time()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"{NAME}: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{torch.cuda.device_count()} device(s)", flush=True)
    results = []

    def check(name, fn):
        try:
            ok, why = fn()
        except Exception as e:  # a CUDA error is a failure of that check, not of the run
            ok, why = False, f"{type(e).__name__}: {e}"
        results.append(ok)
        print(f"PASS {name} ({why})" if ok else f"FAIL {name}: {why}", flush=True)

    a = torch.randn(512, 384)
    b = torch.randn(384, 256)
    check("matmul fp32 (cuBLAS)", lambda: close(a.to(dev) @ b.to(dev), a @ b, 1e-4, "fp32"))
    ab, bb = a.bfloat16(), b.bfloat16()
    check("matmul bf16 (cuBLASLt)",
          lambda: close(ab.to(dev) @ bb.to(dev), ab.float() @ bb.float(), 2e-2, "bf16"))

    def conv():
        conv_cpu = torch.nn.Conv2d(8, 16, 3, padding=1)
        conv_gpu = torch.nn.Conv2d(8, 16, 3, padding=1).to(dev)
        conv_gpu.load_state_dict(conv_cpu.state_dict())
        x = torch.randn(4, 8, 32, 32, requires_grad=True)
        xg = x.detach().to(dev).requires_grad_()
        y, yg = conv_cpu(x), conv_gpu(xg)
        y.square().sum().backward()
        yg.square().sum().backward()
        for got, want, what in [(yg, y, "forward"), (xg.grad, x.grad, "input gradient"),
                                (conv_gpu.weight.grad, conv_cpu.weight.grad, "weight gradient")]:
            ok, why = close(got, want, 1e-3, what)
            if not ok:
                return ok, why
        return True, "forward and backward within 1e-3"

    check("conv2d forward and backward (cuDNN)", conv)
    x = torch.randn(64, 128, dtype=torch.complex64)
    check("fft2 (cuFFT)", lambda: close(torch.fft.fft2(x.to(dev)), torch.fft.fft2(x), 1e-4, "fft2"))

    def train():
        torch.manual_seed(1)
        w_true = torch.randn(32, 1)
        data = torch.randn(1024, 32)
        target = torch.tanh(data @ w_true)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        xd, yd = data.to(dev), target.to(dev)
        losses = []
        for _ in range(100):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(xd), yd)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses[-1] < 0.2 * losses[0], f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in 100 steps"

    check("training a small network", train)

    def cuda_graph(dtype, mode, rtol):
        # The shape of torch.cuda.graph's documented use: warm up on a side stream, capture
        # once (the caching allocator's private pool, cuBLAS inside the capture), then replay
        # with new data copied into the static input. Each replay must give what eager gives.
        torch.manual_seed(2)
        lin = torch.nn.Linear(384, 256).to(dev, dtype)
        static_x = torch.randn(64, 384, device=dev, dtype=dtype)

        def step(x):
            return torch.relu(lin(x)) * 2.0 + 1.0

        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode=mode):
                static_y = step(static_x)
            why = ""
            for i in range(4):
                x = torch.randn(64, 384, dtype=dtype)
                static_x.copy_(x.to(dev))
                graph.replay()
                torch.cuda.synchronize()
                eager = step(x.to(dev))
                ok, why = close(static_y, eager.cpu(), rtol, f"replay {i} against eager")
                if not ok:
                    return ok, why
            graph.reset()
        return True, f"4 replays, {why}"

    check("CUDA graph capture and replay, fp32 linear + relu (cuBLAS)",
          lambda: cuda_graph(torch.float32, "global", 1e-5))
    check("CUDA graph capture and replay, bf16 linear + relu (cuBLASLt, thread-local mode)",
          lambda: cuda_graph(torch.bfloat16, "thread_local", 1e-2))

    def nccl():
        import os
        import tempfile

        import torch.distributed as dist

        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            t = torch.arange(4096, dtype=torch.float32, device=dev)
            dist.all_reduce(t)
            torch.cuda.synchronize()
            return torch.equal(t.cpu(), torch.arange(4096, dtype=torch.float32)), \
                "all_reduce of 4096 floats, one rank"
        finally:
            dist.destroy_process_group()

    check("all_reduce on one GPU (NCCL)", nccl)

    if torch.cuda.device_count() >= 2:
        def two_gpus():
            x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
            y = x.to("cuda:1")
            z = (y * 2).to("cuda:0")
            return (torch.equal(z, x * 2) and y.device.index == 1,
                    f"a tensor from cuda:0 to cuda:1 and back, {torch.cuda.device_count()} devices")

        check("a tensor moves between two GPUs", two_gpus)
    torch.cuda.synchronize()
    print(f"TORCH total {time.time() - t0:.2f} s", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
