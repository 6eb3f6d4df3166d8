"""Rendering and writing a `BenchResult`: results.json, results.md, and the terminal table.

Owns: the output directory (default `<SPECPILOT_HOME>/runs/bench/<UTC time>-<deployment>`; an
existing non-empty directory is refused unless `overwrite`, one that cannot take files — read-only,
full — is a one-line `StorageError` before any timing), the JSON file (`BenchResult.to_dict`,
written by code, atomically: a full disk leaves the previous file whole), the Markdown report and
the plain-text table. Does not own the numbers (`results.py`) or the plots (`plots.py`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

from specpilot import env
from specpilot.bench.results import BenchResult, SystemSummary
from specpilot.bench.stats import MIN_UNITS
from specpilot.errors import ConfigError, writing

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
OUTPUT_FILES = (RESULTS_JSON, RESULTS_MD, "speedup.png", "accept_hist.png")


def default_out_dir(deployment_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return env.home() / "runs" / "bench" / f"{stamp}-{deployment_name}"


def prepare_out_dir(out: str | Path | None, deployment_name: str, overwrite: bool = False) -> Path:
    """The directory results go to, created; refuses one that already holds files unless `overwrite`."""
    path = Path(out) if out else default_out_dir(deployment_name)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(f"--out {path} already holds files; choose another directory or pass --overwrite")
    return env.writable_dir(path, "the results directory")


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file: `path` holds the old text or the new, whole."""
    with writing(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, env.umask_mode())  # mkstemp makes it 0600
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def finite(obj):
    """The document with every NaN or infinite float replaced by null (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_json(result: BenchResult, out_dir: Path) -> Path:
    path = out_dir / RESULTS_JSON
    write_text_atomic(path, json.dumps(finite(result.to_dict()), indent=1, allow_nan=False) + "\n")
    return path


def _fmt(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _headline_rows(result: BenchResult) -> tuple[list[str], list[list[str]]]:
    """Sets as rows; per system its tokens and speedup (and gain over the baseline) with the interval."""
    first = result.systems[0]
    header = ["set", "prompts", "AR tok/s", "AR tokens"]
    for s in result.systems:
        header += [f"{s.name} tokens", f"{s.name} speedup"]
        if s.gain is not None:
            header.append(f"{s.name} / {s.baseline}")
    rows = []
    for k, set_summary in enumerate(first.sets):
        row = [set_summary.set_name, str(set_summary.prompts), _fmt(set_summary.ar_tokens_per_second),
               str(set_summary.ar_tokens)]
        for s in result.systems:
            row += [str(s.sets[k].tokens), s.sets[k].speedup.format()]
            if s.gain is not None:
                row.append(s.sets[k].gain.format())
        rows.append(row)
    geo = ["geomean", str(first.prompts), "", str(first.ar_tokens)]
    for s in result.systems:
        geo += [str(s.tokens), s.geomean.format()]
        if s.gain is not None:
            geo.append(s.gain.format())
    rows.append(geo)
    return header, rows


SAMPLED_IDENTICAL = "n/a (sampled)"  # sampled outputs differ from AR's by design: nothing to claim


def _detail_rows(s: SystemSummary, sampled: bool = False) -> tuple[list[str], list[list[str]]]:
    header = ["set", "tok/s", "AR tok/s", "tokens", "AR tokens", "accepted length", "identical to AR"]

    def same(x) -> str:
        return SAMPLED_IDENTICAL if sampled else f"{x.identical}/{x.prompts}"

    rows = [[x.set_name, _fmt(x.tokens_per_second), _fmt(x.ar_tokens_per_second), str(x.tokens), str(x.ar_tokens),
             _fmt(x.mean_accepted_length, 2), same(x)] for x in s.sets]
    rows.append(["all", "", "", str(sum(x.tokens for x in s.sets)), str(sum(x.ar_tokens for x in s.sets)),
                 _fmt(s.mean_accepted_length, 2), same(s)])
    return header, rows


def divergences(result: BenchResult, name: str) -> list[tuple[str, str, int]]:
    """(set, source id, first divergent token index) of every prompt whose tokens differ from AR's;
    none under sampling (the outputs differ by design)."""
    if not result.config.sampling.greedy:
        return []
    out = []
    for m in result.measurements:
        for info, o in zip(m.prompts, m.system(name).outputs):
            if not o.identical:
                out.append((m.set_name, info.source_id, o.first_divergence))
    return out


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def fmt(row: list[str]) -> str:  # first column left-aligned, numbers right-aligned
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def _sampling_words(sampling) -> str:
    if sampling.greedy:
        return "greedy"
    return f"{sampling.describe()} (one seed per prompt, the same for AR and every system)"


def describe(result: BenchResult) -> list[str]:
    env_ = result.environment
    c = result.config
    commit = (env_.get("git_commit") or "unknown")[:12] + (" (dirty)" if env_.get("git_dirty") else "")
    where = env_.get("gpu") or f"CPU ({env_.get('cpu') or 'unknown'}, {env_.get('torch_threads')} threads)"
    level = f"{round(100 * c.level)}%"
    prompts = "every prompt" if c.n_prompts == 0 else f"{c.n_prompts} prompts"
    units = "batches" if c.batch > 1 else "prompts"
    length = (f"exactly {c.max_new_tokens} new tokens (EOS ignored)" if c.ignore_eos
              else f"up to {c.max_new_tokens} new tokens (stopping at EOS)")
    return [
        f"deployment `{result.deployment.name}` on {where}, {env_.get('dtype')}; commit {commit}; "
        f"torch {env_['versions']['torch']}; {result.created}",
        f"{prompts} per set (seed {c.seed}), batch {c.batch}, {length}, {_sampling_words(c.sampling)}; "
        f"prompt format: {'chat template' if result.chat_template else 'plain (see specpilot/bench/prompts.py)'}",
        f"speedup per set = AR time per generated token / system time per generated token, from the totals over "
        f"the set's {units} (prefill + decode, AR and systems interleaved in one process), i.e. the ratio of "
        f"tokens per second; across sets the geometric mean of those ratios; [{level} {c.interval.value} bootstrap "
        f"interval, {c.resamples} resamples over {units}, stratified by set; n/a for a set of fewer than "
        f"{MIN_UNITS} {units}]",
    ]


LENGTH_NOTE = 0.01  # compared outputs whose token totals differ by more than this get a note


def length_notes(result: BenchResult) -> list[str]:
    """One line per comparison (each system against AR, and against its baseline) whose outputs'
    token totals differ by more than LENGTH_NOTE, in a run that stops at EOS: a speed per token
    over outputs of different lengths compares different work (a longer output decodes over
    longer contexts), which fixed-length runs (`--ignore-eos`) avoid."""
    if result.config.ignore_eos:
        return []
    totals = {s.name: s.tokens for s in result.systems}
    out = []
    for s in result.systems:
        pairs = [("AR", s.ar_tokens)] + ([(f"`{s.baseline}`", totals[s.baseline])] if s.baseline in totals else [])
        for other, tokens in pairs:
            if tokens and abs(s.tokens / tokens - 1) > LENGTH_NOTE:
                out.append(f"`{s.name}` generated {s.tokens} tokens, {other} {tokens} ({s.tokens / tokens - 1:+.1%}): "
                           "their speeds per token come from outputs of different lengths, i.e. different work; "
                           "`--ignore-eos` decodes the same number of tokens for every system")
    return out


def headline_markdown(result: BenchResult) -> str:
    """The run's description, its speedup table (sets x systems) and `length_notes`, as Markdown."""
    lines = [f"{line}  " for line in describe(result)]
    notes = [f"- {n}" for n in length_notes(result)]
    return "\n".join(lines + ["", _markdown_table(*_headline_rows(result))] + ([""] + notes if notes else []))


def render_markdown(result: BenchResult) -> str:
    parts = [f"# Speed benchmark: {result.deployment.name}", "", headline_markdown(result), ""]
    for s in result.systems:
        diff = s.system.diff(result.deployment.stock)
        knobs = ", ".join(f"{k} = {v[1]}" for k, v in diff.items()) or "stock knobs"
        parts += [f"## {s.name}", "", f"knobs vs stock: {knobs}; fingerprint {s.system.fingerprint()}", ""]
        parts += [_markdown_table(*_detail_rows(s, not result.config.sampling.greedy)), ""]
        div = divergences(result, s.name)
        if div:
            shown = ", ".join(f"{st} {sid} @ {i}" for st, sid, i in div[:20])
            more = f" and {len(div) - 20} more" if len(div) > 20 else ""
            parts += [f"Tokens differ from AR on {len(div)} prompt(s) (first divergent token): {shown}{more}.", ""]
    parts += ["Written by `specpilot bench`; every number comes from results.json in this directory.", ""]
    return "\n".join(parts)


def write_markdown(result: BenchResult, out_dir: Path) -> Path:
    path = out_dir / RESULTS_MD
    write_text_atomic(path, render_markdown(result))
    return path


def render_terminal(result: BenchResult) -> str:
    lines = [*describe(result), "", _text_table(*_headline_rows(result))]
    lines += [f"note: {n}" for n in length_notes(result)]
    for s in result.systems:
        lines += ["", f"{s.name}:", _text_table(*_detail_rows(s, not result.config.sampling.greedy))]
        div = divergences(result, s.name)
        if div:
            lines.append(f"  tokens differ from AR on {len(div)} prompt(s): "
                         + ", ".join(f"{st} {sid} @ {i}" for st, sid, i in div[:8]) + (" ..." if len(div) > 8 else ""))
    return "\n".join(lines)
