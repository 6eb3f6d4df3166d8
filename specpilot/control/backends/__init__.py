"""Evaluation backends: where the paired workers of one comparison run (see `base.py`)."""
