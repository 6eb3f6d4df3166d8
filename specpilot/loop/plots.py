"""The report's two figures, drawn from report.json's data (matplotlib's Agg backend, lazily).

`trajectory.png`
    left: the incumbent's estimated gain over stock after each round (compounded re-measured
    gains of its promotions, with the compounded ends of their 95% intervals as a band — not a
    joint interval), every candidate timed in the round at (incumbent's level) x (1 + its gain)
    with its interval (promoted green, rejected red, undecided grey), guard failures as crosses at
    the incumbent's level (never timed), and the round's promotion threshold;
    right: the final benchmark — AR, stock and the final system's speedup over AR, same run, with
    95% intervals (throughput ratios at the deployment's concurrency for a serving run).
`gaps.png`
    where a token's time goes before (first round's incumbent) and after (final system): verify,
    draft and overhead per token, each forward split into its floor and the part above it, and the
    ceiling as a line.

Owns the figures. Does not own any number (`report.py`).
"""

from __future__ import annotations

from pathlib import Path

VERDICT_COLOR = {"promote": "tab:green", "reject": "tab:red", "need-more-data": "0.55"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def trajectory(report: dict) -> list[dict]:
    """Per round: the incumbent's gain over stock during it ("before") and after it, with the
    compounded ends of the promotions' intervals after it."""
    level = report["start"]["cumulative_gain"] or 0.0
    lo = hi = level
    out = []
    for rd in report["rounds"]:
        before = (level, lo, hi)
        promo = next((e for e in rd["evaluations"] if e["verdict"] == "promote"), None)
        if promo is not None and promo.get("gain") is not None:
            level = (1 + level) * (1 + promo["gain"]) - 1
            lo = (1 + lo) * (1 + promo["gain_lower"]) - 1
            hi = (1 + hi) * (1 + promo["gain_upper"]) - 1
        out.append({"x": rd["index"], "before": before, "after": (level, lo, hi), "round": rd})
    return out


def plot_trajectory(report: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2.2, 1]})
    points = trajectory(report)
    if points:
        # round r spans [r - 0.5, r + 0.5] at the incumbent's level during it; the level after the
        # last round is drawn past it, up to "end"
        xs = [p["x"] - 0.5 for p in points] + [points[-1]["x"] + 0.5, points[-1]["x"] + 0.9]
        levels = [p["before"] for p in points] + [points[-1]["after"]] * 2
        ax.fill_between(xs, [100 * v[1] for v in levels], [100 * v[2] for v in levels], step="post",
                        color="tab:blue", alpha=0.15, label="compounded 95% interval ends")
        ax.step(xs, [100 * v[0] for v in levels], where="post", color="tab:blue", label="incumbent")
        ax.plot([xs[-1]], [100 * levels[-1][0]], marker="o", color="tab:blue")
    for p in points:
        rd, base = p["round"], p["before"][0]
        n = max(1, len(rd["evaluations"]))
        for i, e in enumerate(rd["evaluations"]):
            x = p["x"] - 0.35 + 0.7 * (i + 0.5) / n
            if e["gain"] is None:
                ax.plot([x], [100 * base], marker="x", color="tab:red", markersize=8)
                ax.annotate("guard" if (e.get("guard") or {}).get("passed") is False else "untimed", (x, 100 * base),
                            fontsize=6, xytext=(2, 4), textcoords="offset points")
                continue
            y = (1 + base) * (1 + e["gain"]) - 1
            lo = (1 + base) * (1 + e["gain_lower"]) - 1
            hi = (1 + base) * (1 + e["gain_upper"]) - 1
            ax.errorbar([x], [100 * y], yerr=[[100 * (y - lo)], [100 * (hi - y)]], fmt="o", markersize=4, capsize=2,
                        color=VERDICT_COLOR.get(e["verdict"], "0.5"))
        thresholds = [e["threshold"] for e in rd["evaluations"] if e.get("threshold") is not None]
        if thresholds:
            t = (1 + base) * (1 + thresholds[0]) - 1
            ax.hlines(100 * t, p["x"] - 0.45, p["x"] + 0.45, colors="0.3", linestyles=":", linewidth=1)
    ax.axhline(0, color="black", linewidth=0.6)
    ticks = [p["x"] for p in points]
    ax.set_xticks(ticks + ([ticks[-1] + 0.9] if ticks else []), [f"r{x}" for x in ticks] + (["end"] if ticks else []))
    ax.set_ylabel("estimated gain over stock (%)")
    ax.set_title("incumbent by round; candidates vs it (green promoted, red rejected, grey undecided, "
                 "x guard); dotted: threshold", fontsize=8)
    if ax.get_legend_handles_labels()[0]:  # a run of no rounds has nothing labelled
        ax.legend(fontsize=7, loc="best")
    final = report.get("final")
    if final:
        bars = [("AR", {"estimate": 1.0, "low": 1.0, "high": 1.0}), ("stock", final["stock_speedup"])]
        if final["final"]:
            bars.append(("final", final["final_speedup"]))
        for i, (name, iv) in enumerate(bars):
            est = iv["estimate"]
            ok = iv.get("low") is not None and iv.get("high") is not None
            err = [[est - iv["low"]], [iv["high"] - est]] if ok else None
            bx.bar([i], [est], yerr=err, capsize=4, color=["0.7", "tab:orange", "tab:green"][i])
            bx.annotate(f"{est:.2f}x", (i, est), ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                        textcoords="offset points")
        bx.set_xticks(range(len(bars)), [b[0] for b in bars])
        bx.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        bx.set_ylabel("speedup over AR (x), 95% CI")
        level = ((final.get("bench") or {}).get("levels") or [None])[0]  # a serving run has one level
        bx.set_title(f"final serving run, concurrency {level['concurrency']}" if level else
                     "final benchmark (one run)", fontsize=8)
    else:
        bx.text(0.5, 0.5, "no final benchmark", ha="center", va="center", transform=bx.transAxes)
        bx.set_axis_off()
    fig.suptitle(f"{report['deployment']['name']} on {report['deployment']['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def gap_stack(cost: dict) -> dict:
    """ms per token of each piece: verify and draft split at their floors, overhead."""
    tau = cost["tokens_per_round"] or 1.0
    vf, df = min(cost["verify_floor_ms"], cost["verify_ms"]), min(cost["draft_floor_ms"], cost["draft_ms"])
    return {"verify floor": vf / tau, "verify above floor": (cost["verify_ms"] - vf) / tau,
            "draft floor": df / tau, "draft above floor": (cost["draft_ms"] - df) / tau,
            "overhead": cost["overhead_ms"] / tau}


def plot_gaps(report: dict, path: Path) -> Path:
    plt = _pyplot()
    columns = [(f"before\n{c['system']}", c) for c in [report["gaps"]["before"]] if c]
    columns += [(f"after\n{c['system']}", c) for c in [report["gaps"]["after"]] if c]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = {"verify floor": "tab:blue", "verify above floor": "lightsteelblue", "draft floor": "tab:orange",
              "draft above floor": "navajowhite", "overhead": "0.6"}
    for i, (label, cost) in enumerate(columns):
        bottom = 0.0
        for piece, value in gap_stack(cost).items():
            ax.bar([i], [value], bottom=bottom, color=colors[piece], label=piece if i == 0 else None, width=0.55)
            bottom += value
        ax.hlines(cost["ceiling_ms_per_token"], i - 0.35, i + 0.35, colors="black", linestyles="--",
                  label="ceiling" if i == 0 else None)
        ax.annotate(f"{cost['ms_per_token']:.3g} ms/token", (i, bottom), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(range(len(columns)), [c[0] for c in columns], fontsize=8)
    ax.set_xlim(-0.7, max(len(columns), 2) - 0.3)
    ax.set_ylabel("ms per token")
    ax.set_title("where a token's time goes (per round / tokens per round)", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
