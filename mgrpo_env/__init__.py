"""mgrpo_env: the M-GRPO environment (PettingZoo AEC hierarchy, single-agent Gymnasium env).

Never imports torch. The environment, protocol parsing, rollouts, alignment and reward
composition arrive with the environment issue; today the package exists so that the
distribution's layout is fixed.
"""
