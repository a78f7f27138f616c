"""JAX (the jax-cuda13 PJRT plugin) on qcuda: a jit+grad training loop of a small MLP on the GPU,
whose losses must match the same loop on JAX's CPU backend step for step, with
XLA_PYTHON_CLIENT_PREALLOCATE=false respected (JAX takes GPU memory as it needs it).
scripts/run-torch-test.sh --check jax_check runs it natively and in the guest.

JAX starts its CUDA backend only where /dev/nvidia0, /dev/nvidiactl or /dev/dxg exists (in the
guest /dev/nvidiactl is a link to /dev/qcuda); the plugin preloads NVIDIA's runtime and
libraries from its wheels, and XLA opens libcuda.so.1 by soname. The DIAG lines print the
device nodes and the gate's answer, the devices, and which driver files the process mapped
(and whether each is qcuda's), so a failure in the guest log explains itself.

Prints "PASS name" / "FAIL name: why" lines and "TORCH total <s> s"; exits 0 if all passed, 1 if
one failed, 2 with a SKIP line without a CUDA device.
"""

import os
import sys
import time

T_START = time.time()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

T_IMPORTED = time.time()

NAME = "jax_check"
IN_GUEST = os.path.exists("/dev/qcuda")
STEPS = 25


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


def gate():
    """JAX's own device-node check, as its backend start-up asks it."""
    try:
        from jax._src import hardware_utils as hw
        nodes = {p: os.path.exists(p) for p in getattr(hw, "_NVIDIA_GPU_DEVICES", [])}
        return f"nodes {nodes}, has_visible_nvidia_gpu() = {hw.has_visible_nvidia_gpu()}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def train(dev, steps=STEPS):
    """Losses of a 2-layer MLP fitted by plain gradient descent, everything on `dev`."""
    with jax.default_device(dev):
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
        w1 = jax.random.normal(k1, (64, 128)) * 0.1
        b1 = jnp.zeros(128)
        w2 = jax.random.normal(k2, (128, 1)) * 0.1
        x = jax.random.normal(k3, (512, 64))
        y = jnp.sin(x.sum(axis=1, keepdims=True))

        def loss(p):
            h = jnp.tanh(x @ p[0] + p[1])
            return jnp.mean((h @ p[2] - y) ** 2)

        @jax.jit
        def step(p):
            value, grads = jax.value_and_grad(loss)(p)
            return value, jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads)

        p, out = (w1, b1, w2), []
        for _ in range(steps):
            value, p = step(p)
            out.append(float(value))
        where = {d.platform for d in p[0].devices()}
        return out, where


def main():
    t0 = T_START
    print(f"DIAG import jax: {T_IMPORTED - T_START:.1f} s", flush=True)
    print(f"DIAG gate: {gate()}", flush=True)
    print(f"DIAG XLA_PYTHON_CLIENT_PREALLOCATE={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')!r}, "
          f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}", flush=True)
    try:
        devices = jax.devices()
    except Exception as e:
        devices, why = [], f"{type(e).__name__}: {e}"
    else:
        why = f"jax.devices() = {devices}"
    print(f"DIAG devices: {why} (at {time.time() - t0:.1f} s)", flush=True)
    print(f"DIAG mapped {mapped()}", flush=True)
    gpus = [d for d in devices if d.platform == "gpu"]
    if not gpus:
        if IN_GUEST:
            # The guest has qcuda's device: JAX not using it is the failure.
            print(f"FAIL JAX's CUDA backend starts: {why}; {gate()}")
            print(f"TORCH total {time.time() - t0:.2f} s")
            return 1
        print(f"SKIP {NAME}: no CUDA device ({why})")
        return 2
    gpu, cpu = gpus[0], jax.devices("cpu")[0]
    print(f"{NAME}: jax {jax.__version__}, {gpu.device_kind} ({gpu})", flush=True)
    jax.config.update("jax_default_matmul_precision", "highest")
    failed = 0

    def check(name, fn):
        nonlocal failed
        try:
            ok, why = fn()
        except Exception as e:  # a CUDA error is a failure of that check, not of the run
            ok, why = False, f"{type(e).__name__}: {e}"
        failed += not ok
        # Where the time goes (under TCG XLA's compilation in the guest dominates).
        why = f"{why}; done at {time.time() - t0:.1f} s"
        print(f"PASS {name} ({why})" if ok else f"FAIL {name}: {why}", flush=True)

    result = {}

    def train_matches_cpu():
        g, where_g = train(gpu)
        print(f"DIAG GPU loop done at {time.time() - t0:.1f} s", flush=True)
        c, where_c = train(cpu)
        result["gpu"] = g
        worst = max(abs(a - b) / max(1e-6, abs(b)) for a, b in zip(g, c))
        ok = where_g == {"gpu"} and where_c == {"cpu"} and worst < 1e-4 and g[-1] < g[0]
        return ok, (f"{STEPS} steps, loss {g[0]:.5f} -> {g[-1]:.5f} (CPU {c[-1]:.5f}), "
                    f"worst relative difference {worst:.1e}")

    def no_preallocation():
        stats = gpu.memory_stats() or {}
        limit = stats.get("bytes_limit", 0)
        pool = stats.get("pool_bytes", stats.get("bytes_reserved", 0))
        want_off = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() in ("false", "0")
        if not limit:
            return False, f"no memory statistics ({stats})"
        if not want_off:
            return True, f"preallocation not turned off: pool {pool >> 20} MiB of {limit >> 20} MiB"
        return pool < limit // 4, f"pool {pool >> 20} MiB of a {limit >> 20} MiB limit (no preallocation)"

    def matmul():
        a = jax.random.normal(jax.random.PRNGKey(5), (512, 512))
        ga, ca = jax.device_put(a, gpu), jax.device_put(a, cpu)
        g = jax.jit(lambda m: m @ m.T)(ga)
        c = jax.jit(lambda m: m @ m.T)(ca)
        gh, ch = jax.device_get(g), jax.device_get(c)
        # Sums of 512 products, up to ~500 on the diagonal: the difference relative to that.
        err = float(jnp.abs(gh - ch).max() / jnp.abs(ch).max())
        return err < 1e-5, f"512^2 matmul (cuBLAS) against the CPU, max relative difference {err:.1e}"

    check("jit+grad training loop matches the CPU", train_matches_cpu)
    check("XLA_PYTHON_CLIENT_PREALLOCATE=false respected", no_preallocation)
    # A lone matmul at the highest precision makes XLA autotune its GEMM (cuBLAS and Triton
    # candidates compiled and timed): 14 s natively on an H200, over 3 minutes of compiling in
    # a guest under TCG, past the lane's limit. The loop's own GEMMs already run on the GPU.
    if os.environ.get("JAX_CHECK_MATMUL") == "1":
        check("matmul matches the CPU", matmul)
    print(f"DIAG at the end: mapped {mapped()}", flush=True)
    print(f"TORCH total {time.time() - t0:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
