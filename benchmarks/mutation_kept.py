"""The survivors of ``make mutation`` (benchmarks/mutation.py) that are kept, each with the reason it is
equivalent to the original or harmless. Split from mutation.py, which reads :data:`KEPT`."""

from __future__ import annotations

_CPU = ("device only: the mutation and the original agree on CPU, where these tests run "
        "(tensors are created on the input's device; tests/test_gpu.py runs the math on CUDA)")

_F64 = ("np.asarray(rewards) without float64: the rewards are Python floats (float64 already), and "
        "main_advantages and group_stats cast to float64 themselves")

#: Survivors we keep, by mutant name, with the reason they are equivalent or harmless.
KEPT: dict[str, str] = {
    # advantages
    "mgrpo_algo.core.advantages.x__as_mask__mutmut_7": (
        "a tensor mask goes through np.asarray instead of .detach(): the same values on CPU "
        "(a CUDA mask would fail loudly, not silently)"),
    "mgrpo_algo.core.advantages.x__as_mask__mutmut_17": _CPU,
    "mgrpo_algo.core.advantages.x__group_moments__mutmut_9": (
        "the mask stays bool instead of float64: r * mask and mask.sum() give the same numbers "
        "(bool promotes to r's dtype, the count is an exact integer)"),
    # losses
    "mgrpo_algo.core.losses.x__prepare__mutmut_27": (
        "dtype=None gives float32 ones: the weight 1.0 is exact in any dtype and promotes to the values' dtype"),
    "mgrpo_algo.core.losses.x__prepare__mutmut_30": (
        "no dtype gives float32 ones: the weight 1.0 is exact in any dtype and promotes to the values' dtype"),
    "mgrpo_algo.core.losses.x__prepare__mutmut_28": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_31": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_36": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_38": _CPU,
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_7": (
        "torch.zeros without dtype is float32, the dtype written: equivalent"),
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_10": (
        "torch.zeros without dtype is float32, the dtype written: equivalent"),
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_8": _CPU,
    "mgrpo_algo.core.losses.x_loss_normalizer__mutmut_11": _CPU,
    "mgrpo_algo.core.losses.x_aggregate__mutmut_25": _CPU,
    "mgrpo_algo.core.losses.x_aggregate__mutmut_28": _CPU,
    "mgrpo_algo.core.losses.x__prepare__mutmut_11": (
        "the mask stays bool instead of the values' dtype: values * mask, mask.sum() and (n > 0) give the "
        "same numbers, and every result is divided or multiplied into the values' dtype"),
    # roles (issue 33's split: the worker, its trajectories, its commit point)
    **{f"mgrpo_algo.training.roles.xǁRoleWorkerǁ_apply_sub__mutmut_{n}": (
        "_apply_sub is only called from _apply_pending for a key of state.pending it is iterating: the key "
        "popped is always there, so pop's default is never used") for n in (4,)},
    "mgrpo_algo.training.roles.xǁRoleWorkerǁ_score_sub__mutmut_20": (
        "states '' instead of None without step credit: score_sub_side reads states only when step_weight > 0 "
        "and then through `states or {}`: the same empty mapping"),
    **{f"mgrpo_algo.training.roles.xǁRoleWorkerǁ_score_sub__mutmut_{n}": (
        "the default for an agent without saved anchor states: every sub-agent in the facts acted at least once "
        "in this worker (a delegation starts with its first turn), so the key is always there") for n in (27, 29)},
    "mgrpo_algo.training.roles.xǁRoleWorkerǁ_update_shared__mutmut_17": (
        "get_main_stats with the store's default timeout: the shared worker published those statistics just "
        "before, so the call never waits"),
    "mgrpo_algo.training.trajectories.x_drop_json_after__mutmut_2": (
        "globbing a folder that does not exist yields nothing: the exists() guard only saves the call"),
    **{f"mgrpo_algo.training.trajectories.xǁTrajectoriesǁretire__mutmut_{n}": (
        "mkdir of trajectories/ without parents: its parent is the worker's folder, which holds the buffer "
        "being moved, so it exists") for n in (7, 9, 11)},
    **{f"mgrpo_algo.training.worker_state.x__iteration_of__mutmut_{n}": (
        "checkpoint folders are named iter-<int> (no second '-'): split, rsplit and split with 2 give the same "
        "number") for n in (5, 6, 8)},
    "mgrpo_algo.training.worker_state.xǁWorkerStateǁadopt__mutmut_17": (
        "-2 instead of -1 for a checkpoint without last_applied: last_applied is never below -1, so neither is "
        "greater"),
    "mgrpo_algo.training.worker_state.xǁWorkerStateǁcheckpoints__mutmut_7": (
        "globbing a folder that does not exist yields nothing: the exists() guard only saves the call"),
    **{f"mgrpo_algo.training.worker_state.xǁWorkerStateǁprune__mutmut_{n}": (
        "rmtree without ignore_errors: the folder was just listed; the flag only matters when something else "
        "deletes it at the same moment (a second process on the same run), which no test can stage "
        "deterministically") for n in (7, 9, 10)},
    # compare
    # compare's orchestration (issue 22)
    **{f"mgrpo_algo.experiments.compare.x__full_evaluation__mutmut_{n}": (
        "eval_figures given None for the records, or no scores: with scores given the records are not read, "
        "and without them it recomputes the same per_question(records) that _full_evaluation passes")
       for n in (22, 23, 26)},
    "mgrpo_algo.experiments.compare.x_eval_figures__mutmut_3": (
        "always recompute the scores from the records: every caller passes per_question(records) of those same "
        "records (or nothing), so the scores are the same"),
    "mgrpo_algo.experiments.compare.x__full_evaluation__mutmut_75": 'float("NAN") is the same NaN as float("nan")',
    "mgrpo_algo.experiments.compare.x_aggregate__mutmut_19": 'float("NAN") is the same NaN as float("nan")',
    # the env's reward path (issue 22); since issue 43 the turn loop is the episode core's, the AEC env its adapter
    **{f"mgrpo_env.aec.xǁMGRPOEnvǁ_paid__mutmut_{n}": (
        "infos.get(agent, None) instead of (agent, {}): every agent's infos are set when it joins (the episode's "
        "on_observation -> _observed), so the default is never used") for n in (13, 15)},
    # the episode core (issue 43: the one turn loop)
    **{f"mgrpo_env.episode_core.xǁEpisodeǁ_delegate__mutmut_{n}": (
        "the delegate task's fallback when the call has none: the protocol's schema requires 'task' (a "
        "non-empty string), so a parsed delegate call always has it") for n in (50, 52, 55)},
    "mgrpo_env.episode_core.xǁEpisodeǁ_delegate__mutmut_81": (
        "the called agent started with tools None instead of {}: they are replaced by the world's tools two lines "
        "later, before the agent can act"),
    **{f"mgrpo_env.episode_core.xǁEpisodeǁ_finish__mutmut_{n}": (
        "a role without extra terms gets None instead of () from RewardConfig.terms.get: terms_pay pays nothing "
        "for either (`if not terms`), so the pay is the same") for n in (48, 50, 91, 93)},
    "mgrpo_env.episode_core.xǁEpisodeǁ_expert__mutmut_17": (
        "sub.task or 'XXXX': a sub-agent's task is the delegate call's task, which the protocol's schema "
        "requires with minLength 1, so it is never empty and the fallback is never used"),
    "mgrpo_env.episode_core.xǁEpisodeǁact__mutmut_4": (
        "the refusal's message with XX around it: the same words, which the test matches; no test pins the "
        "exact string"),
    **{f"mgrpo_env.episode_core.xǁEpisodeǁreset__mutmut_{n}": (
        "the action spaces' seeds drawn below 3**31 or 2**32 instead of 2**31: every bound that large gives each "
        "episode seed its own reproducible space seed (tested); the values themselves are arbitrary")
       for n in (17, 18)},
    "mgrpo_env.episode_core.xǁEpisodeǁreset__mutmut_30": (
        "finished = None instead of False at reset: it is only read as a truth value (act, the drivers' "
        "`if core.finished`), where None is False"),
    "mgrpo_env.episode_core.xǁEpisodeǁreset__mutmut_39": (
        "episode ids of 13 hex digits instead of 12: the length is arbitrary; ids stay distinct per episode "
        "(tested)"),
    # kv_cache (issue 22)
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_18": (
        "entries.pop(None, None) for an unkeyed row: store never keeps a row without a key, so there is no "
        "entry under None and the pop returns None, as the branch does"),
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_{n}": (
        "zip(strict=...) over the prompts and their cached lengths: cached is built one per prompt (from a "
        "zip(keys, prompts, strict=True) that raises on a mismatch, tested), the lengths are always equal")
       for n in (44, 47, 48, 67, 70, 71)},
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_{n}": (
        "torch.full without dtype=torch.long: the fill value pad_id is a Python int, so torch infers int64 "
        "(long) anyway (the layout's dtype is tested)") for n in (53, 56)},
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁprepare__mutmut_{n}": (
        "torch.tensor of a list of token ids without dtype=torch.long: a non-empty list of Python ints is "
        "int64 already; the list is never empty (an entry is used only when it leaves at least one id to "
        "feed, and the cached part is only copied when c > 0)") for n in (74, 76, 88, 90)},
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_4": (
        "budget_bytes == 1 instead of == 0 for the early return: with a budget of 0 every entry (at least "
        "one float per layer) is over it and skipped, so nothing is kept either way; a budget of exactly 1 "
        "byte likewise keeps nothing (the budget is whole megabytes in practice)"),
    **{f"mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_{n}": (
        "the length (or device) read from layer 1's keys or from layer 0's values instead of layer 0's keys: "
        "only models whose layers are all plain full-attention DynamicLayers are served (supports_reuse), "
        "and their keys and values all have the same length and device") for n in (7, 8, 38, 39)},
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_25": (
        "device only: index.to(None) keeps the column index on the CPU, identical on CPU where these tests "
        "run (on CUDA PyTorch moves a CPU index tensor to the indexed tensor's device; not run here)"),
    "mgrpo_algo.policies.kv_cache.x_supports_reuse__mutmut_9": (
        "getattr(cache, 'layers') without a default: the DynamicCache of the installed transformers always "
        "has .layers (only an older one without it would raise instead of answering False)"),
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁ__init____mutmut_8": (
        "'' instead of None as the weights version before the first batch: any value that is not a tuple of "
        "versions differs from the first model's, and there are no entries to invalidate then"),
    "mgrpo_algo.policies.kv_cache.xǁKVCacheManagerǁstore__mutmut_65": (
        "popitem(last=None): OrderedDict reads a falsy last as False, the least recently used end"),
    # scoring (renumbered after issue 33's payloads and step credit)
    "mgrpo_algo.core.scoring.x_score_main__mutmut_14": _F64,
    "mgrpo_algo.core.scoring.x_score_main__mutmut_16": _F64,
    "mgrpo_algo.core.scoring.x_score_sub__mutmut_54": (
        "zip(strict=None) over the group and its plan: plan_with_stats returns one row per rollout, the "
        "lengths are always equal"),
    "mgrpo_algo.core.scoring.x_score_sub__mutmut_57": (
        "zip without strict over the group and its plan: plan_with_stats returns one row per rollout"),
    "mgrpo_algo.core.scoring.x_score_sub__mutmut_58": (
        "zip(strict=False) over the group and its plan: plan_with_stats returns one row per rollout"),
    **{f"mgrpo_algo.core.scoring.x__step_credit__mutmut_{n}": (
        "zip(strict=...) over the turns' owners and their step advantages: step_advantages returns one value "
        "per anchor and the owners are appended one per anchor, so the lengths are always equal")
       for n in (10, 13, 18)},
    **{f"mgrpo_algo.core.scoring.x_score_main_side__mutmut_{n}": (
        "zip(strict=...) over score_main's keys and advantages: it returns one advantage per key, so the "
        "lengths are always equal") for n in (89, 92, 93)},
    **{f"mgrpo_algo.core.scoring.x_score_main_side__mutmut_{n}": (
        "the single agent's trajectories judged as delegations too: it never calls delegate, so every turn's "
        "judgement is None (no credit, no delegations_needed metric), as when they are not judged")
       for n in (14, 15)},
    "mgrpo_algo.core.scoring.x_credited_turns__mutmut_44": (
        "w_d / (2j - 1) instead of w_d x (2j - 1): a judgement j is 1.0 or 0.0 (delegation_judgements), so "
        "2j - 1 is +1 or -1 and dividing by it is multiplying by it"),
    **{f"mgrpo_algo.core.scoring.x_score_sub_side__mutmut_{n}": (
        "zip(strict=...) over score_sub's placed slots and advantages: it returns one advantage per slot, so "
        "the lengths are always equal") for n in (98, 101, 102)},
    **{f"mgrpo_algo.core.scoring.x__subtask_groups__mutmut_{n}": (
        "zip(strict=...) over the slots' subtask keys, their grouped and their pooled A_S: all three are built "
        "one per placed slot, so the lengths are always equal") for n in (16, 20, 21)},
    "mgrpo_algo.core.scoring.x__digest__mutmut_3": (
        "the digest of a missing subtask from 'XXXX' instead of '': the digest is only compared for equality "
        "(outcome groups), and every missing subtask still gets the same one"),
    "mgrpo_algo.core.scoring.x__digest__mutmut_4": (
        "17 hex digits of the subtask's digest instead of 16: only compared for equality, any prefix works"),
    **{f"mgrpo_algo.core.scoring.x_turn_states__mutmut_{n}": (
        "the label of a misaligned trajectory's states: any constant works, the keys are unique by the "
        "trajectory's id and the turn (tested: they share nothing) and never equal an anchor_state digest")
       for n in (20, 21)},
    # align
    "mgrpo_env.align.x__subset__mutmut_5": (
        "rng.choice(replace=None): numpy reads a falsy replace as without replacement, as written"),
    "mgrpo_env.align.x__duplicate__mutmut_1": (
        "d_k > d instead of >=: at d_k == d the other branch returns range(d) plus rng.integers(size=0), "
        "the same slots, and drawing 0 integers leaves the generator's state unchanged (tested)"),
    "mgrpo_env.align.x__duplicate__mutmut_20": (
        "rng.integers(d_k, size=n) is numpy's one-argument form, [0, d_k): identical to integers(0, d_k)"),
    "mgrpo_env.align.x__duplicate_balanced__mutmut_1": (
        "d_k > d instead of >=: at d_k == d the other branch gives range(d) * 1 plus a subset of size 0, "
        "the same slots, and choosing 0 leaves the generator's state unchanged (tested)"),
    "mgrpo_env.align.x_choose_d__mutmut_37": (
        "frac gets one extra entry (n+1)/n past the end: frac[n-1] == 1 >= quantile already, so argmax "
        "never reaches it"),
}

_RC = "mgrpo_tools.render_cache.xǁRenderCacheǁ"
_FS = "mgrpo_algo.policies.fast_step."
_FS_CPU = ("device only: FastStep refuses any model that is not on the CPU (FastStep.supports), and its "
           "additive mask is only made for it, so every tensor here is on the CPU either way")
_FS_GATE_UP = ("the gate/up bias when only some of gate and up have one: Qwen2 has none and Llama's mlp_bias gives "
               "both or neither, so the mutation either gives the same bias or adds zeros (x @ W + 0 == x @ W)")

#: issue 34: the speed code's survivors.
KEPT.update({
    # render_cache
    _RC + "__init____mutmut_1": (
        "the default bound 4096 -> 4097 entries: any bound far above a world's ~200 rendered pages serves the same"),
    **{_RC + f"_append__mutmut_{n}": (
        "json.dumps(ensure_ascii=None): json reads a falsy ensure_ascii as False, as written") for n in (6,)},
    _RC + "_append__mutmut_16": '"UTF-8" and "utf-8" name the same codec',
    **{_RC + f"_append__mutmut_{n}": (
        "f.read(None) or f.read(2) after seeking to one byte before the end: either reads that one last byte")
       for n in (39, 40)},
    _RC + "_keep__mutmut_25": "popitem(last=None): OrderedDict reads a falsy last as False, the least recently used end",
    **{_RC + f"_load__mutmut_{n}": (
        "path.open() without encoding='utf-8': the locale's encoding, UTF-8 where these tests run (and under "
        "Python's UTF-8 mode); on a non-UTF-8 locale a non-ASCII page would be misread") for n in (1, 3)},
    _RC + "_load__mutmut_6": '"UTF-8" and "utf-8" name the same codec',
    **{_RC + f"_load__mutmut_{n}": (
        "the elapsed_s of a loaded render: never served, a hit replaces it with the caller's elapsed()")
       for n in (16, 21)},
    _RC + "_load__mutmut_28": "_keep(persist=None): a falsy persist does not write, as False",
    **{_RC + f"_load__mutmut_{n}": (
        "the from_cache flag of a loaded render: never served, a hit replaces it with from_cache=True")
       for n in (33, 35, 36)},
    **{_RC + f"get_or_render__mutmut_{n}": (
        "_inflight.pop(key) without a default: only the owner of a render removes its key, and it put it there "
        "under the same lock, so the key is always present") for n in (43, 47)},
    # fast_step
    **{_FS + f"x__rotation__mutmut_{n}": (
        "index - half instead of index + half for index in [0, half): negative indices wrap to the same "
        "rows [half, head_dim)") for n in (12, 16)},
    _FS + "x__after_attention__mutmut_38": "y.chunk(2, dim=+1) of the 2-D [rows, 2 x intermediate] gate/up output: dim 1 is dim -1",
    _FS + "x__rms_norm__mutmut_11": (
        "mean over dim +1 instead of -1: FastStep's hidden states are always [batch, hidden], where 1 is the last dim"),
    **{_FS + f"x_additive_mask__mutmut_{n}": _FS_CPU for n in (5, 8)},
    _FS + "x_additive_mask__mutmut_25": 'float("-INF") is float("-inf")',
    _FS + "xǁFastStepǁ__init____mutmut_15": (
        "getattr(config, 'num_key_value_heads') without a default: Qwen2 and Llama configs (the only ones "
        "FastStep supports) always have the attribute"),
    _FS + "xǁFastStepǁ__init____mutmut_21": (
        "scaling None: SDPA's default scale is head_dim ** -0.5, which is what Qwen2 and Llama attention use"),
    _FS + "xǁFastStepǁ__init____mutmut_22": (
        "_layers None before the first refresh: every call refreshes first (the version starts unset), which "
        "replaces it"),
    _FS + "xǁFastStepǁ__init____mutmut_23": (
        "'' instead of None as the weights version before the first refresh: any value that is not a tuple of "
        "versions differs from the model's, so the first refresh builds the weights either way"),
    _FS + "xǁFastStepǁ_grow_rope__mutmut_13": (
        "two rows of the embedding as the rotary module's probe instead of one: it reads only the probe's dtype "
        "and device"),
    **{_FS + f"xǁFastStepǁ_grow_rope__mutmut_{n}": _FS_CPU for n in (20, 22)},
    _FS + "xǁFastStepǁrefresh__mutmut_1": (
        "refresh()'s default max_position 1 instead of 0: the table is then built early (256 positions), the "
        "same values as when a later call grows it"),
    **{_FS + f"xǁ_Layerǁ__init____mutmut_{n}": _FS_GATE_UP for n in (52, 56, 57, 58)},
})

_PX = "mgrpo_algo.learning.prefix."
_DC = "mgrpo_algo.policies.decode."

KEPT.update({
    # fast_step
    # prefix
    **{_PX + f"x_forward_with_prefix__mutmut_{n}": (
        "no position ids for the rows' remaining tokens: the model's default after a cache of `length` tokens "
        "is arange(length, L), exactly these (the prefix has no padding: rows are right-padded)")
       for n in (3, 19, 23)},
    **{_PX + f"x_forward_with_prefix__mutmut_{n}": _CPU for n in (10, 13)},
    **{_PX + f"x_forward_with_prefix__mutmut_{n}": (
        "use_cache None / False with a cache passed: in the installed transformers use_cache only decides "
        "whether the model makes a cache when none is given; the passed prefix cache is read either way "
        "(and is made afresh per micro-batch, so what the forward appends to it is never read)")
       for n in (20, 24, 27)},
    **{_PX + f"xǁPrefixPassǁbackward__mutmut_{n}": (
        "zip(strict=...) over the outputs and their leaves: the leaves are made one per output in run_prefixes")
       for n in (4, 7, 8)},
    _PX + "xǁPrefixPassǁcache__mutmut_2": (
        "DynamicCache(config=None): for full-attention models the config makes the same plain DynamicLayers; "
        "with a sliding-window layer (tests/test_prefix_chat.py's sliding-window case) the shared path gives the "
        "plain log-probs with and without it (measured: within 5e-7 at windows 4 and 16): the model's mask "
        "cuts at the window whichever layer holds the prefix"),
    # decode
    _DC + "x_inverse_cdf__mutmut_3": "cumsum over dim +1 of a [B, V] tensor: the last dim, as -1",
    _DC + "x_inverse_cdf__mutmut_12": _CPU,
})

KEPT.update({
    _PX + "x_run_prefixes__mutmut_24": (
        "DynamicCache(config=None): for full-attention models the config makes the same plain DynamicLayers; "
        "with a sliding-window layer (tests/test_prefix_chat.py's sliding-window case) the shared path gives the "
        "plain log-probs with and without it (measured: within 5e-7 at windows 4 and 16): the model's mask "
        "cuts at the window whichever layer holds the prefix"),
    **{_PX + f"x_run_prefixes__mutmut_{n}": (
        "use_cache None / False with a cache passed: in the installed transformers use_cache only decides "
        "whether the model makes a cache when none is given (and returns it); the passed cache is filled either "
        "way, and only it is read") for n in (26, 29, 32)},
    _DC + "x_inverse_cdf__mutmut_15": _CPU,
})

KEPT.update({
    _PX + "x_plan_prefix__mutmut_43": (
        "by_prompt > by_common instead of >=: on a tie both plans save the same tokens and give the same "
        "logits (each row reads its own leading tokens either way); only which prefix runs differs"),
    **{_PX + f"x_plan_prefix__mutmut_{n}": _CPU for n in (47, 50)},
})

_LG = "mgrpo_algo.learning.logits.x_target_logprobs__mutmut_"
KEPT.update({
    _LG + "34": (
        "set_grad_enabled(grad enabled or entropy_grad) on the plain path: with gradients off the log-probs were "
        "computed without a graph, so enabling gradients for the entropy records nothing either way"),
    _LG + "37": (
        "the log-probs not detached when entropy_grad is False: the entropy is then computed under "
        "set_grad_enabled(False), which records no graph, so it has no gradient either way"),
})

_BT = "mgrpo_algo.learning.batching.x_advantages__mutmut_"
KEPT.update({
    **{_BT + f"{n}": (
        "torch.as_tensor of the values without dtype: the result is written into the float32 zeros, which casts")
       for n in (24, 26)},
    **{_BT + f"{n}": _CPU for n in (5, 8, 27)},
})

_TP = "mgrpo_algo.policies.decode.x__top_p__mutmut_"
KEPT.update({
    _TP + "6": "torch.sort without dim: its default is -1, as written",
    _TP + "7": "torch.sort without descending: its default is False, as written",
    **{_TP + f"{n}": "dim +1 instead of -1 on [B, V] scores: the last dim either way" for n in (8, 14, 16)},
    _TP + "40": 'float("-INF") is float("-inf")',
    **{_DC + f"x_process_scores__mutmut_{n}": "log_softmax over dim +1 of [B, V] logits: the last dim, as -1"
       for n in (9, 34)},
})

_GL = "mgrpo_algo.policies.decode.x__growing_layer_class__mutmut_"
KEPT.update({
    _GL + "6": "the value buffer's placeholder '' before the first update: _grow sets both buffers before either is read",
    _GL + "20": (
        "2 * 1 instead of 2 * 0 as the doubling term before the first buffer: the first buffer is at least the "
        "room reserved or what is fed, both at least 2 in practice (a 1-position buffer grows at the next token)"),
    _GL + "28": (
        "copy the filled part when there is a buffer OR something filled: something filled implies a buffer, "
        "and copying zero filled columns changes nothing"),
    _GL + "40": "key_states.shape[+2] of [batch, heads, length, dim] states: the same axis as -2",
    _GL + "50": "the assert's 'or': both buffers are set together in _grow, so both conditions hold together",
})

_RS = "mgrpo_algo.policies.decode.x_reserve__mutmut_"
KEPT.update({
    _RS + "3": (
        "break instead of continue for a layer that is already this call's GrowingLayer: unreachable, since "
        "_growing_layer_class makes a new class at every call, so no layer is an instance of it yet (a layer "
        "from an earlier call is wrapped again with room, as intended)"),
    _RS + "7": "an uninitialised layer's get_seq_length() is 0: 0 + extra is extra",
    **{_RS + f"{n}": (
        "an initialised layer holding 0 positions is fed its empty keys and values: the new layer then holds 0 "
        "positions too, as without the call") for n in (9, 10)},
})

# issue 46: the mistake statistics (mgrpo_env/mistakes.py)
_MI = "mgrpo_env.mistakes.x_"
_ATTRS = ("a trajectory's turns are read as dicts (_turns converts Turn objects with vars()), so a tool call is always "
          "a mapping here and the attribute branch is unreachable")
KEPT.update({
    **{_MI + f"_as_dict__mutmut_{n}": (
        "an EpisodeRecord read through vars() instead of to_dict(): the same task dict and the same trajectories "
        "(as objects, which _turns and the attribute branches read as their dicts): the same counts")
       for n in (3, 5, 9, 10)},
    **{_MI + f"_tool__mutmut_{n}": _ATTRS for n in (7, 11, 12, 13, 14, 15, 16, 17)},
    _MI + "_single_hops__mutmut_2": (
        "the name before any search as '' instead of None: a search turn always carries its queries (a call without "
        "them is an error turn, with no tool call), so no hop's name is '' and the first search always starts a hop"),
    _MI + "_single_hops__mutmut_21": (
        "the default query when a search has none: unreachable, a search turn always carries its queries"),
    _MI + "_single_hops__mutmut_26": (
        "strip('XX\"XX') also strips X's at a name's ends: a name is only compared with the previous search's, "
        "stripped the same way, so only two names of one chat differing by end X's could tell, which do not occur"),
    _MI + "_single_hops__mutmut_28": "None instead of False for a hop not visited: `not visited` is True for both",
    _MI + "_turns__mutmut_6": "a trajectory dict without 'turns': every trajectory the envs write has them",
    _MI + "_turns__mutmut_8": "a trajectory dict without 'turns': every trajectory the envs write has them",
    _MI + "rates_of_counts__mutmut_14": "(1, 0) instead of (0, 0) for a rate never counted: a 0 denominator gives None either way",
    **{_MI + f"rates_of_counts__mutmut_{n}": "[1, 0] instead of [0, 0] for a missing count: only its denominator, 0, is read"
       for n in (28, 41, 54)},
    _MI + "record_counts__mutmut_13": (
        "`if main or True`: every record has a main trajectory (the env starts with it), so the guard never decides"),
    _MI + "record_counts__mutmut_23": "getattr without a default: every trajectory object has a role",
    _MI + "record_counts__mutmut_80": (
        "early = 1 instead of early += 1: an episode ends at its answer, so it counts at most one early answer"),
})

# issue 46: the report (mgrpo_algo/experiments/report.py)
_RP = "mgrpo_algo.experiments.report.x_"
_KEY = ("the default of a key summary.json always holds (run_compare writes 'eval' with its 'samples', 'intervals', "
        "every mode's 'per_seed' rows and the verdict's 'checks'): the default is never read")
KEPT.update({
    **{_RP + name: _KEY for name in (
        "_delegation_check__mutmut_12", "_delegation_check__mutmut_14",
        *(f"{fn}__mutmut_{n}" for fn, ns in (
            ("_intervals_section", (3, 5, 18, 20, 22, 24, 29)), ("_reference_checks", (19, 21, 23, 25, 30)),
            ("_reference_section", (9, 11, 13, 15, 20)), ("format_table", (4, 6, 8, 10, 15, 18, 20)),
            ("verdict", (4, 6, 15, 17, 19, 21, 26)), ("markdown", (114, 116))) for n in ns))},
    **{_RP + f"markdown__mutmut_{n}": (
        "the default of eval's 'greedy': run_compare writes config_to_dict(config.eval), which always holds it")
       for n in (29, 30, 32, 33, 34, 35)},
    **{_RP + f"_pct__mutmut_{n}": (
        "'F' instead of 'f': they differ only for inf and NaN; NaN returns '-' before formatting and no figure is "
        "infinite (shares and differences of shares)") for n in (12, 14)},
    **{_RP + f"_pm__mutmut_{n}": "sign None or left out: _pm is only called without a sign, so sign is False either way"
       for n in (11, 13)},
    **{_RP + f"history_means__mutmut_{n}": "float('NAN') is float('nan')" for n in (6, 9)},
    _RP + "markdown__mutmut_128": "backend_failure_line(None) with no failures: an empty mapping and None both read as none",
})

# issue 46: the imperfect teacher (mgrpo_env/teacher.py). Its decisions are checked on the env's runs
# (tests/test_teacher.py) and on chats written by hand in the full profile (tests/test_teacher_chats.py).
_TE = "mgrpo_env.teacher.xǁImperfectTeacherǁ"
_BODY = ("the reply after an assistant message when the chat ends with that message: a policy is asked with the chat "
         "ending in the observation it must answer (the env's messages, then the question or a tool response), so "
         "every assistant message has its reply after it and this branch is never taken")
KEPT.update({
    _TE + "__init____mutmut_1": (
        "the default seed 1 instead of 0: no caller uses the default (teacher_policies' seed is a required keyword, "
        "the warm start's teacher stage passes cfg.seed * 1000 + draw), and any fixed default draws reproducibly"),
    _TE + "_draw__mutmut_6": (
        "p < 0 instead of p <= 0 for the early return: at p == 0 the draw u < p is false for every u >= 0, so the "
        "return only saves the hash"),
    _TE + "_draw__mutmut_18": (
        "int.from_bytes without 'big': byteorder defaults to 'big' from Python 3.11, the interpreter of the venv "
        "and of make test (on 3.10 the first draw would raise TypeError, loudly)"),
    _TE + "_draw__mutmut_26": (
        "u <= p instead of u < p: they differ only where the hash's 64-bit fraction equals p exactly; at p = 1 u is "
        "below 1 always, and a rate in (0, 1) is hit exactly with chance 2^-53 per draw or less"),
    _TE + "_single__mutmut_7": (
        "the teacher's own walk also at every rate 0 (>= 0 instead of > 0): at rate 0 no draw is true and the walk "
        "makes the oracle's decisions on every chat the teacher writes (pages visited in order, so its next page "
        "len(pages) + 1 is the oracle's page + 1); tests/test_teacher.py::test_every_rate_zero_is_the_oracle "
        "compares the two, and test_teacher_chats.py checks the walk against the oracle where nothing is drawn"),
    _TE + "_single__mutmut_31": (
        "'and' instead of 'or' in the loop's guard: the non-assistant messages then parsed (system prompt, question, "
        "tool responses) hold no well-formed tool call, so parse_action names no tool and nothing happens; an "
        "assistant message after the last hop would be the final answer, which ends the episode"),
    _TE + "_single__mutmut_37": (
        "h > len(order) instead of >=: an assistant message once every hop is read would be the final answer, which "
        "ends the episode, so no such message is ever replayed"),
    **{_TE + f"_single__mutmut_{n}": _BODY for n in (52, 58, 60, 61)},
    _TE + "_single__mutmut_141": (
        "page 2 instead of 1 where a visit result has no 'Page i of n' line: `not found` then decides the read "
        "first, and page is read nowhere else (the next part is len(pages) + 1)"),
    **{_TE + f"_single__mutmut_{n}": (
        "the last hop read found as max over (chain, position) keys instead of by order.index: order lists the hops "
        "chain by chain, position by position, i.e. in the keys' own tuple order, so both maxima are the same hop")
       for n in (201, 203)},
    **{_TE + f"_sub__mutmut_{n}": (
        "split without maxsplit, or with 2: only the part before the first '\\nContext: ' is kept, the same text")
       for n in (24, 34)},
    _TE + "_sub__mutmut_25": (
        "rsplit instead of split: they differ only where the delegation's context itself holds a line starting "
        "'Context: ' (the env writes the header once); the teacher's main (the oracle's) passes no context at all, "
        "and test_teacher_chats.py checks a sub-agent's mistakes with a context"),
})

# issue 46: the served engine's watchdog (mgrpo_algo/policies/vllm_server.py), checked on tests/fake_engine.py
_VS = "mgrpo_algo.policies.vllm_server.x"
KEPT.update({
    **{_VS + f"__signal_name__mutmut_{n}": (
        "code > 0 or code >= 1 instead of code >= 0 for the early return: an exit code 0 then goes on to "
        "signal.Signals(0), which raises ValueError, suppressed: '' either way") for n in (3, 4)},
    _VS + "ǁVLLMServerǁensure_up__mutmut_28": (
        "the problem cut at 121 characters instead of 120 in the printed line: a length chosen for one readable "
        "line, not a behaviour (the whole problem is kept in restarts; the tests check a short problem's line whole)"),
    _VS + "ǁVLLMServerǁwait_ready__mutmut_7": (
        "<= instead of < against the deadline: they differ only at the instant monotonic() equals it, one more "
        "poll at most"),
    _VS + "ǁVLLMServerǁwait_ready__mutmut_15": (
        "timing only: each /health poll of a start waits 3 s instead of 2 s, so a server that accepts and never "
        "answers is given up on up to 1 s later; test_a_wait_keeps_its_own_deadline... bounds it (< 10 s, which "
        "the 30 s health_timeout_s would break), a 1 s difference is within the machine's noise"),
    _VS + "ǁVLLMServerǁwait_ready__mutmut_22": (
        "timing only: 1.5 s instead of 0.5 s between /health polls of a start, so a start is seen up to 1 s later; "
        "the fake engine's own start time varies by as much on a shared machine, so no test can tell them apart"),
})
KEPT[_VS + "ǁVLLMServerǁhealthy__mutmut_4"] = (
    "trust_env=None instead of False: httpx 0.29 only tests it for truth (`trust_env and ...` in _client.py and _config.py), so None reads the "
    "environment's proxies no more than False does (True is killed by test_health_checks_ignore_a_proxy...)")

# issue 53 (the TRL environment, the served env and its client, the run storage): benchmarks/mutation_kept_wire.py
from mutation_kept_wire import KEPT as _WIRE  # noqa: E402 - benchmarks/ is the script's folder

KEPT.update(_WIRE)
