#!/usr/bin/env python3
"""Plots bench.csv (scripts/bench.sh) as a PNG: bandwidth against transfer size, native and guest.

One panel per bandwidth metric (h2d/d2h, pageable/pinned, zero-copy read/write), log-scale size
axis, GB/s on a log scale too where the values span more than a decade (a 4 KiB copy in the guest
is a thousand times slower than a 1 GiB one), from 0 otherwise; a solid line for the
native run and a dashed one for the guest, each guest point labelled with its guest/native ratio.
Every other row (latencies in us, launch rates, scaling factors) follows as a table under the
panels.

    scripts/plot-bench.py build/bench-out/bench.csv [-o bench.png] [--title TEXT]

Runs on the development machine (python3 + matplotlib), not on the GPU host.
"""

import argparse
import csv
import math
import sys
from pathlib import Path

BANDWIDTH_ORDER = [
    "h2d_pageable",
    "d2h_pageable",
    "h2d_pinned",
    "d2h_pinned",
    "h2d_pinned_stream",
    "d2h_pinned_stream",
    "h2d_pinned_dma",
    "d2h_pinned_dma",
    "zerocopy_read",
    "zerocopy_write",
]


def number(text):
    """The float in a CSV cell, or None for NA and anything unreadable."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        want = {"metric", "bytes", "native", "guest", "unit", "ratio"}
        missing = want - set(reader.fieldnames or [])
        if missing:
            sys.exit(f"plot-bench: {path}: not a bench.csv (no column {', '.join(sorted(missing))})")
        return [
            {
                "metric": r["metric"],
                "bytes": int(r["bytes"]),
                "native": number(r["native"]),
                "guest": number(r["guest"]),
                "unit": r["unit"],
                "ratio": number(r["ratio"]),
            }
            for r in reader
        ]


def size_label(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def cell(value):
    if value is None:
        return "NA"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def plot(rows, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter

    bandwidth = {}
    for r in rows:
        if r["unit"] == "GB/s":
            bandwidth.setdefault(r["metric"], []).append(r)
    metrics = [m for m in BANDWIDTH_ORDER if m in bandwidth]
    metrics += sorted(m for m in bandwidth if m not in BANDWIDTH_ORDER)
    latency = [r for r in rows if r["unit"] != "GB/s"]
    if not metrics and not latency:
        sys.exit("plot-bench: no rows to plot")

    cols = 2
    panel_rows = math.ceil(len(metrics) / cols)
    table_height = 0.35 * (len(latency) + 1) if latency else 0
    fig = plt.figure(figsize=(12, 3.6 * panel_rows + table_height + 0.8))
    grid = fig.add_gridspec(
        panel_rows + (1 if latency else 0),
        cols,
        height_ratios=[3.6] * panel_rows + ([table_height] if latency else []),
    )
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        points = sorted(bandwidth[metric], key=lambda r: r["bytes"])
        sizes = [r["bytes"] for r in points]
        for side, style in (("native", "o-"), ("guest", "s--")):
            xs = [r["bytes"] for r in points if r[side] is not None]
            ys = [r[side] for r in points if r[side] is not None]
            if xs:
                ax.plot(xs, ys, style, label=side)
        for r in points:
            if r["ratio"] is not None and r["guest"] is not None:
                ax.annotate(
                    f"{r['ratio']:.2f}x",
                    (r["bytes"], r["guest"]),
                    textcoords="offset points",
                    xytext=(0, -13),
                    ha="center",
                    fontsize=7,
                )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(FixedFormatter([size_label(s) for s in sizes]))
        ax.xaxis.set_minor_locator(FixedLocator([]))
        values = [r[side] for r in points for side in ("native", "guest") if r[side]]
        if values and max(values) > 10 * min(values):
            ax.set_yscale("log")
            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            ax.margins(y=0.12)
        else:
            ax.set_ylim(bottom=0, top=max(values or [1]) * 1.1)
        ax.set_title(metric)
        ax.set_xlabel("bytes per transfer")
        ax.set_ylabel("GB/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    if latency:
        ax = fig.add_subplot(grid[panel_rows, :])
        ax.axis("off")
        table = ax.table(
            cellText=[
                [r["metric"], r["unit"], cell(r["native"]), cell(r["guest"]), cell(r["ratio"])]
                for r in latency
            ],
            colLabels=["metric", "unit", "native", "guest", "ratio"],
            loc="center",
            cellLoc="right",
        )
        table.auto_set_font_size(False)
        table.set_fontsize(9)
    fig.suptitle(title + "   (ratio: higher is better, 1 = native speed)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, help="bench.csv written by scripts/bench.sh")
    parser.add_argument("-o", "--output", type=Path, help="PNG to write (default: beside the CSV)")
    parser.add_argument("--title", default="qcuda guest vs native")
    args = parser.parse_args()
    out = args.output or args.csv.with_suffix(".png")
    plot(read_rows(args.csv), out, args.title)
    print(out)


if __name__ == "__main__":
    main()
