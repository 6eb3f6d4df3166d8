"""The speed benchmark: speedup over AR on GSM8K, MATH500, HumanEval, MBPP and MT-Bench.

    datasets.py    the five prompt sets shipped in the package; seeded, nested subsets
    prompts.py     prompt formats (chat template or plain) and `prompt_ids`, shared with the
                   controller and the loop
    runner.py      `BenchConfig`; AR and the systems timed interleaved, batch by batch
    stats.py       per-token speedup, geometric mean, paired/stratified BCa bootstrap intervals
    results.py     per-set and across-set summaries; the results.json document
    provenance.py  git commit, device and versions recorded with every result
    report.py      output directory, results.json, results.md, the terminal table
    plots.py       speedup.png and accept_hist.png
    progress.py    the stderr progress bar
    serving.py     `ServingConfig`; the serving regime: continuous batching, units, arrivals
    serving_results.py  throughput, speedup, scaling, latency percentiles; its JSON and tables
    (the command, `specpilot bench`, is specpilot/cli/bench.py)

Importing this package loads no model and needs no GPU.
"""

from specpilot.bench.prompts import BenchPrompt, prompt_ids
from specpilot.bench.runner import BenchConfig

__all__ = ["BenchConfig", "BenchPrompt", "prompt_ids"]
