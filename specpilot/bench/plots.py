"""PNG plots of a `BenchResult`: speedup per set with interval bars, accepted-length histograms.

Owns the two figures written next to results.json: `speedup.png` (per set and the geometric mean,
one bar per system, error bars = the run's bootstrap interval, a line at 1x = AR) and
`accept_hist.png` (per system, the share of verification rounds that committed 1, 2, ... tokens,
pooled over sets, with each set's distribution as a line). Speedup is per generated token
(`stats.py`). Uses matplotlib's non-interactive Agg backend, imported lazily. Does not own the
numbers (`results.py`).
"""

from __future__ import annotations

import math
from pathlib import Path

from specpilot.bench.results import BenchResult
from specpilot.bench.stats import TOO_FEW

SPEEDUP_PNG = "speedup.png"
ACCEPT_PNG = "accept_hist.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(result: BenchResult, path: Path) -> Path:
    plt = _pyplot()
    labels = [s.set_name for s in result.systems[0].sets] + ["geomean"]
    n_sys = len(result.systems)
    width = 0.8 / n_sys
    fig, ax = plt.subplots(figsize=(1.3 * len(labels) + 2.0, 4.2))
    top, unbounded = 1.0, False
    for j, s in enumerate(result.systems):
        intervals = [x.speedup for x in s.sets] + [s.geomean]
        xs = [i + (j - (n_sys - 1) / 2) * width for i in range(len(labels))]
        est = [iv.estimate for iv in intervals]
        # no interval (fewer than MIN_UNITS prompts): no error bar, and a star
        bounded = [math.isfinite(iv.low) and math.isfinite(iv.high) for iv in intervals]
        lo = [iv.estimate - iv.low if ok else 0.0 for iv, ok in zip(intervals, bounded)]
        hi = [iv.high - iv.estimate if ok else 0.0 for iv, ok in zip(intervals, bounded)]
        ax.bar(xs, est, width, yerr=[lo, hi], capsize=3, label=s.name, alpha=0.85)
        for x, e, h, ok in zip(xs, est, hi, bounded):
            ax.annotate(f"{e:.2f}" + ("" if ok else "*"), (x, e + h), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
        top = max(top, max(e + h for e, h in zip(est, hi)))
        unbounded |= not all(bounded)
    if unbounded:
        fig.text(0.01, 0.01, f"* no interval ({TOO_FEW} per set)", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="AR")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("speedup over AR (x)")
    c = result.config
    ax.set_title(f"{result.deployment.name}: speedup over AR, {c.max_new_tokens} new tokens, batch {c.batch} "
                 f"({round(100 * c.level)}% {c.interval.value} bootstrap)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_accept_histogram(result: BenchResult, path: Path) -> Path:
    plt = _pyplot()
    systems = result.systems
    fig, axes = plt.subplots(1, len(systems), figsize=(4.6 * len(systems), 3.6), squeeze=False)
    for ax, s in zip(axes[0], systems):
        pooled = s.accept_histogram
        total = sum(pooled)
        if total:
            lengths = range(1, len(pooled) + 1)
            ax.bar(lengths, [c / total for c in pooled], color="0.75", label="all sets")
            for x in s.sets:
                n = sum(x.accept_histogram)
                if n:
                    ax.plot(range(1, len(x.accept_histogram) + 1), [c / n for c in x.accept_histogram],
                            marker="o", markersize=3, linewidth=1, label=x.set_name)
            ax.set_xticks(list(lengths))
        ax.set_xlabel("tokens committed per round (accepted drafts + 1)")
        ax.set_ylabel("share of rounds")
        ax.set_title(f"{s.name}: mean accepted length {s.mean_accepted_length:.2f}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def write_plots(result: BenchResult, out_dir: Path) -> list[Path]:
    return [plot_speedup(result, out_dir / SPEEDUP_PNG), plot_accept_histogram(result, out_dir / ACCEPT_PNG)]
