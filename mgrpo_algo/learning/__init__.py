"""Learners: the per-role clipped policy-gradient learner, LoRA, and the supervised warm start.

Layer 2: imports ``core`` and ``policies``."""
