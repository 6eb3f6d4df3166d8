"""Token forcing: the statistical losslessness guard every candidate passes before it is timed.

    force(target, records, chunk=512) -> ForcingResult          teacher-force outputs on the stock path
    compare(candidate, stock, config) -> Verdict                the rate rule and the large-margin rule
    gate.gate(session_or_target, candidate, stock, config) -> Verdict   force what is needed + compare
    gate.controller_gate(request) -> GateResult                 what the controller loads by name

`gate` is deliberately not re-exported here: `specpilot.guard.gate` is the module the controller
imports ("specpilot.guard.gate:controller_gate"), and a function of the same name would shadow it.

Files: `records.py` (the JSONL outputs format), `config.py` (GuardConfig, near-tie thresholds),
`forcing.py`, `statistics.py` (sequence-level bootstrap), `verdict.py` (the decision), `gate.py`,
`divergence.py` (token-for-token comparison of two systems), `simulation.py` (size and power of
the rate rule), `cli.py` (`specpilot guard`). Fault injection lives in `specpilot.engine.faults`.
"""

from specpilot.guard.config import GuardConfig, Pairing, RateTest, default_near_tie_nats
from specpilot.guard.divergence import DivergenceReport, compare_outputs
from specpilot.guard.forcing import ForcedSequence, ForcingResult, force
from specpilot.guard.records import OutputRecord, read_records, records_from_outputs, write_records
from specpilot.guard.statistics import RateDifference, SequenceCounts, rate_difference
from specpilot.guard.verdict import Caution, ForcingSummary, Rule, Verdict, compare

__all__ = [
    "Caution", "DivergenceReport", "ForcedSequence", "ForcingResult", "ForcingSummary", "GuardConfig",
    "OutputRecord", "Pairing", "RateDifference", "RateTest", "Rule", "SequenceCounts", "Verdict",
    "compare", "compare_outputs", "default_near_tie_nats", "force", "rate_difference",
    "read_records", "records_from_outputs", "write_records",
]
