"""Where a piece of GPU work spends its time, kernel by kernel (torch.profiler over CUDA graph
replays and plain launches), grouped into families: GEMM, attention, top-k/sort, fused Triton,
copies.

Rules: a kernel belongs to the first family whose name fragment it contains (attention before GEMM:
attention kernels say "cutlass" too); figures are per call of the profiled function; idle is the
graph replay's wall time minus the kernel time the profiler saw. CUDA only (`family` and
`summarize` are plain functions of names and times).
"""

from __future__ import annotations

import collections
from typing import Callable

import torch

# kernel name fragments (lower case) -> family; the first family that matches wins
FAMILIES = (
    ("attention", ("fmha", "flash", "attention", "attn")),  # before GEMM: attention kernels say "cutlass" too
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "splitk", "gemv")),
    ("topk/sort", ("topk", "sort", "radix", "scan", "select")),
    ("fused triton", ("triton", "rope_store")),  # inductor's fused kernels; `kernels.rope_store`'s, which replaces some
    ("copy/fill", ("memcpy", "memset", "copy", "fill")),
)
TOP = 12


def family(name: str) -> str:
    low = name.lower()
    for fam, parts in FAMILIES:
        if any(p in low for p in parts):
            return fam
    return "other"


def summarize(kernels: list[tuple[str, float]], calls: int) -> dict:
    """Per call: kernel count, kernel µs, and both by family; the top kernels by total µs."""
    by_family: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for name, us in kernels:
        for table, key in ((by_family, family(name)), (by_name, name)):
            table[key][0] += 1
            table[key][1] += us
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {
        "kernels_per_call": len(kernels) / calls,
        "kernel_us_per_call": sum(us for _, us in kernels) / calls,
        "families": {f: {"kernels": n / calls, "us": us / calls}
                     for f, (n, us) in sorted(by_family.items(), key=lambda kv: -kv[1][1])},
        "top": [{"name": n[:120], "family": family(n), "kernels": c / calls, "us": us / calls} for n, (c, us) in top],
    }


def graphed(fn: Callable[[], object]):
    """`fn` captured in a CUDA graph (warmed up on a side stream first); returns (replay, graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay, graph


def wall_us(fn: Callable[[], object], reps: int) -> float:
    """CUDA-event µs per call over `reps` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def kernels_of(fn: Callable[[], object], reps: int) -> list[tuple[str, float]]:
    """(name, µs) of every kernel the device ran for `reps` calls of `fn`."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def piece(fn: Callable[[], object], reps: int) -> dict:
    """One piece of work: its graph replay's wall µs, and its kernels as a replay and as plain
    launches (the profiler may not see inside a graph on every driver; then the plain launches give
    the kernel mix)."""
    replay, _graph = graphed(fn)
    out = {"graph_wall_us": wall_us(replay, reps), "plain_wall_us": wall_us(fn, reps)}
    out["graph"] = summarize(kernels_of(replay, reps), reps)
    out["plain"] = summarize(kernels_of(fn, reps), reps)
    out["idle_us"] = out["graph_wall_us"] - seen(out)["kernel_us_per_call"]
    return out


def seen(p: dict) -> dict:
    """The kernel summary of a `piece`: the replay's, or the plain launches' where the profiler saw
    nothing inside the replay."""
    return p["graph"] if p["graph"]["kernels_per_call"] else p["plain"]
