"""Typed configuration dataclasses. One docstring per field: default, trade-off, the paper's value.

Each dataclass checks its fields (and fields against each other) in ``__post_init__`` and raises
``ValueError`` naming the offending field, so a bad YAML file or ``--set`` fails before any model loads.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from mgrpo_env.core import EXPERT_REFERENCES, Limits
from mgrpo_env.rewards import PAPER_MAIN_WEIGHTS, PAPER_SUB_WEIGHTS

from .config_types import coerce as _coerce
from .teacher_config import TeacherConfig

__all__ = [
    "LearnerConfig",
    "AUTOCAST_DTYPES",
    "DTYPES",
    "EvalConfig",
    "GenerationConfig",
    "JudgeConfig",
    "Limits",
    "PlacementConfig",
    "PLACEMENTS",
    "PLACEMENT_HANDLES",
    "ServedConfig",
    "RoleConfig",
    "StageConfig",
    "TrainConfig",
    "TRAIN_MODES",
    "MODE_TABLE",
    "ModeSpec",
    "WarmStartConfig",
    "load_config",
    "config_to_dict",
]

#: Parameter dtypes a learner accepts (names of ``torch`` dtypes).
DTYPES = ("float32", "bfloat16", "float16")
#: ``LearnerConfig.autocast_dtype`` values ("none": no autocast).
AUTOCAST_DTYPES = ("none", "bfloat16", "float16")
_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "npu")


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
    policy_loss: str = "clipped"
    """The policy loss, by its name in ``mgrpo_algo.core.losses.POLICY_LOSSES``: "clipped" (the paper's
    clipped policy gradient with clip-higher, ``clipped_pg_loss``). A new loss is one registered
    function there; the options below are passed to it."""
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - eps_low (paper code: 0.2)."""
    eps_high: float = 0.28
    """Upper clip range, 1 + eps_high ("clip-higher", DAPO; paper code: 0.28). Larger keeps more
    exploration on low-probability tokens with positive advantage."""
    aggregation: str = "seq-mean-token-mean"
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

    def __post_init__(self) -> None:
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
        from .losses import AGGREGATIONS  # the one list of valid names

        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)}, got {self.aggregation!r}")
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
        if not isinstance(self.device, str) or self.device.split(":")[0] not in _DEVICE_TYPES:
            raise ValueError(
                f"device must be a torch device string ({', '.join(_DEVICE_TYPES)}), got {self.device!r}"
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

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)


@dataclass
class JudgeConfig:
    """An LLM judge for r_expert on tasks without per-hop gold (``mgrpo_scenarios.verifiers.LLMJudge``):
    an OpenAI-compatible server; the key may come from ``MGRPO_JUDGE_API_KEY``."""

    base_url: str = ""
    """The judge server's URL; empty: no judge (per-hop gold only; b3 = 0 where a task has none, and
    the metrics say so: ``sub/expert_disabled``)."""
    model: str = ""
    """The model name the judge server answers to (needed with ``base_url``)."""
    api_key: str | None = None
    """Bearer key of the judge server; None: ``MGRPO_JUDGE_API_KEY``, then ``OPENAI_API_KEY``, if set."""
    timeout_s: float = 30.0
    """Seconds to wait for one judgement before it is retried."""
    max_retries: int = 2
    """Retries of a failed or timed-out judgement; after them the sub-agent's r_expert is unscored."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: the same verdict for the same input)."""
    max_tokens: int | None = 1024
    """Tokens the judge may write per verdict (None: the server's limit)."""

    def __post_init__(self) -> None:
        _check(not self.base_url or bool(self.model), "expert_judge.model", "is needed with expert_judge.base_url")

    @property
    def enabled(self) -> bool:
        return bool(self.base_url)

    def make(self) -> Any:
        """The ``LLMJudge`` this section describes (None when disabled)."""
        if not self.enabled:
            return None
        from mgrpo_scenarios.verifiers import LLMJudge

        return LLMJudge(self.base_url, self.model, api_key=self.api_key, timeout_s=self.timeout_s,
                        max_retries=self.max_retries, temperature=self.temperature, max_tokens=self.max_tokens)


#: Every placement in one place: its name and the kind of handle its role workers live behind (a key
#: of ``mgrpo_algo.distributed.placement.PLACEMENT_BACKENDS``; in-process is a local handle).
PLACEMENT_HANDLES: dict[str, str] = {"in-process": "local", "local": "local", "processes": "processes", "ray": "ray"}
PLACEMENTS = tuple(PLACEMENT_HANDLES)


@dataclass
class PlacementConfig:
    """Where the roles run. One iteration loop drives all of them; only this changes underneath."""

    kind: str = "in-process"
    """Where the role workers live (one per role, every mode): ``in-process`` and ``local`` in the
    trainer's process, ``processes`` one process per role, ``ray`` Ray actors; only statistics cross
    between roles, through the store. ``in-process`` keeps its store in ``out_dir`` and takes no
    ``store`` / ``staleness`` (the decoupled settings)."""
    store: str = ""
    """The statistics store of decoupled runs: ``sqlite:PATH`` or ``redis://[:PASSWORD@]host:port``
    (``rediss://`` for TLS). Empty: ``sqlite:<out_dir>/stats.sqlite``."""
    staleness: int = 0
    """0: synchronized (the sub learner applies iteration t in t, the paper's better variant). n > 0:
    the sub learner may lag up to n iterations behind the main learner."""
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per role ``{num_cpus, num_gpus}`` for Ray actors (e.g. ``{main: {num_gpus: 1}}``)."""

    def __post_init__(self) -> None:
        _check(self.kind in PLACEMENTS, "placement.kind", f"must be one of {PLACEMENTS}, got {self.kind!r}")
        _check(isinstance(self.staleness, int) and self.staleness >= 0, "placement.staleness", "must be an integer >= 0")
        _check(self.kind != "in-process" or (not self.store and not self.staleness), "placement.store",
               "and placement.staleness need a decoupled placement.kind (local, processes, ray)")

    @property
    def decoupled(self) -> bool:
        return self.kind != "in-process"


@dataclass
class RoleConfig:
    """One role (main, sub or single): its model, how it samples, how it learns."""

    model: str = ""
    """A path or hub name for ``from_pretrained``. Empty: the tiny model built under
    ``TrainConfig.models_dir`` for this role."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    served: ServedConfig = field(default_factory=ServedConfig)
    """Roll out from a served engine instead of in-process ``generate`` (see :class:`ServedConfig`);
    empty ``base_url``: in-process generation."""

    def __post_init__(self) -> None:
        # One place for T: the learner must score the distribution the rollouts sampled from.
        if self.generation.temperature > 0:
            self.learner.temperature = self.generation.temperature


@dataclass
class StageConfig:
    """One curriculum stage (paper: stage 1 simple questions to learn the format, stage 2 multi-hop)."""

    split: str = "stage2/train"
    """The split whose training questions this stage draws (a name of ``scenario.splits()``)."""
    iterations: int = 2
    """Iterations of B questions x K rollouts in this stage (0: the stage is skipped)."""

    def __post_init__(self) -> None:
        _check(self.iterations >= 0, "stages.iterations", "must be >= 0")


@dataclass
class WarmStartConfig:
    """Supervised warm start from oracle demonstrations."""

    splits: list[str] = field(default_factory=lambda: ["stage1/train", "stage2/train"])
    """Splits whose train tasks are demonstrated (the paper's stage 1 is simple questions)."""
    max_tasks: int = 200
    """Tasks demonstrated per split (the oracle solves each once)."""
    epochs: int = 3
    """Passes over the demonstrations. 0 disables the warm start."""
    lr: float = 1e-3
    """AdamW learning rate for the tiny from-scratch models (3e-3 diverged to NaN in the sweep of
    benchmarks/warm_start_sweep.py; 1e-3 learned fastest)."""
    batch_tokens: int = 8192
    """Padded tokens per optimiser step."""
    noise: float = 0.2
    """Share of demonstrated actions replaced by random well-formed protocol actions (0 = pure oracle)."""
    max_seq_tokens: int = 3072
    """Longer demonstrations are skipped (counted in the metrics)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup over the first steps (small models trained from scratch: 50-100,
    nanoGPT's small configs; without it lr 3e-3 diverged in the sweep)."""
    min_lr_ratio: float = 1.0
    """Cosine decay from ``lr`` to ``lr * min_lr_ratio`` over all steps after the warmup (1.0 = constant lr)."""
    beta2: float = 0.999
    """AdamW's second-moment decay (0.99 for small models and short runs, as nanoGPT's small configs)."""
    relabel: bool = False
    """Relabel world tokens at random in every demonstration each time it is shown (consistently
    within it: a name becomes another name everywhere, its slug follows), from the scenario's
    ``world_token_groups()`` (the wiki-hops tiny profile). Every copy stays a copy, but a name can no
    longer be answered from memory, so the model must learn to copy, and a few hundred demonstrations
    become an endless supply of fresh ones (in-context copying is learned from many rare items,
    not from a few frequent ones: Chan et al. 2022, Reddy 2023)."""
    role_epochs: dict[str, float] = field(default_factory=dict)
    """Per-role epochs overriding ``epochs`` (e.g. ``{main: 6, sub: 3}``): the roles' demonstrations
    differ in length and difficulty, so equal epochs are not equal budgets. Fractions train on a
    share of the last epoch."""
    device: str = "cpu"
    """Where the warm start trains ("cuda": bf16 autocast); the models are saved back as float32."""
    torch_threads: int = 2
    """CPU threads for the warm start's large batches (2 threads: 1.4x the tokens/s of 1 for
    8,000-token batches on the 2-core machine; nothing else runs meanwhile)."""
    validation_tasks: int = 16
    """The last tasks of each split are held out of training; the warm-started model's turn exact
    match on their demonstrations is recorded in ``warm_start.json`` (0: no validation)."""
    seed: int = 0
    """Seeds the warm start's noise, shuffles and relabelling (part of its cache key)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """Second stage: imitate an imperfect teacher (off when all its rates are 0; see TeacherConfig)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"config field 'warm_start.noise' must be in [0, 1], got {self.noise}")
        if self.validation_tasks < 0:
            raise ValueError(f"config field 'warm_start.validation_tasks' must be >= 0, got {self.validation_tasks}")
        if not isinstance(self.device, str) or self.device.split(":")[0] not in _DEVICE_TYPES:
            raise ValueError(f"config field 'warm_start.device' must be a torch device string "
                             f"({', '.join(_DEVICE_TYPES)}), got {self.device!r}")
        if self.epochs < 0 or self.max_tasks < 1 or self.batch_tokens < 64:
            raise ValueError("config fields 'warm_start.epochs' >= 0, 'max_tasks' >= 1, 'batch_tokens' >= 64")
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0 or not 0.0 < self.beta2 < 1.0:
            raise ValueError("config fields 'warm_start.warmup_steps' >= 0, 'min_lr_ratio' in [0, 1], 'beta2' in (0, 1)")
        bad = {r: e for r, e in self.role_epochs.items() if r not in ("main", "sub", "single") or not e >= 0}
        if bad:
            raise ValueError(f"config field 'warm_start.role_epochs' takes roles main/sub/single with epochs >= 0, got {bad}")

    def epochs_for(self, role: str) -> float:
        """The epochs of ``role``: its ``role_epochs`` entry, else ``epochs``."""
        return float(self.role_epochs.get(role, self.epochs))



@dataclass(frozen=True)
class ModeSpec:
    """One training mode: the roles it runs, the roles whose learner updates, and the env its
    episodes run in (a name in ``mgrpo_env.rollout.EPISODES``). Every mode's env gets the same
    ``RewardConfig`` (the single agent's uses its main weights)."""

    roles: tuple[str, ...]
    trained: tuple[str, ...]
    env: str = "hierarchy"

    @property
    def single(self) -> bool:
        """One agent holding every tool, no hierarchy (no sub side, no alignment)."""
        return "sub" not in self.roles


#: Every mode, in one place: adding a mode is one entry here (docs/design.md, "Adding things").
MODE_TABLE: dict[str, ModeSpec] = {
    "mgrpo": ModeSpec(("main", "sub"), ("main", "sub")),
    "frozen-sub": ModeSpec(("main", "sub"), ("main",)),
    "single-agent": ModeSpec(("single",), ("single",), env="single"),
}
TRAIN_MODES = tuple(MODE_TABLE)


@dataclass
class EvalConfig:
    """Held-out evaluation of a training run (``mgrpo compare``: before and after training, and curves).

    Training accuracy is measured on the questions being trained on; held-out questions tell whether
    what was learned carries over.
    """

    split: str = "stage2/test"
    """Held-out split evaluated (the paper's stage-2 multi-hop questions, test part)."""
    limit: int = 100
    """Questions evaluated (the split's first ones, a fixed set); 0 = all of them. More questions
    narrow the error bar (binomial: ~5 points at 100 questions) at linear cost."""
    samples: int = 1
    """Rollouts per question; EM and F1 average over all of them. > 1 only helps with temperature > 0."""
    temperature: float = 0.0
    """Sampling temperature of the evaluated policies; 0 = greedy (deterministic). With ``samples`` k
    > 1 at the rollouts' temperature the headline is mean@k (DeepSeek-R1's and DAPO's report): far
    less noisy per question than one greedy answer, and it measures the policy RL trains."""
    greedy: bool = True
    """With ``temperature`` > 0, also evaluate greedily (one sample per question) and report greedy EM
    beside mean@k. Costs one more pass of ``limit`` episodes per evaluation."""
    max_new_tokens: int = 0
    """Tokens per turn at most; 0 = each role's ``generation.max_new_tokens``."""
    every: int = 0
    """Evaluate held-out accuracy every N training iterations on ``curve_limit`` questions (a learning
    curve); 0 = only before and after training. Each point costs one evaluation."""
    curve_limit: int = 32
    """Questions per curve point (``every`` > 0): fewer than ``limit`` to keep curves cheap."""
    reference: str = ""
    """A hierarchy start to evaluate beside the runs (a folder with ``main/`` and ``sub/``, e.g.
    ``configs/oracle-warm-start``, the oracle clone): compare reports M-GRPO after RL minus it. "" = none.
    Costs one more sampled evaluation (no greedy pass)."""

    def __post_init__(self) -> None:
        _check(isinstance(self.split, str) and bool(self.split), "eval.split", f"must name a split, got {self.split!r}")
        for name, low in (("limit", 0), ("samples", 1), ("max_new_tokens", 0), ("every", 0), ("curve_limit", 1)):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= low, f"eval.{name}",
                   f"must be an integer >= {low}, got {value!r}")
        _check(isinstance(self.temperature, (int, float)) and self.temperature >= 0, "eval.temperature",
               f"must be >= 0, got {self.temperature!r}")
        self.temperature = float(self.temperature)


@dataclass
class TrainConfig:
    """A whole training run. Load with :func:`load_config` (YAML + ``key.sub=value`` overrides)."""

    mode: str = "mgrpo"
    """``mgrpo``: main and sub learners both update (the paper's method). ``frozen-sub``: only the
    main learner updates (baseline). ``single-agent``: GRPO on the single-agent env (baseline)."""
    scenario: str = "wiki-hops"
    """The scenario's registered name (``mgrpo_scenarios.names()``: wiki-hops, qa-file, gaia, ...)."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed to ``mgrpo_scenarios.get`` (e.g. ``num_entities``, ``seed``, ``data_dir``)."""
    stages: list[StageConfig] = field(
        default_factory=lambda: [StageConfig("stage1/train", 1), StageConfig("stage2/train", 1)]
    )
    """The curriculum, run in order (:class:`StageConfig`: split and iterations each)."""
    questions_per_iteration: int = 4
    """B, questions per iteration. Each gets K rollouts."""
    group_size: int = 4
    """K, rollouts per question (paper: 8). Advantages are relative within this group."""
    align_d: int = 0
    """Alignment width d (paper: 8). 0: chosen from the sub-agent counts seen so far as the smallest
    d with P(d_k <= d) >= align_quantile."""
    align_quantile: float = 0.99
    """With ``align_d`` 0: d is the smallest width that covers this share of the sub-agent counts seen."""
    align_strategy: str = "duplicate"
    """``duplicate`` (paper), ``duplicate_balanced`` or ``mask`` (pad with weight-0 slots)."""
    step_advantage_weight: float = 0.0
    """w of step-level credit (GiGPO, arXiv 2505.10978), for every role and every mode alike: a turn's
    advantage is its trajectory's plus w x its step advantage, the return standardised among the
    turns of the query's rollouts that start from the same state (``core.advantages.step_advantages``).
    It credits the action taken where a group's rollouts diverge, not the whole trajectory: the
    main agent is no longer blamed, at the turns before, for a sub-agent's wrong report. 0 (the
    paper): one advantage per trajectory. GiGPO uses 1."""
    main_estimator: str = "grpo"
    """The main (and single) agent's advantage estimator, by its name in
    ``mgrpo_algo.core.advantages.ESTIMATORS``: "grpo" (the paper: standardised over the K rollouts)."""
    sub_estimator: str = "grpo_pooled_masked"
    """The sub-agents' estimator over the aligned [Q, K, d] slots, by name: "grpo_pooled_masked" (the
    paper: pooled per query over its unmasked slots). A new estimator is one registered function."""
    main_weights: tuple[float, float] = PAPER_MAIN_WEIGHTS
    """(a1, a2) of R_M; the paper's by default (``mgrpo_env.rewards.PAPER_MAIN_WEIGHTS``)."""
    sub_weights: tuple[float, float, float] = PAPER_SUB_WEIGHTS
    """(b1, b2, b3) of R_S; the paper's by default (``mgrpo_env.rewards.PAPER_SUB_WEIGHTS``)."""
    sub_format_gate: bool = False
    """Pay the sub-agents' format term in proportion to the expert score (b1 * r_format * r_expert), so
    a well-formed wrong report earns nothing for its form. False: the paper. Under the paper's R_S
    the sub-agents learned to report guesses (README, "Rewards that do not pay guessing")."""
    expert_reference: str = "hop"
    """What r_expert scores a report against: "hop" (the paper: the gold answer of the question's hop)
    or "subtask" (the scenario's answer to the subtask the main agent actually delegated, so a
    sub-agent is not blamed for a mis-delegation; falls back to "hop" where the scenario cannot answer)."""
    limits: Limits = field(default_factory=Limits)
    """Episode limits, the env's own :class:`mgrpo_env.Limits` (defaults there); both envs take this
    object (the single agent's turn budget is its ``single_agent_turns``)."""
    expert_judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge for r_expert on tasks without per-hop gold (:class:`JudgeConfig`); honoured by
    every placement."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Where the roles run and, decoupled, the store and the staleness (:class:`PlacementConfig`)."""
    models_dir: str = "runs/models"
    """Where tiny role models are built when a role's ``model`` is empty."""
    model_sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Tiny model sizes per role (``hidden_size``, ``num_layers``, ...); see models.build_role_models."""
    main: RoleConfig = field(default_factory=RoleConfig)
    sub: RoleConfig = field(default_factory=RoleConfig)
    single: RoleConfig = field(default_factory=RoleConfig)
    out_dir: str = "runs/train"
    """The run folder: metrics.jsonl, episodes.jsonl, checkpoints/, final/, tb/ (a used one is refused)."""
    seed: int = 0
    """The RL seed: question order, sampling, minibatch shuffles; ``mgrpo eval``'s episode and sampling seed."""
    model_seed: int = 0
    """Initialisation of the tiny models built under ``models_dir`` (kept apart from ``seed`` so that
    runs with other RL seeds share the same models and warm start)."""
    torch_threads: int = 1
    """CPU threads for torch. Tiny models are overhead-bound: 1 thread is fastest on a shared 2-core
    machine (measured up to 50x faster than 2 under contention)."""
    max_workers: int = 8
    """Threads stepping envs (tool calls) during collection."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Supervised stage-1 warm start from oracle demonstrations (``epochs: 0`` disables it). Runs
    before RL when the roles use the built tiny models; cached under ``models_dir``."""
    checkpoint: bool = True
    """Save each learner (safetensors + optimizer + RNG) at the end of every stage under
    ``checkpoints/stage<n>/<role>``. The per-iteration checkpoints of the commit protocol
    (``workers/<role>/checkpoints/iter-<t>``, only the last committed one kept) are always written:
    a restarted worker and ``resume`` need them."""
    resume: bool = False
    """Continue the run in ``out_dir`` after its last committed iteration (``loop_state.json``; every
    role worker goes back to its checkpoint of that iteration), dropping metrics and episodes lines
    written after it. Any placement. False: a fresh run (earlier worker state in ``out_dir`` is removed)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation (``mgrpo compare``): split, questions, greedy or sampled, curve points."""

    def __post_init__(self) -> None:
        _check(self.mode in TRAIN_MODES, "mode", f"must be one of {TRAIN_MODES}, got {self.mode!r}")
        _check(self.questions_per_iteration >= 1, "questions_per_iteration", "must be >= 1")
        _check(self.group_size >= 2, "group_size", "must be >= 2 (advantages are relative to the group)")
        _check(self.align_d >= 0, "align_d", "must be >= 0 (0 = choose from data)")
        _check(0 < self.align_quantile <= 1, "align_quantile", "must be in (0, 1]")
        _check(len(self.main_weights) == 2, "main_weights", "needs 2 values (a1, a2)")
        _check(self.step_advantage_weight >= 0, "step_advantage_weight", "must be >= 0")
        _check(len(self.sub_weights) == 3, "sub_weights", "needs 3 values (b1, b2, b3)")
        _check(self.expert_reference in EXPERT_REFERENCES, "expert_reference",
               f"must be one of {EXPERT_REFERENCES}, got {self.expert_reference!r}")
        _check(self.torch_threads >= 1, "torch_threads", "must be >= 1")
        _check(bool(self.stages), "stages", "needs at least one stage")
        served = [r for r in ("main", "sub", "single") if getattr(self, r).served.enabled]
        _check(not (served and self.placement.decoupled), "placement.kind",
               f"must be in-process for served engines (roles {served})")


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"config field '{name}' {message}")


def load_config(path: str | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """A TrainConfig from YAML (``path``) with ``dotted.key=value`` overrides (values parsed as YAML).

    Unknown keys raise ValueError naming the field, so a typo never passes silently.
    """
    import yaml

    data: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: a config file must hold a mapping")
        data = loaded
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: '{part}' is not a section")
        node[parts[-1]] = yaml.safe_load(value)
    return _build(TrainConfig, data, "")


def _build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        names = ", ".join(f.name for f in fields(cls))
        raise ValueError(f"config field '{where.rstrip('.') or cls.__name__}' must be a mapping (a section: {names}), got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config field '{where + unknown[0]}' (valid: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{where}{name}.")
        elif typing.get_origin(hint) is list and is_dataclass(typing.get_args(hint)[0]):
            item_cls = typing.get_args(hint)[0]
            kwargs[name] = [_build(item_cls, v, f"{where}{name}[{i}].") for i, v in enumerate(value or [])]
        else:
            kwargs[name] = _coerce(hint, value, where + name)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"config section '{where or cls.__name__}': {exc}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain dict (for YAML/JSON dumps and run manifests)."""
    return asdict(config)
