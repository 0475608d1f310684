"""PPO for RLHF, CleanRL style: the whole algorithm in this file, top to bottom, names as in the papers.

Ziegler et al. 2019, Stiennon et al. 2020, Ouyang et al. 2022 (InstructGPT), Huang et al. 2023 ("The N
implementation details of RLHF with PPO"). The pure maths (reward shaping, KL estimators, GAE, baselines,
clipped losses, KL controllers) lives in ``rl_math.py``.

One PPO step (= one ``training_step``, one x-axis step of every ``objective/*`` and ``eval/*`` metric):

1. rollout   x ~ prompts, y ~ π_θ(·|x), KV-cached sampling (``generation.*``), ``samples_per_prompt`` per prompt;
2. score     r(x, y) from the frozen reward model (``algo.reward=rm``, normalised) or the world's gold
             reward (``algo.reward=gold``, oracle RL); shaping: − α·len − missing-EOS penalty, clipping;
3. evaluate  per-token log π_θ_old(y_t), log π_ref(y_t) (logits / temperature), values V(s_t);
4. rewards   KL_t = k1|k2|k3(π_θ_old, π_ref) and r_t = −β·KL_t with r(x, y) added at the last token
             (``algo.kl_in=reward``; with ``kl_in=loss`` the β·KL term is in the loss instead, GRPO style);
5. advantage GAE(γ, λ) with the critic, or (``algo.critic=none``) A = R − baseline (batch/group mean or
             RLOO leave-one-out), or GRPO's (R − group mean) / group std (``algo.advantage_scale``); whitened;
6. update    ``ppo_epochs`` × ``num_minibatches`` AdamW steps on the clipped surrogate (ε, or ε_low/ε_high),
             the clipped value loss, an optional entropy bonus (and β·KL in the loss), the per-token terms
             reduced by ``algo.loss_agg`` (token mean; GRPO, RLOO and Dr. GRPO's forms); each minibatch cut
             to its own longest prompt and response (``algo.trim_minibatches``: the same losses, less compute);
7. adapt β   the KL controller (``kl=fixed|adaptive``) sees the measured KL in ``kl.unit``.

The four roles (policy, reference, critic, reward) are built for the configured mode by the stage
:mod:`rlhf_lab.stages.ppo`; ``algo.reference.sync_every`` re-syncs the reference to the policy here. A critic
without a backbone (``algo.critic=shared``, or the shared-base LoRA mode) is a value head on the hidden states
of the policy's own pass: one forward for log-probs and values (half the update's compute of a separate critic),
but the value loss (× ``vf_coef``) then trains the policy's trunk too, coupling the two objectives: L = L_clip +
c_v·L_V on one set of trunk weights, as in CleanRL's and OpenAI Baselines' shared-network PPO (the hidden state is not
detached, so the trunk's gradient is L_clip's plus c_v times L_V's). It holds with full fine-tuning as with LoRA.

Memory options for full fine-tuning (issue 70; each off by default): ``algo.critic=shared`` (above),
``algo.reference.dtype`` (a bf16 reference; its log-probs and the KL in fp32), ``algo.activation_checkpointing`` (the
trained trunks' decoder layers recompute their activations in the backward: the same gradients) and
``algo.optimizer=adafactor`` (torch's Adafactor instead of AdamW: little optimiser state, another update rule).
``generation.dtype`` (off by default) samples step 1 from a bf16 copy of the policy, refreshed before each rollout;
steps 3-6 use the policy: the responses are slightly off-policy for the ratio's π_θ_old (docs/configuration.md).

Metric names: docs/metrics.md (TRL's where TRL has one). ``objective/kl``: the per-response sum of the configured
KL estimator, batch mean; ``objective/kl_token`` its per-token mean; ``objective/kl_k1|k2|k3`` each estimator's.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from pathlib import Path
from typing import Callable

import lightning as L
import torch
from torch import nn

from rlhf_lab.runs import active_run, distributed
from rlhf_lab.algorithms.guards import check_divergence, check_finite
from rlhf_lab.algorithms.kl import KLEstimator, kl_controller, kl_estimators
from rlhf_lab.algorithms.lm import adamw
from rlhf_lab.config.ppo_rules import check_ppo_rules
from rlhf_lab.config.schema import GenerationConfig, KLConfig, PPOConfig
from rlhf_lab.algorithms.rl_math import (
    aggregate_loss,
    explained_variance,
    gae,
    group_advantages,
    group_stats,
    leave_one_out_baseline,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    mean_baseline,
    per_token_rewards,
    ppo_policy_loss,
    ppo_value_loss,
    reinforce_advantages,
    rlhf_reward_terms,
    shape_scores,
)
from rlhf_lab.evaluation.metrics import distinct_n, filler_rate, unique_rate
from rlhf_lab.models.actor_critic import (checkpoint_activations, lm_forward, lm_forward_packed, lm_forward_shared,
                                          train_checkpointed)
from rlhf_lab.models.adapters import AdapterDisabled
from rlhf_lab.models.onednn import onednn_linears
from rlhf_lab.models.packing import check_packing
from rlhf_lab.models.rollout_copy import RolloutCopy
from rlhf_lab.models.sampling import pack_rollout, response_logprobs, sample, token_logprobs, trim_padding
from rlhf_lab.models.batching import prompt_groups
from rlhf_lab.models.sharding import full_state_dict, gathered, local, shard_trained
from rlhf_lab.evaluation.policy import Scorer, as_gold_scorer
from rlhf_lab.world import GoldWeights


# ------------------------------------------------------------------------------------------------
# the algorithm


class Forever(torch.utils.data.IterableDataset):
    """The PPO loop draws its own prompts; Lightning only needs a clock."""

    def __iter__(self):
        return itertools.count()


class StepTimer:
    """Wall-clock seconds of one PPO step's :attr:`PHASES` (each logged as ``time/<phase>_s``): ``with timer("rollout"):
    ...`` adds the block's time to ``seconds["rollout"]``; ``elapsed()`` is the time since the step's start."""

    PHASES = {"rollout": "generation", "score": "scoring", "forward": "no-grad passes (old, reference, values)",
              "update": "update"}  # {phase: what the job summary calls it}

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


class PPOModule(L.LightningModule):
    def __init__(self, policy, reference, critic, tokenizer, scorer: Scorer, prompt_fn: Callable[[int], list[str]],
                 algo: PPOConfig, kl: KLConfig, gen: GenerationConfig, gold: GoldWeights | Scorer | None,
                 checkpoint_dir=None, formula_gold: Scorer | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.policy = policy
        self.critic = critic
        if isinstance(reference, nn.Module):
            self.reference = reference  # frozen; in the checkpoint because sync_every changes it
        # not registered as submodules: the shared-base reference is a view of the policy, the RM stays out
        # of the checkpoint and the optimiser
        object.__setattr__(self, "_reference", reference)
        object.__setattr__(self, "scorer", scorer)
        self.tok, self.prompt_fn = tokenizer, prompt_fn
        self.a, self.kl_settings, self.gen = algo, kl, gen
        self.gold = as_gold_scorer(gold)  # None: no objective/gold (external data)
        self.formula_gold = formula_gold  # the world's formula beside a gold RM: objective/formula_gold
        self.kl_ctl = kl_controller(kl.name, kl.beta, kl.target, kl.horizon)
        self.checkpoint_dir = checkpoint_dir
        self.ppo_step = 0  # completed PPO steps: the x-axis of every metric
        self.last_stats: dict[str, float] = {}
        # this process's PPO steps, summed: the phases' time/* seconds (rollout, score, forward, update), for the
        # job summary's breakdown of where the steps' time went (StepTimer.PHASES)
        self.phase_totals: dict[str, float] = {}
        self.start_entropy: float | None = None  # the first step's: the divergence guard's noise bound needs it
        self._rng_to_restore = None
        self._packing_checked = False
        self.rollout_copy: RolloutCopy | None = None  # generation.dtype: the model step 1 samples from
        self._k = algo.samples_per_prompt
        self._world = distributed.world_size()  # algo.batch_size is global: each rank rolls out its share
        check_ppo_rules(algo, processes=self._world)  # the rules the config checks and the stage apply, once
        self._B = algo.batch_size // self._world
        # algo.activation_checkpointing: the trained trunks' layers (the policy's; a critic's own backbone)
        self._checkpointed = []
        if algo.activation_checkpointing:
            self._checkpointed = checkpoint_activations(policy) + (
                checkpoint_activations(critic.backbone) if critic is not None and critic.backbone is not None else [])

    @property
    def compiled(self) -> bool:
        """``algo.compile``: the packed passes' trunks (policy, critic, reference) through ``torch.compile``."""
        return bool(self.a.compile)

    @property
    def updates_per_step(self) -> int:
        return self.a.ppo_epochs * self.a.num_minibatches

    def configure_model(self):  # trainer=fsdp: policy and critic sharded; the frozen reference and RM stay whole
        shard_trained(self, self.policy)
        if self.critic is not None and self.critic.backbone is not None:
            shard_trained(self, self.critic, probe=lambda critic, ids: critic(ids, torch.ones_like(ids), 1))

    def configure_optimizers(self):
        groups = [{"params": [p for p in self.policy.parameters() if p.requires_grad], "lr": self.a.lr}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": self.a.critic_lr})
        if str(self.a.optimizer) == "adafactor":  # a factored second moment, no first: little state
            # (torch >= 2.5: check_ppo_rules); its default eps, beta2_decay and d; foreach: one multi-tensor kernel
            # per update instead of a loop over parameters (CPU's default is the loop), the same numbers bit for bit
            return torch.optim.Adafactor(groups, weight_decay=0.0, foreach=True)
        return adamw(groups, eps=1e-5, weight_decay=0.0)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Forever(), batch_size=None)

    def on_train_start(self):
        for rm in (self.scorer, self.gold):  # the RMs (proxy, gold) are not submodules: follow the policy's device
            if hasattr(rm, "to"):
                rm.to(self.device)
        r = distributed.rank()
        if r > 0:  # its own sampling stream (rank 0 keeps the single-process one)
            torch.manual_seed(torch.initial_seed() + 1_000_003 * r)

    # -- forward passes ------------------------------------------------------------------------
    def policy_forward(self, q_ids, q_mask, r_ids, r_mask):
        """(log π_θ(y_t), entropy_t, V(s_t) or None) in one pass of the policy (and critic): each distinct prompt
        run once where rows share one (:meth:`shared_prompts`: without gradients), else packed without padding with
        ``algo.packing`` (:func:`rlhf_lab.models.sampling.pack_rollout`), else padded."""
        shared = self.critic is not None and self.critic.backbone is None
        groups = self.shared_prompts(q_ids, q_mask)
        packing = groups is None and self.packing()  # the first call checks the trunks, in eval mode
        # algo.activation_checkpointing: the checkpointed layers' own training flag (their submodules stay in eval
        # mode: no dropout); transformers checkpoints only passes with gradients (the update's)
        train_checkpointed(self._checkpointed)
        if groups is not None:
            logits, hidden = lm_forward_shared(self.policy, q_ids, q_mask, r_ids, r_mask, groups)
        elif packing:
            packed = pack_rollout(q_ids, q_mask, r_ids, r_mask, self.tok.pad_token_id)
            logits, hidden = lm_forward_packed(self.policy, *packed, compiled=self.compiled)
        else:
            ids, attn = torch.cat([q_ids, r_ids], 1), torch.cat([q_mask, r_mask], 1)
            logits, hidden = lm_forward(self.policy, ids, attn, q_ids.shape[1])
        logp, ent = token_logprobs(logits, r_ids, r_mask, self.gen.temperature or 1.0, with_entropy=True,
                                   entropy_grad=bool(self.a.entropy_coef))  # else a metric only
        values = None
        if self.critic is not None:
            h = hidden if shared else None
            if groups is not None:
                values = self.critic.forward_shared(q_ids, q_mask, r_ids, r_mask, groups, hidden=h)
            elif packing:
                values = self.critic.forward_packed(*packed, hidden=h, compiled=self.compiled)
            else:
                values = self.critic(ids, attn, q_ids.shape[1], hidden=h)
        return logp, ent, values

    def reference_logprobs(self, q_ids, q_mask, r_ids, r_mask):
        """log π_ref(y_t): each distinct prompt run once like the policy's pass (:meth:`shared_prompts`, the
        shared-base reference with its adapters disabled too), else packed when the reference is a model of its own
        (``algo.packing``); the shared-base reference then runs padded."""
        ref, temperature = self._reference, self.gen.temperature or 1.0
        groups = self.shared_prompts(q_ids, q_mask)
        if groups is not None:
            with ref.adapters_off() if isinstance(ref, AdapterDisabled) else contextlib.nullcontext(ref) as model:
                logits, _ = lm_forward_shared(model, q_ids, q_mask, r_ids, r_mask, groups)
            return token_logprobs(logits, r_ids, r_mask, temperature)
        if self.packing() and isinstance(ref, nn.Module):
            logits, _ = lm_forward_packed(ref, *pack_rollout(q_ids, q_mask, r_ids, r_mask, self.tok.pad_token_id),
                                          compiled=self.compiled)
            return token_logprobs(logits, r_ids, r_mask, temperature)
        return response_logprobs(ref, q_ids, q_mask, r_ids, r_mask, temperature)

    def shared_prompts(self, q_ids, q_mask):
        """With ``algo.shared_prompt``, in a pass without gradients (old log-probs, values, reference), the rows'
        prompt groups (:func:`rlhf_lab.models.batching.prompt_groups`) where some rows share a prompt; else None,
        also under ``algo.compile`` (whose compiled trunk takes packed rows). The update's passes run packed: at the
        0.5b shape on a CPU a shared prompt saved them nothing (the two calls' weight gradients each add into the
        gradient buffers, and the smaller products run at a lower rate; benchmarks/README.md)."""
        if not self.a.shared_prompt or self.compiled or torch.is_grad_enabled():
            return None
        first, group = prompt_groups(q_ids, q_mask)
        return (first, group) if len(first) < len(group) else None

    def packing(self) -> bool:
        """``algo.packing``; the first time, checks that the policy, the critic's and the reference's trunks keep
        packed sequences apart (:func:`rlhf_lab.models.packing.check_packing`)."""
        if not self.a.packing:
            return False
        if not self._packing_checked:
            models = [self.policy]
            if self.critic is not None and self.critic.backbone is not None:
                models.append(self.critic.backbone)
            if isinstance(self._reference, nn.Module):
                models.append(self._reference)
            for m in models:
                check_packing(m, "algo.packing")
            self._packing_checked = True
        return True

    def sync_reference(self):
        self.reference.load_state_dict(full_state_dict(self.policy, everywhere=True))

    # -- one PPO step: the numbered steps of the module docstring ------------------------------
    def training_step(self, batch, batch_idx):
        self.restore_rng()  # resume: continue the sampling stream where it stopped
        a, step, timer = self.a, self.ppo_step, StepTimer()
        self.eval()  # no dropout anywhere in PPO (Huang et al. 2023, detail 9); gradients still flow
        sync_every = int(a.reference.sync_every or 0)
        if sync_every and step % sync_every == 0:
            self.sync_reference()
        beta = self.kl_ctl.beta

        # 1. rollout: y ~ π_θ(·|x), k responses for each of B/k prompts
        with timer("rollout"):
            ro = self.rollout([p for p in self.prompt_fn(step) for _ in range(self._k)])
        qr = (ro.query_ids, ro.query_mask, ro.response_ids, ro.response_mask)  # query and response tokens
        mask = ro.response_mask

        with torch.no_grad():
            # 2. score: r(x, y), shaped: r − α·len − penalty·[no EOS], optionally clipped
            with timer("score"):
                scores = self.score(ro)
                self.assert_finite({"reward-model score": scores})
            shaped = shape_scores(scores, mask.sum(1).float(), torch.tensor(ro.ended, device=mask.device),
                                  a.length_penalty, a.missing_eos_penalty, a.reward_clip)

            # 3. evaluate: log π_θ_old(y_t), log π_ref(y_t), V(s_t)
            # the linears whose reordered weights the sampler kept (a LoRA policy's frozen base, which the
            # adapters-off reference shares) through oneDNN; not under algo.compile (a replaced forward would
            # recompile the trunks at every step)
            frozen = (contextlib.nullcontext() if self.compiled
                      else onednn_linears(self, len(ro.prompts), kept_only=True))
            with timer("forward"), frozen:
                old_logp, entropy, old_values = self.policy_forward(*qr)
                ref_logp = self.reference_logprobs(*qr)
            self.assert_finite({"policy log-prob": old_logp, "reference log-prob": ref_logp, "value": old_values}, mask)

            # 4. rewards: r_t = −β·KL_t, plus the shaped score at the last token (β = 0 here with kl_in=loss)
            kl_t = kl_estimators(old_logp, ref_logp, str(a.kl_estimator)) * mask
            rewards = per_token_rewards(shaped, kl_t, mask, beta if a.kl_in == "reward" else 0.0)

            # 5. advantage: GAE(γ, λ) with the critic, else A = R − b; whitened
            advantages, returns, advantage_var = self.advantage(rewards, old_values, mask)
            self.assert_finite({"advantage": advantages}, mask)

        # 6. update: ppo_epochs × num_minibatches AdamW steps on the PPO losses
        with timer("update"):
            losses = self.update(qr, old_logp, ref_logp, old_values, advantages, returns, beta)
        for name, w in self.policy.named_parameters():  # a blown-up update (algo.lr too high) stops here,
            if w.requires_grad:                           # not in the next rollout's sampler
                check_finite(f"policy weight {name} after the update", local(w.detach()), step)

        # 7. adapt β from the KL measured in the controller's unit
        measured_kl = self.adapt_beta(kl_t, mask)
        self.ppo_step += 1

        # statistics, x-axis = the PPO step just completed
        self.last_stats = self.step_metrics(
            ro, scores, shaped, kl_t, old_logp, ref_logp, entropy, old_values, returns, advantage_var, losses,
            beta=beta, measured_kl=measured_kl, timer=timer)
        for k in (f"time/{p}_s" for p in StepTimer.PHASES):
            self.phase_totals[k] = self.phase_totals.get(k, 0.0) + self.last_stats[k]
        finite = {k: v for k, v in self.last_stats.items() if math.isfinite(v)}
        active_run.log_metrics(finite, step=self.ppo_step, synchronous=False)  # queued: the step does not wait
        if self.start_entropy is None:
            self.start_entropy = self.last_stats.get("objective/entropy")
        check_divergence(self.last_stats, step, max_kl=a.max_kl, min_entropy=a.min_entropy,
                         max_approxkl=a.max_approxkl, max_entropy_ratio=a.max_entropy_ratio,
                         vocab_size=len(self.tok), start_entropy=self.start_entropy)

    # -- the steps ---------------------------------------------------------------------------------
    def restore_rng(self):
        """After a resume: the sampling RNG as the checkpoint left it (once)."""
        if self._rng_to_restore is not None:
            torch.set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None

    def assert_finite(self, tensors: dict[str, torch.Tensor | None], mask: torch.Tensor | None = None) -> None:
        """Stops the run (FloatingPointError) at the first tensor, in order, with a non-finite value (where
        ``mask`` is 1, if given); ``None`` tensors (no critic) are skipped."""
        for name, x in tensors.items():
            if x is not None:
                check_finite(name, x, self.ppo_step, mask)

    def rollout(self, prompts: list[str]):
        """Step 1: one sampled response per prompt, with the ``generation.*`` settings (``algo.shared_prompt``: a
        prompt's prefill runs once for its samples)."""
        g = self.gen
        with gathered(self.policy):  # trainer=fsdp: each rank samples its prompts with the full policy
            return sample(self.sampler_model(), self.tok, prompts, int(g.max_new_tokens), g.temperature, g.top_k,
                          g.top_p, g.max_prompt_len, sampler=g.sampler,
                          shared_prompts=bool(self.a.shared_prompt))

    def sampler_model(self) -> nn.Module:
        """What step 1 samples from: the policy, or with ``generation.dtype`` its copy in that dtype
        (:class:`~rlhf_lab.models.rollout_copy.RolloutCopy`: built at the first rollout, refreshed before each)."""
        dtype = getattr(self.gen, "dtype", None)
        if dtype is None:
            return self.policy
        if self.rollout_copy is None:
            self.rollout_copy = RolloutCopy(self.policy, dtype)
        return self.rollout_copy.model()

    def score(self, ro) -> torch.Tensor:
        """Step 2: r(x, y) [B] from the scorer (the reward model or the gold reward), on the responses' device; with
        ``algo.shared_prompt`` a reward model scores the responses to one prompt in one pass over their common
        tokens."""
        sharing = getattr(self.scorer, "sharing_prefixes", None) if self.a.shared_prompt else None
        with sharing() if sharing is not None else contextlib.nullcontext():
            return self.scorer(ro.prompts, ro.responses, ro.ended).float().reshape(-1).to(ro.response_mask.device)

    def advantage(self, rewards, values, mask):
        """Step 5: (advantages, returns, Var[A] before whitening). With the critic, GAE(γ, λ) and its returns
        (the value targets); without, A = R − b over the response tokens, R the undiscounted return and b the
        mean baseline (the prompt's group, or the batch) or RLOO's leave-one-out one (returns: zeros)."""
        a = self.a
        if self.critic is not None:
            advantages, returns = gae(rewards, values, mask, a.gamma, a.lam)
        else:
            R = masked_sum(rewards, mask, dim=1)  # undiscounted return of the episode
            if a.advantage_scale == "group_std":  # GRPO: (R − group mean) / (group std + ε)
                advantages = group_advantages(R, self._k).unsqueeze(1) * mask
            else:
                b = leave_one_out_baseline(R, self._k) if a.baseline == "loo" else mean_baseline(R, self._k)
                advantages = reinforce_advantages(R, b, mask)
            returns = torch.zeros_like(advantages)
        advantage_var = masked_var(advantages, mask).item()
        if a.whiten_advantages:
            advantages = masked_whiten(advantages, mask) * mask
        return advantages, returns, advantage_var

    def update(self, qr, old_logp, ref_logp, old_values, advantages, returns, beta: float) -> dict[str, float]:
        """Step 6: ``ppo_epochs`` passes over the batch in ``num_minibatches`` shuffled minibatches, one AdamW step
        each on :meth:`minibatch_loss`; the mean of each loss over them.
        ``qr``: (query ids, query mask, response ids, response mask)."""
        a, opt = self.a, self.optimizers()
        B, n_mb = qr[0].shape[0], a.num_minibatches
        mb = B // n_mb
        acc: dict[str, list[float]] = {}
        for _epoch in range(a.ppo_epochs):
            perm = torch.randperm(B)
            for i in range(n_mb):
                idx = perm[i * mb : (i + 1) * mb]
                loss, st = self.minibatch_loss(qr, idx, old_logp, ref_logp, old_values, advantages, returns, beta)
                self.assert_finite({"loss": loss.detach()})
                opt.zero_grad()
                self.manual_backward(loss)
                if a.max_grad_norm:
                    self.clip_gradients(opt, gradient_clip_val=a.max_grad_norm, gradient_clip_algorithm="norm")
                opt.step()
                for k, v in st.items():
                    acc.setdefault(k, []).append(float(v))
        return {k: sum(v) / len(v) for k, v in acc.items()}

    def minibatch_loss(self, qr, idx, old_logp, ref_logp, old_values, advantages, returns,
                       beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """L = L_clip(ε) + c_v·L_V − c_H·H (+ β·KL with ``kl_in=loss``) on the rows ``idx`` of the batch, and its
        stats (detached). With ``algo.trim_minibatches`` the rows are first cut to their own longest prompt and
        response (:func:`rlhf_lab.models.sampling.trim_padding`): no compute on the rest of the batch's padding,
        the same loss and gradients (every term is masked)."""
        a = self.a
        rows = tuple(x[idx] for x in qr)
        if a.trim_minibatches:
            rows = trim_padding(*rows)
        m = rows[3]
        cut = lambda x: x[idx, : m.shape[1]]  # noqa: E731  the per-token tensors: the same response columns
        logp, ent, values = self.policy_forward(*rows)
        pg_loss, st = ppo_policy_loss(logp, cut(old_logp), cut(advantages), m, a.clip_eps, a.clip_eps_high,
                                      a.loss_agg, self.gen.max_new_tokens)
        loss = pg_loss
        if values is not None:
            vf_loss, vst = ppo_value_loss(values, cut(old_values), cut(returns), m, a.value_clip_eps)
            loss = loss + a.vf_coef * vf_loss
            st = {**st, **vst, "loss/value": vf_loss.detach()}
        ent_mean = masked_mean(ent, m)
        if a.entropy_coef:
            loss = loss - a.entropy_coef * ent_mean
        if a.kl_in == "loss":  # GRPO: β·KL(π_θ‖π_ref) on the current policy, per token
            kl_loss = aggregate_loss(kl_estimators(logp, cut(ref_logp), str(a.kl_estimator)), m, a.loss_agg,
                                     self.gen.max_new_tokens)
            loss = loss + beta * kl_loss
            st["loss/kl"] = kl_loss.detach()
        return loss, {**st, "loss/policy": pg_loss.detach(), "loss/total": loss.detach(),
                      "policy/entropy": ent_mean.detach()}

    def adapt_beta(self, kl_t, mask) -> float:
        """Step 7: the KL controller sees the KL measured in ``kl.unit`` (per-response sum or per-token mean),
        averaged over ranks so that every rank keeps the same β; returns that measured KL."""
        kl_seq = masked_sum(kl_t, mask, dim=1)
        measured_kl = kl_seq.mean().item() if self.kl_settings.unit == "sequence" else masked_mean(kl_t, mask).item()
        measured_kl = distributed.all_reduce_mean({"kl": measured_kl})["kl"]  # one β on every rank
        self.kl_ctl.update(measured_kl, n_steps=kl_t.shape[0] * self._world)
        return measured_kl

    def step_metrics(self, ro, scores, shaped, kl_t, old_logp, ref_logp, entropy, old_values, returns,
                     advantage_var: float, losses: dict[str, float], *, beta: float, measured_kl: float,
                     timer: StepTimer) -> dict[str, float]:
        """The step's statistics (names: the module docstring), averaged over ranks; NaNs dropped except the
        explained variance's."""
        dt = timer.elapsed()
        mask, texts = ro.response_mask, ro.responses
        lengths = mask.sum(1).float()
        not_ended = torch.tensor([0.0 if e else 1.0 for e in ro.ended], device=mask.device)
        kl_seq = masked_sum(kl_t, mask, dim=1)
        per_seq = {k: masked_sum(kl_estimators(old_logp, ref_logp, k), mask, dim=1).mean().item() for k in KLEstimator}
        non_score, rlhf_reward = rlhf_reward_terms(shaped, kl_seq, beta, str(self.a.kl_in))
        stats = {
            "objective/scores": scores.mean().item(),
            "objective/scores_shaped": shaped.mean().item(),
            "objective/kl": kl_seq.mean().item(),
            "objective/kl_token": masked_mean(kl_t, mask).item(),
            **{f"objective/kl_{k}": v for k, v in per_seq.items()},
            "objective/kl_measured": measured_kl,
            "objective/beta": beta,
            "objective/non_score_reward": non_score.mean().item(),
            "objective/rlhf_reward": rlhf_reward.mean().item(),
            "objective/entropy": masked_mean(entropy, mask).item(),
            "objective/length": lengths.mean().item(),
            "objective/eos_rate": 1.0 - not_ended.mean().item(),
            "objective/filler_rate": filler_rate(texts),
            "objective/distinct_1": distinct_n(texts, 1),
            "objective/distinct_2": distinct_n(texts, 2),
            "objective/unique_rate": unique_rate(texts),
            "objective/advantage_var": advantage_var,
            **losses,
            "time/step_s": dt,
            **{f"time/{p}_s": timer.seconds[p] for p in StepTimer.PHASES},
            "time/tokens_per_s": lengths.sum().item() / max(dt, 1e-9),
        }
        if self.gold is not None:
            stats["objective/gold"] = float(self.gold(ro.prompts, texts, ro.ended).float().mean())
        if self.formula_gold is not None:
            stats["objective/formula_gold"] = float(self.formula_gold(ro.prompts, texts, ro.ended).float().mean())
        if self._k > 1:  # the groups of samples per prompt (GRPO, RLOO)
            stats.update(group_stats(shaped, self._k))
        if self.critic is not None:
            stats["val/explained_variance"] = explained_variance(old_values, returns, mask)
            stats["val/mean"] = masked_mean(old_values, mask).item()
        stats = distributed.all_reduce_mean(stats)  # the mean over ranks (the same keys on every rank)
        return {k: v for k, v in stats.items() if v == v or k == "val/explained_variance"}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        every = int(self.a.checkpoint_every or 0)
        if every and self.checkpoint_dir and self.ppo_step % every == 0:
            self.trainer.save_checkpoint(str(Path(self.checkpoint_dir) / f"ppo_step{self.ppo_step:05d}.ckpt"))

    # -- β, controller state and each rank's sampling RNG travel with the Lightning checkpoint ---------
    def on_save_checkpoint(self, checkpoint):
        # plain values only: a resume reads it with torch.load(weights_only=True), which refuses the lab's classes
        checkpoint["ppo"] = {"kl_controller": self.kl_ctl.state_dict(), "kl": str(self.kl_settings.name),
                             "ppo_step": self.ppo_step, "torch_rng": distributed.gather_objects(torch.get_rng_state())}

    def on_load_checkpoint(self, checkpoint):
        st = checkpoint.get("ppo")
        if st is None:
            raise ValueError("this Lightning checkpoint was not written by PPO (no 'ppo' state)")
        if st["kl"] != self.kl_settings.name:
            raise ValueError(f"checkpoint has a {st['kl']} KL controller but kl={self.kl_settings.name}")
        self.kl_ctl.load_state_dict(st["kl_controller"])
        self.ppo_step = int(st["ppo_step"])
        self._rng_to_restore = distributed.own(st["torch_rng"], "the checkpoint's sampling RNG (one per rank)")
