"""The controller: paired timing, noise floor, promotion rule, isolated workers, evaluation backends.

Kept import-free on purpose: worker processes import `specpilot.control.spec` after a patch
candidate's worktree is put first on sys.path, and should not pull the controller in with it.
Import from the modules: `controller.Controller`, `config.ControllerConfig`, `stats.GainEstimate`,
`rule.decide`, `evaluate.evaluate_candidate`, ...
"""
