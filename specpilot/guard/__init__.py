"""Token forcing: the statistical losslessness guard every candidate passes before it is timed.

    force(target, records, chunk=512) -> ForcingResult          teacher-force outputs on the stock path
    compare(candidate, stock, config) -> Verdict                the rate rule and the large-margin rule
    gate.gate(session_or_target, candidate, stock, config) -> Verdict   force what is needed + compare

`gate` is deliberately not re-exported here: a function of that name would shadow the module.

Files: `records.py` (the JSONL outputs format), `config.py` (GuardConfig, near-tie thresholds),
`forcing.py`, `statistics.py` (sequence-level bootstrap), `verdict.py` (the decision), `gate.py`,
`divergence.py` (token-for-token comparison of two systems), `simulation.py` (size and power of
the rate rule), `sampling.py` (the sampling guard: randomized PIT of sampled outputs, uniformity
vs stock's), `sampled_forcing.py` (sampled outputs forced through the stock target into PIT
values; `specpilot guard --temperature T`; not yet wired into `gate`). The command is `specpilot.cli.guard`; fault
injection lives in `specpilot.engine.faults`.
"""

import importlib

# public name -> the module that defines it, imported on first use (PEP 562): importing one light
# module of this package (`records`, `divergence`) must not load torch and the model code
_EXPORTS = {
    "Caution": "verdict", "DivergenceReport": "divergence", "ForcedSequence": "forcing",
    "ForcingResult": "forcing", "ForcingSummary": "verdict", "GuardConfig": "config", "OutputRecord": "records",
    "Pairing": "config", "RateDifference": "statistics", "RateTest": "config", "Rule": "verdict",
    "SequenceCounts": "statistics", "Verdict": "verdict", "compare": "verdict", "compare_outputs": "divergence",
    "default_near_tie_nats": "config", "force": "forcing", "rate_difference": "statistics",
    "read_records": "records", "records_from_outputs": "records", "write_records": "records",
    "SamplingGuardConfig": "sampling", "SamplingVerdict": "sampling", "compare_sampled": "sampling",
    "pit_values": "sampling", "sampled_pit": "sampled_forcing", "sampling_gate": "sampled_forcing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
