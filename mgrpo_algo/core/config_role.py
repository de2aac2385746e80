"""The settings of one role: its learner, how it samples, its served engine (``RoleConfig``).

Part of the one config tree (``mgrpo_algo.core.config.TrainConfig``: ``main``, ``sub``, ``single``);
split from it by concern. One docstring per field: default, trade-off, the paper's value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config_types import check as _check
from .config_types import check_own_names, named

__all__ = ["AUTOCAST_DTYPES", "DTYPES", "CalledSideConfig", "GenerationConfig", "LearnerConfig", "RoleConfig", "ServedConfig"]

#: Parameter dtypes a learner accepts (names of ``torch`` dtypes).
DTYPES = ("float32", "bfloat16", "float16")
#: ``LearnerConfig.autocast_dtype`` values ("none": no autocast).
AUTOCAST_DTYPES = ("none", "bfloat16", "float16")
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "npu")


@dataclass
class LearnerConfig:
    """One role's learner (``mgrpo_algo.learning.learner.RoleLearner``): optimiser, loss and batching.

    Every role (main, sub, single) has its own; M-GRPO never shares gradients between roles.
    """

    # --- optimiser (AdamW) ---------------------------------------------------------------------
    lr: float = 1e-4
    """AdamW learning rate, constant (no schedule). Default 1e-4 suits the tiny from-scratch models of
    the CPU default; pretrained 1B-30B LLMs want ~1e-6 (the GRPO recipes of verl and TRL the paper
    builds on). The paper's text does not state its value."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay. 0.0 (TRL's GRPO default; verl uses 0.01): RL updates are few and
    small, decay mostly pulls the policy back towards zero rather than regularising."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2), torch's defaults. A lower beta2 (0.99) reacts faster to gradient-scale
    changes between RL batches at the price of noisier steps."""
    adam_eps: float = 1e-8
    """AdamW epsilon (torch's default). Raise it (1e-6) for bfloat16/float16 parameters."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm to this before each step (paper / verl: 1.0). None disables
    clipping (the norm is still reported as ``grad_norm``)."""

    # --- loss (``mgrpo_algo.core.losses``) -----------------------------------------------------------------
    policy_loss: str = named("clipped", "mgrpo_algo.core.losses:POLICY_LOSSES")
    """The policy loss, by its name in ``mgrpo_algo.core.losses.POLICY_LOSSES``: "clipped" (the paper's
    clipped policy gradient with clip-higher, ``clipped_pg_loss``). A new loss is one registered
    function with an options dataclass; each option comes from ``loss_options``, else from the field
    of the same name below (``eps_low``, ...)."""
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - eps_low (paper code: 0.2)."""
    eps_high: float = 0.28
    """Upper clip range, 1 + eps_high ("clip-higher", DAPO; paper code: 0.28). Larger keeps more
    exploration on low-probability tokens with positive advantage."""
    aggregation: str = named("seq-mean-token-mean", "mgrpo_algo.core.losses:AGGREGATIONS")
    """How token losses become one number: "seq-mean-token-mean" (paper code: mean over a sample's
    sampled tokens, then over samples with weight > 0), "token-mean" (long samples weigh more) or
    "seq-mean-token-sum". See ``mgrpo_algo.core.losses.AGGREGATIONS``."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to a frozen copy of the initial model (paper: 0). > 0 keeps that copy in
    memory (and in checkpoints) and costs one extra forward per update."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (paper: 0). > 0 backpropagates through the full-vocabulary entropy,
    which costs memory of the order of the logits."""
    informative_only: bool = False
    """Drop samples whose advantage is 0 on every token (a group whose rollouts all scored the same)
    from the batch and from the loss normaliser, as DAPO's dynamic sampling drops such groups: the
    step is the mean over the samples that carry signal, so a batch where most groups agree still
    takes a full-sized step (the paper: False, they count in the "seq-mean" denominator). The share
    dropped is the metric ``uninformative_dropped`` (a count)."""
    skip_zero_advantage: bool = True
    """With kl_coef and entropy_coef 0, samples whose advantage is exactly 0 (a group where every
    rollout scored the same) add no gradient: they are not run forward/backward, but stay in the loss
    normaliser, so the update is the same. The share skipped is the metric ``zero_adv_skipped``."""

    # --- batching -------------------------------------------------------------------------------
    micro_batch_tokens: int = 2048
    """Token budget of one forward/backward: padded length x samples. Bounds activation and logits
    memory (logits alone are budget x vocab x 4 bytes, several times over for the backward); gradients
    are accumulated, so the result does not depend on it (up to float rounding). A sample longer than
    the budget runs alone. 2048: on CPU the tiny models update as fast as with 4096 at ~25% less peak
    memory; raise it on a GPU until memory is nearly full."""
    share_prefix: bool = True
    """Run the tokens that a micro-batch's samples share before their first sampled token once per
    distinct prefix instead of once per sample (the K rollouts of a question share its prompt; every
    agent of a role shares its system prompt): one prefix pass per minibatch, over every micro-batch's
    distinct prefixes, whose keys and values each sample's remaining tokens attend to, gradients summed
    back into it (``mgrpo_algo.learning.prefix``). The same update up to float rounding; off with
    gradient checkpointing. benchmarks/vs_trl.py measures it."""
    share_prefix_min_tokens: int = 64
    """Tokens a shared prefix must save in a micro-batch (rows x length not run twice) to be used: below
    it the extra forward call and the cache copies cost more than they save."""
    ppo_epochs: int = 1
    """Passes over each batch. 1 with ``minibatches`` 1 is the paper's single on-policy step (the
    ratio is exactly 1). More passes reuse samples (PPO style) and make the clip active."""
    minibatches: int = 1
    """Optimizer steps per epoch: the batch is shuffled and split into this many parts."""
    seed: int | None = None
    """Seeds the minibatch shuffle (a generator of its own, keyed by seed, update step and epoch, so
    resuming reproduces it). None (default): the run's ``seed`` (a learner built alone: 0).
    Process-global RNGs are the role worker's to seed."""

    # --- placement and numerics -----------------------------------------------------------------
    dtype: str = "float32"
    """Parameter dtype, one of ``DTYPES``. float32 on CPU; bfloat16 halves memory on GPU but AdamW then
    updates bfloat16 weights directly (no fp32 master copy), which loses small updates."""
    device: str = "cpu"
    """Torch device of the model and optimiser ("cpu", "cuda", "cuda:1", ...)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward: ~30% more compute for far less activation memory.
    Worth it for long multi-turn sequences on GPU; rarely on CPU."""
    compute_entropy: bool = True
    """Compute the policy entropy of sampled positions for logging (a no-grad pass over the logits,
    cheap next to the model). Must be True when ``entropy_coef`` > 0."""

    # --- mixed precision and LoRA (appended: older checkpoints load with these defaults) ---------
    autocast_dtype: str = "none"
    """``torch.autocast`` around every learner forward ("none", "bfloat16" or "float16"); parameters
    and AdamW stay in ``dtype`` (keep float32: a master copy for free), matmuls run in the autocast
    dtype, log-probs and the loss are computed in float32. "bfloat16" is the GPU choice (~2x the
    float32 throughput on tensor cores, no loss scaling) and is allowed on every device, CPU included
    (torch supports CPU bf16 autocast; it is slower than float32 on CPUs without AMX, useful for
    tests). "float16" needs a CUDA ``device`` and adds a dynamic ``GradScaler`` (its range is too
    narrow for unscaled gradients); its state is saved with checkpoints."""
    lora_rank: int = 0
    """LoRA rank r (peft) of this role's adapter; 0 trains the full model. > 0 freezes the base model
    and trains only ``r * (d_in + d_out)`` parameters per targeted linear layer: optimiser state and
    gradients shrink to the adapter's size, several roles can share one base model object (see
    ``mgrpo_algo.learning.lora``) and a served vLLM engine is synced by loading the adapter at run time
    (``mgrpo_algo.policies.weight_sync``). With ``kl_coef`` > 0 the reference is the base with adapters
    disabled (no copy). Typical RL values: 16-64."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator: the adapter's update is scaled by ``lora_alpha / lora_rank``."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Names of the linear modules that get an adapter (peft ``target_modules``): every attention and
    MLP projection of Qwen2 / Qwen3 / Llama, all of which vLLM's LoRA kernels serve."""
    temperature: float = 1.0
    """The rollouts' sampling temperature T: log-probs are ``log_softmax(logits / T)``, the
    distribution the policy sampled from (verl's actor does the same), so the first epoch's ratio is 1.
    Not set by hand in a train config: ``RoleConfig`` copies its ``generation.temperature`` here."""

    loss_options: dict[str, Any] = field(default_factory=dict)
    """Options of the ``policy_loss`` beyond the fields above, by name (a new loss's own, e.g.
    ``{eps_max: 1.5}`` for examples/extend/new_policy_loss.py); a key the loss does not take is refused when the config loads."""

    def __post_init__(self) -> None:
        check_own_names(self, "learner.")
        self.betas = tuple(float(b) for b in self.betas)  # YAML / JSON give lists
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not self.adam_eps > 0:
            raise ValueError(f"adam_eps must be > 0, got {self.adam_eps}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.entropy_coef > 0 and not self.compute_entropy:
            raise ValueError("compute_entropy must be True when entropy_coef > 0")
        if int(self.micro_batch_tokens) != self.micro_batch_tokens or self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be an integer >= 1, got {self.micro_batch_tokens}")
        if int(self.ppo_epochs) != self.ppo_epochs or self.ppo_epochs < 1:
            raise ValueError(f"ppo_epochs must be an integer >= 1, got {self.ppo_epochs}")
        if int(self.minibatches) != self.minibatches or self.minibatches < 1:
            raise ValueError(f"minibatches must be an integer >= 1, got {self.minibatches}")
        if self.seed is not None and (int(self.seed) != self.seed or self.seed < 0):
            raise ValueError(f"seed must be an integer >= 0, got {self.seed}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.device, str) or self.device.split(":")[0] not in DEVICE_TYPES:
            raise ValueError(
                f"device must be a torch device string ({', '.join(DEVICE_TYPES)}), got {self.device!r}"
            )
        if self.autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast_dtype must be one of {AUTOCAST_DTYPES}, got {self.autocast_dtype!r}")
        if self.autocast_dtype == "float16" and self.device.split(":")[0] != "cuda":
            raise ValueError(
                f"autocast_dtype 'float16' needs a CUDA device (gradient scaling), got device {self.device!r}; "
                "use 'bfloat16'"
            )
        if isinstance(self.lora_rank, bool) or int(self.lora_rank) != self.lora_rank or self.lora_rank < 0:
            raise ValueError(f"lora_rank must be an integer >= 0 (0 = no LoRA), got {self.lora_rank}")
        self.lora_rank = int(self.lora_rank)
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha}")
        if isinstance(self.lora_targets, str):
            self.lora_targets = (self.lora_targets,)
        self.lora_targets = tuple(str(t) for t in self.lora_targets)
        if self.lora_rank > 0 and not self.lora_targets:
            raise ValueError("lora_targets must name at least one module when lora_rank > 0")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


@dataclass
class GenerationConfig:
    """How a role's policy samples during rollouts."""

    max_new_tokens: int = 96
    """Tokens per turn at most. A turn is one action; tiny models need few. Longer turns cost
    generation time linearly."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; the role's learner scores with the same T
    (``LearnerConfig.temperature``). Above 1 it explores more: a model fitted closely to
    demonstrations samples nearly its argmax at 1, so a group's rollouts agree and carry no
    advantage. Evaluation has its own (``eval.temperature``, 0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 keeps the full distribution the learner differentiates."""
    max_prompt_tokens: int = 3072
    """Longer prompts are not generated for: the turn becomes a format failure (see hf_policy)."""
    kv_cache_mb: float = 1024.0
    """Memory budget of the KV caches the in-process policy keeps between an agent's turns (only the
    new ids are fed at the next turn; past the budget the least recently used are evicted and
    re-prefilled). 0 re-prefills every turn. Same samples and log-probs either way (mgrpo_algo.policies.kv_cache)."""
    decode: str = "fast"
    """How the in-process policy samples: ``"fast"`` (a sampling loop with a preallocated KV cache,
    mgrpo_algo.policies.decode, whose one-token steps run through mgrpo_algo.policies.fast_step for
    float32 Qwen2 / Llama models on the CPU: the model's logits up to float rounding, log-probs within
    ~1e-5, with half the ops of the forward), ``"lean"`` (the same loop through
    mgrpo_algo.policies.lean_forward: bitwise the model's logits), ``"forward"`` (the loop over the
    model's own forward) or ``"generate"`` (transformers' ``generate``, the reference the others are
    tested against). With the multinomial sampler, lean and forward sample generate's ids under a
    seed; benchmarks/generation.py measures them all. Served engines ignore it."""
    sampler: str = "inverse_cdf"
    """How the lean paths draw a token: ``"inverse_cdf"`` (the same distribution from one uniform per
    row: at the demo's batch sizes ``torch.multinomial``'s B x V exponentials cost more than the
    model's step) or ``"multinomial"`` (``torch.multinomial``, as ``generate``: the same ids under a
    seed). ``generate`` always draws with multinomial."""
    fast_prefill: bool = True
    """With ``decode: fast``: each decode call's prefill (a first turn, or the new ids after a kept
    cache) through ``FastStep.prefill`` instead of the model's forward (the same logits up to float
    rounding; 1.07x live tokens/s on the demo: benchmarks/live_decode.py)."""
    compact: bool = True
    """With ``decode: fast`` and greedy or ``inverse_cdf`` draws: rows that stopped leave the decode
    batch (the same ids up to the float rounding of a smaller batch; 1.04x live tokens/s on the demo,
    1.21x at B = 8 x K = 8)."""

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, "generation.max_new_tokens", "must be >= 1")
        _check(self.decode in ("fast", "lean", "forward", "generate"), "generation.decode",
               "must be 'fast', 'lean', 'forward' or 'generate'")
        _check(self.sampler in ("multinomial", "inverse_cdf"), "generation.sampler",
               "must be 'multinomial' or 'inverse_cdf'")
        _check(self.kv_cache_mb >= 0, "generation.kv_cache_mb", "must be >= 0")
        _check(self.temperature >= 0, "generation.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "generation.top_p", "must be in (0, 1]")
        _check(self.max_prompt_tokens >= 16, "generation.max_prompt_tokens", "must be >= 16")


@dataclass
class ServedConfig:
    """A role's served engine: an OpenAI-compatible server (vLLM) loaded with the role's model.

    After every update the weights are pushed to it (``mgrpo_algo.policies.weight_sync``): the role's LoRA
    adapter when ``learner.lora_rank > 0`` (vLLM with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
    --enable-lora``), else the full weights written to ``weights_dir`` (the folder the server was
    started from) and reloaded (``VLLM_SERVER_DEV_MODE=1 --enable-sleep-mode``).
    """

    base_url: str = ""
    """The server's URL (``http://host:port``, with or without ``/v1``); empty: not served."""
    model: str = ""
    """The model name the server answers to; empty: the role's model path."""
    weights_dir: str = ""
    """Where full weights are written for a reload (needed when ``learner.lora_rank`` is 0)."""
    api_key: str | None = None
    """Bearer key of the server, if it asks for one."""
    launch: bool = False
    """The run starts this role's vLLM server itself (``python -m vllm.entrypoints.openai.api_server``,
    :class:`mgrpo_algo.policies.vllm_server.VLLMServer`) from ``weights_dir`` (the learner's weights
    are written there first; with LoRA, the role's model) on ``base_url``'s port (empty: a free port),
    stops it at the end, and restarts it when it dies or hangs. False: an external server at
    ``base_url`` that the run only waits for."""
    timeout_s: float = 120.0
    """Seconds one HTTP request may take; a longer one counts as a hung server (restarted when
    launched, else retried)."""
    wait_s: float = 600.0
    """How long rollouts and weight syncs keep retrying a server that fails (connection refused,
    HTTP 5xx, timeouts) before the run stops with the error; a restart (~45 s on 2 CPU cores) fits."""
    sleep: bool = True
    """Full-weight sync through vLLM's level-2 sleep / wake-up (lowest GPU memory peak); False:
    ``reload_weights`` then ``reset_prefix_cache``. The CPU build answers both."""
    engine_args: list[str] = field(default_factory=list)
    """More flags for a launched server (e.g. ``["--gpu-memory-utilization", "0.3"]``)."""

    def __post_init__(self) -> None:
        _check(self.timeout_s > 0, "served.timeout_s", "must be > 0")
        _check(self.wait_s >= 0, "served.wait_s", "must be >= 0")

    @property
    def enabled(self) -> bool:
        return bool(self.base_url) or self.launch


def _estimator_or_empty(value: Any, where: str) -> None:
    if value != "":
        from .advantages import ESTIMATORS

        ESTIMATORS.check(value, where)


@dataclass
class CalledSideConfig:
    """How a registered called role scores its own side: its reward's weights and format gate, its
    advantage estimator and how its outcome term is grouped. The sub-agents' are the run's ``sub_weights``,
    ``sub_format_gate``, ``sub_estimator`` and ``sub_outcome_groups``; a registered role that leaves one
    unset takes the sub-agents' value, and the config says so when it loads (a warning naming them)."""

    weights: list[float] = field(default_factory=list)
    """The weights its ``RoleSpec.reward`` is called with (``mgrpo_env.rewards.called_pay``). Empty: ``sub_weights``."""
    format_gate: bool | None = None
    """Its reward's ``format_gate``. None: ``sub_format_gate``."""
    estimator: str = named("", "mgrpo_algo.core.config_role:_estimator_or_empty")
    """Its advantage estimator over its aligned slots (a name in ``ESTIMATORS``). Empty: ``sub_estimator``."""
    outcome_groups: str = ""
    """"query" or "subtask" (as ``sub_outcome_groups``). Empty: ``sub_outcome_groups``."""

    def __post_init__(self) -> None:
        check_own_names(self, "called.")
        _check(self.outcome_groups in ("", "query", "subtask"), "called.outcome_groups",
               f"must be 'query', 'subtask' or empty, got {self.outcome_groups!r}")

    def given(self) -> dict[str, Any]:
        """The settings this section sets (the others are left to the sub-agents' values)."""
        return {name: value for name, value in (("weights", self.weights), ("format_gate", self.format_gate),
                                                ("estimator", self.estimator), ("outcome_groups", self.outcome_groups))
                if value not in ([], None, "")}


@dataclass
class RoleConfig:
    """One role (main, sub or single, or a registered role under ``roles:``): its model, how it samples,
    how it learns and, for a registered called role, how it scores its own side."""

    model: str = ""
    """A path or hub name for ``from_pretrained``. Empty: the tiny model built under
    ``TrainConfig.models_dir`` for this role."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    served: ServedConfig = field(default_factory=ServedConfig)
    """Roll out from a served engine instead of in-process ``generate`` (see :class:`ServedConfig`);
    empty ``base_url``: in-process generation."""
    called: CalledSideConfig = field(default_factory=CalledSideConfig)
    """A registered called role's own scoring (:class:`CalledSideConfig`); the built-in roles keep the run's
    ``main_*`` / ``sub_*`` fields, and setting it for them is refused."""

    def __post_init__(self) -> None:
        # One place for T: the learner must score the distribution the rollouts sampled from.
        if self.generation.temperature > 0:
            self.learner.temperature = self.generation.temperature
