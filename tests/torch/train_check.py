"""A small training run whose loss curve must not change when its GPU work is paused and resumed.

A small convolutional network (convolutions and batch norm through cuDNN, the classifier's
matrix products through cuBLAS) trains for TRAIN_STEPS steps (default 50) with SGD on synthetic
data from a fixed seed, with deterministic algorithms (no TF32, cuDNN deterministic, cuBLAS's
fixed workspace), so that two runs on the same GPU give the same losses bit for bit. Each step
prints "LOSS <step> <float.hex()> <decimal>"; TRAIN_STEP_SLEEP seconds pass between steps (so that
an operator can pause the process mid-run: scripts/test-torch-pause.sh). At the end: "PARAMS
<sum of the parameters, hex>", "TORCH total <s> s", and "PASS train_check" once every loss was
finite and the loss fell. Runs alone too (scripts/run-torch-test.sh --check train_check).

Exits 0 on success, 1 on a failure, 2 with a SKIP line without a CUDA device.
"""

import os
import sys
import time

# Before torch starts cuBLAS: deterministic cuBLAS needs a fixed workspace.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

NAME = "train_check"


def main():
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"SKIP {NAME}: no CUDA device")
        return 2
    steps = int(os.environ.get("TRAIN_STEPS", "50"))
    pause = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))
    t0 = time.time()
    torch.manual_seed(1234)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda", 0)
    print(f"{NAME}: torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)

    gen = torch.Generator().manual_seed(4321)
    images = torch.randn(512, 3, 32, 32, generator=gen)
    # Labels a network can learn: from the mean of each image's first channel.
    labels = (images[:, 0].mean(dim=(1, 2)) * 40).long().clamp(-5, 4) + 5
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images, labels = images.to(dev), labels.to(dev)
    print("TRAIN ready", flush=True)
    losses = []
    for step in range(steps):
        at = (step * 64) % images.shape[0]
        x, y = images[at : at + 64], labels[at : at + 64]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        losses.append(value)
        print(f"LOSS {step} {value.hex()} {value:.6f}", flush=True)
        if pause:
            time.sleep(pause)
    with torch.no_grad():
        total = sum(float(p.double().sum()) for p in model.parameters())
    print(f"PARAMS {total.hex()}")
    print(f"TORCH total {time.time() - t0:.2f} s")
    if not all(v == v and abs(v) != float("inf") for v in losses):
        print(f"FAIL {NAME}: a loss is not finite")
        return 1
    if len(losses) >= 10 and not sum(losses[-5:]) < sum(losses[:5]):
        print(f"FAIL {NAME}: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
        return 1
    print(f"PASS {NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
