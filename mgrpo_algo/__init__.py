"""mgrpo_algo: policies, advantages, losses, per-role learners, trainers and the ``mgrpo`` CLI."""
