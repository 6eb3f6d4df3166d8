"""The controller: paired timing, noise floor, promotion rule, isolated workers, evaluation backends.

Kept import-free on purpose: worker processes import `specpilot.control.arm` after a patch
candidate's worktree is put first on sys.path, and should not pull the controller in with it.
Import from the modules: `controller.Controller`, `config.ControllerConfig`, `stats.GainEstimate`,
`rule.decide`, `defaults.runner_spec`, .... Evaluating a candidate and recording it is
`specpilot.memory.evaluate` (one layer up).
"""
