"""The ``sakura`` policy (a receding-horizon plan over the remaining (step, layer) shards, :mod:`.planner`) and the
``oracle`` (the same policy with exact transfer times from the trace)."""

from __future__ import annotations

import numpy as np

from .base import LEVEL_COMPUTE, Decision, Policy, _at
from .context import Context
from .ladder import feeds_twin
from .planner import Plan, Snapshot, best_plan, track_priced
from .probe import probe_shard
from .reroot import chain_of

__all__ = ["Oracle", "Sakura"]


class Sakura(Policy):
    """Receding-horizon plan over the remaining (step, layer) shards (:mod:`sakura_core.policy.planner`).

    * Plan: at every decision, the split k_s of every remaining step (template through layers < k_s on the device,
      shards >= k_s fetched back to back in execution order at the floor level, later steps prefetched) with the
      earliest predicted finish, under the harmonic mean of recent throughput samples (``plan_estimate`` may pick
      RobustMPC's error-discounted one instead: harmonic mean / (1 + max recent error)); re-planned as transfers
      complete, so an estimation error is corrected at the next decision. Long edits: where the open-loop floor
      costs more than ``planner.TRACK_RATIO`` (4) times the closed-loop twins (28 / 50 steps on the serving store),
      plans are priced on the twins' track (a layer the device computes costs its later steps the open-loop floor)
      and one split held for every step (the held-split family) competes with the cuts. Where the runtime fetches
      re-root chains (``Context.reroots``: the simulator and the live lanes), a layer off its track is priced and
      fetched back on it by its chain from the last step requested or step 0 (``reroot_chain``, :mod:`.reroot`).
    * Probe: with no throughput sample yet the first shard is fetched at the floor level (free: compute keeps the
      template until a shard is ready); per-step KV, the next step's first shard with bytes (``_probe_skips``).
    * Fetch lane: a shard below its step's planned split is deferred ("not now": the runtime asks again before later
      shards and while the link would idle, until the compute lane reaches it — so a link that turns out faster
      moves the split earlier); otherwise the quality floor, or under a latency target the highest level that
      keeps the predicted finish under it. A step ``later_first_from`` or more steps ahead of the compute lane
      fetches its planned layers last first (a shard waits while a later one of its step that the plan needs is
      not requested yet): a step's fetched layers are always a suffix, so a plan that later moves the step's split
      up still uses every one (fetched in order, the lowest planned layers go first and are the ones a slower link
      strands).
    * Compute lane: drop the template at this layer only if the plan made with the slowest recent throughput drops
      here (a wrong drop costs a stall; the template restarts next step, so the risk is one step).
    * Late shards: once dropped, if waiting is predicted to end the step later than the template pass on the
      device, run that pass (the link misled the estimate). The pass resumes where the step dropped the template
      tokens (their hidden state is kept), so it costs about what fetching nothing would have from there. It waits
      ``late_patience`` of that pass for the shard first (ski rental: short outages end by themselves; the drop's
      outage check counts it), but never past the edit's waiting allowance, ``stall_budget`` of the fetch-nothing
      latency in all (after that, waiting only while it is predicted sooner; past what the pass itself costs, only
      while bytes still arrive, predicted at the rate they arrive now: the prediction of a stuck transfer that had
      most of its bytes reads "almost done" at any average rate for as long as the link stays dead).
    * Upgrades: once every shard the plan needs is requested, idle link time refines shards not used yet with the
      largest distortion drop per byte.
    """

    name = "sakura"
    # the estimate the fetch plan uses: "robust" (harmonic mean / (1 + max recent error)) or "harmonic"
    plan_estimate = "harmonic"
    # a drop must not lose against keeping the template even if the link is this many times slower than the
    # slowest recent sample. 1.0 and not more: a larger factor keeps the template for several layers of step 0 on
    # fast links while a few early samples were slow, and the outage check below already insures a drop against the
    # link dying (the comparison over traces: `sakura bench e2e`)
    regret_slowdown = 1.0
    # wait this fraction of a template pass for a late shard before a template pass may replace it
    late_patience = 0.25
    # the edit's waiting allowance: patience for late shards ends once the edit has waited this fraction of the
    # fetch-nothing latency (the guard: an edit never more than 2 % slower than fetching nothing)
    stall_budget = 0.015
    # past the waiting allowance, where an overrun would make the edit slower than fetching nothing, a late shard is
    # waited on only while predicted within this fraction of the fallback pass: 0.5, so a wait predicted on a link
    # that then halves still ends within the pass
    late_margin = 0.5
    # a step this many steps or more ahead of the compute lane fetches its planned layers last first: 2 (the next
    # step keeps execution order, so its drop can start before its last shards arrive); chosen on the synthetic
    # slow-link set (`sakura traces synth --set slow`, `sakura bench slow-links`)
    later_first_from = 2

    def reset(self) -> None:
        self._plan: Plan | None = None
        self._late_since: dict[int, float] = {}
        self._last_progress: tuple | None = None  # (now, bytes received, requested at, rate since the ask before)
        self._cache: tuple | None = None
        self._why_cache: tuple[Plan, float | None, str] | None = None  # (plan, rate, its words): _why

    def rate(self, ctx: Context) -> float | None:
        """Bytes/s the predictions use (None = exact transfer times from the trace): the estimate ``plan_estimate``
        names, lowered while the transfer in progress is overdue."""
        est = ctx.estimator.harmonic() if self.plan_estimate == "harmonic" else ctx.estimator.robust()
        return ctx.slowed(est)

    def drop_rate(self, ctx: Context) -> float | None:
        """Dropping the template is irreversible within a step: decide it on the slowest recent throughput."""
        return ctx.slowed(ctx.estimator.worst())

    @staticmethod
    def snapshot(ctx: Context, rate: float | None, fetch_from: int | None = None) -> Snapshot:
        """The planner's snapshot at ``rate``: on an estimated rate priced on the twins' track where the long-edit
        rule holds (:func:`~sakura_core.policy.planner.track_priced`); the exact-transfer search (the oracle's, rate
        None) as before."""
        return Snapshot(ctx, rate, fetch_from, track=rate is not None and track_priced(ctx))

    def _replan(self, ctx: Context, rate: float | None) -> tuple[Plan, Snapshot]:
        """The plan (and the snapshot it was made on) for this moment; reused while the moment is the same (a batch
        of decisions at one time: the runtime asks about several deferred shards at once)."""
        key = (ctx.now, ctx.compute_layer, ctx.template_alive, rate, ctx.decided_upto, ctx.link_busy_until())
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        snap = self.snapshot(ctx, rate)
        init = None
        prev = getattr(self, "_plan", None)
        if prev is not None and prev.first_step <= snap.cs < prev.first_step + len(prev.splits):
            init = prev.splits[snap.cs - prev.first_step :]
        plan = best_plan(snap, init)
        self._plan, self._cache, self._why_cache = plan, (key, plan, snap), None
        return plan, snap

    def _why(self, ctx: Context, plan: Plan, rate: float | None) -> str:
        """The plan in words (made once per plan: a batch of decisions shares it). Runs of steps with the same split
        are said once."""
        cached = getattr(self, "_why_cache", None)
        if cached is not None and cached[0] is plan and cached[1] == rate:
            return cached[2]
        L, parts, i = ctx.layers_per_step, [], 0
        while i < len(plan.splits):
            k, j = plan.splits[i], i
            while j + 1 < len(plan.splits) and plan.splits[j + 1] == k:
                j += 1
            what = f"split at layer {k}" if k < L else "no split: the device computes all"
            first, last = plan.first_step + i, plan.first_step + j
            steps = f"step {first}" if i == j else f"steps {first}-{last}"
            parts.append(f"{steps} {what}" if ctx.per_step else what)
            i = j + 1
        why = f"plan: {'; '.join(parts)}; predicted finish t={plan.finish_s:.2f} s {_at(ctx, rate)}"
        self._why_cache = (plan, rate, why)
        return why

    def worth_asking(self, ctx: Context, shards: list[int]) -> list[int]:
        """The deferred shards at or above their step's planned split (``choose`` defers the others again)."""
        rate = self.rate(ctx)
        if rate is not None and ctx.estimator.samples == 0:
            return shards  # the probe answers without a plan
        plan, snap = self._replan(ctx, rate)
        g = np.asarray(shards, dtype=int)
        step, k = snap.step[g], np.asarray(plan.splits)[snap.step[g] - plan.first_step]
        if not ctx.template_alive:
            k = np.where(step == snap.cs, snap.l0, k)
        keep = g[(g < ctx.compute_layer) | (snap.layer[g] >= k)].tolist()
        return [x for x in keep if not self._later_first(ctx, snap, plan, x)]

    def choose(self, ctx: Context, layer: int) -> Decision:
        rate = self.rate(ctx)
        ladder = ctx.ladder(layer)
        if rate is not None and ctx.estimator.samples == 0:
            if self._probe_skips(ctx, layer):
                return Decision(
                    LEVEL_COMPUTE,
                    f"step {ctx.step_of(layer)} layer {ctx.layer_of(layer)} waits for the "
                    "bandwidth probe (a shard of the next step: this step's cannot beat the compute "
                    "lane without a sample)",
                    defer=True,
                )
            fl = ctx.floor_of(layer)
            return Decision(fl, f"bandwidth probe (no throughput sample yet): floor level {ladder[fl].name}")
        if layer < ctx.compute_layer:
            return Decision(LEVEL_COMPUTE, f"compute is already past shard {layer}")
        plan, snap = self._replan(ctx, rate)
        step, lay = ctx.step_of(layer), ctx.layer_of(layer)
        k = plan.split(step) if (step > snap.cs or ctx.template_alive) else snap.l0
        why = self._why(ctx, plan, rate)
        if lay < k:  # not now: asked again (before later shards, and while the link would idle) until compute is here
            return Decision(
                LEVEL_COMPUTE,
                f"device computes step {step} layer {lay} for now, asked again until the "
                f"compute lane reaches it ({why})",
                defer=True,
            )
        if self._later_first(ctx, snap, plan, layer):
            return Decision(
                LEVEL_COMPUTE,
                f"later layers of step {step} first: layer {lay} waits until the step's "
                f"later planned layers are requested (the step is {step - snap.cs} steps ahead; {why})",
                defer=True,
            )
        best = self._level_under_target(ctx, layer, plan, rate)
        if best == ctx.floor_of(layer):
            return Decision(
                best,
                f"step {step} layer {lay}: level {ladder[best].name} (the quality floor; idle link "
                f"time refines it later); {why}",
            )
        slack = f"slack under the {ctx.latency_target_s:.2f} s target"
        return Decision(best, f"step {step} layer {lay}: level {ladder[best].name} ({slack}); {why}")

    def reroot_chain(self, ctx: Context, layer: int) -> list[int]:
        """Under the long-edit rule, on an estimated rate: the chain that puts shard ``layer``'s layer back on its
        twins' track (:func:`~sakura_core.policy.reroot.chain_of`: where it and the twin cost less than the
        open-loop floor); the exact-transfer search (the oracle's) keeps its plans as they were."""
        if not ctx.reroots or self.rate(ctx) is None or not track_priced(ctx):
            return []
        return chain_of(ctx, layer, ~np.isnan(ctx.known_ready_array()))

    def _later_first(self, ctx: Context, snap: Snapshot, plan: Plan, layer: int) -> bool:
        """Per-step KV: shard ``layer`` at or above its step's planned split, its step ``later_first_from`` or more
        steps ahead of the compute lane, waits while a later layer of its step with bytes is not requested yet."""
        step = ctx.step_of(layer)
        if not ctx.per_step or step < snap.cs + self.later_first_from or layer < ctx.compute_layer:
            return False
        if ctx.layer_of(layer) < plan.split(step):
            return False
        end = (step + 1) * ctx.layers_per_step
        later = np.isnan(snap.known[layer + 1 : end]) & ~ctx.floor_reuses()[layer + 1 : end]
        return bool(later.any())

    @staticmethod
    def _probe_skips(ctx: Context, layer: int) -> bool:
        """Per-step KV: the probe is not the first shard of the step the compute lane is in while its template is
        alive. That shard is what the compute lane starts on at once (the template kept: a per-step shard serves its
        own step only, so that fetch was wasted bytes). The next step's first shard with bytes is the probe, a
        cross-step residual too where it costs no more than the running step's last shard (``probe.probe_shard``):
        its reference, the running step's same layer, is the one the compute lane computes now (the residual's
        decode waits for the device's KV of it; its transfer does not), so a twins'-track floor is fetched at its
        open-loop floor. Step 0's shards cost 2-4x a later step's residuals (klein at 4 steps: 5 MB against 1.3-3
        MB), and on slow links (3G-like, phone CPU) the plan seldom uses the running step's last shard, so that
        probe spent tens of seconds of link time on a shard no plan wanted (the comparison on synthetic slow links:
        ``sakura bench slow-links``, docs/results.md); on long edits the open-loop floor costs 25-31x the twins and
        the running step's last shard stays the probe. Nothing is skipped when no other shard has bytes to
        sample."""
        if not ctx.per_step or not ctx.template_alive:
            return False
        step, L = ctx.step_of(layer), ctx.layers_per_step
        if step != ctx.step_of(ctx.compute_layer):
            return False
        return layer != probe_shard(ctx, step * L, L)

    def _level_under_target(self, ctx: Context, layer: int, plan: Plan, rate: float | None) -> int:
        """The highest level that keeps the predicted finish under the user's latency target, at the estimate and at
        the slowest recent rate; the floor without a target. (Taking more than the floor because the link looks
        idle now spends the margin a later slowdown needs; quality beyond the floor comes from upgrades once every
        shard the plan needs is on its way.)"""
        target = ctx.latency_target_s
        if target is None or target <= plan.finish_s:
            return ctx.floor_of(layer)
        snap = self.snapshot(ctx, rate, layer)  # with this shard as the next one fetched (its level is the question)
        worst = self.drop_rate(ctx)
        slow = self.snapshot(ctx, worst, layer) if worst is not None and worst != rate else None
        ladder, allowed = ctx.ladder(layer), ctx.levels_from_floor(layer)
        best = allowed[0]
        for idx in allowed[1:]:
            lv = ladder[idx]
            if snap.finish(plan.splits, lv.expected_nbytes, lv.decode_s) > target:
                break
            if slow is not None and slow.finish(plan.splits, lv.expected_nbytes, lv.decode_s) > target:
                break
            best = idx
        return best

    def keep_template(self, ctx: Context, layer: int) -> bool:
        rate = self.drop_rate(ctx)
        if rate is not None and self._drop_cannot_pay(ctx, layer, rate):
            return True  # no plan needed (a plan costs ms: as much as a layer of a small model)
        plan, snap = self._replan(ctx, rate)
        if plan.splits[0] != ctx.layer_of(layer):
            return True
        if rate is None:
            return False
        # bounded regret: drop only if this step still ends no later than keeping the template to its end even
        # when the link delivers 1/regret_slowdown of the slowest recent rate (that estimation error costs nothing)
        p, left = ctx.profile, ctx.layers_per_step - snap.l0
        keep_all = snap.ct + left * p.layer_full_s
        drop_end = snap.finish(plan.splits, upto_step=snap.cs)
        if self.snapshot(ctx, rate / self.regret_slowdown).finish(plan.splits, upto_step=snap.cs) > keep_all:
            return True
        # outage: if the link died now, a template pass on the device would redo this step's KV; the drop must
        # gain at least what it would then lose (unless every shard it needs is decoded already)
        reuse = ctx.floor_reuses()  # a reuse rung needs no link: an outage cannot hold it up
        needed = range(layer, snap.c - snap.l0 + ctx.layers_per_step)
        if all(ctx.ready(g) or reuse[g] for g in needed):
            return False
        resume = ctx.resume_pass_s(ctx.layer_of(layer))
        outage_loss = snap.ct + (1 + self.late_patience) * resume + left * p.layer_cached_s - keep_all
        return keep_all - drop_end < outage_loss

    @staticmethod
    def _drop_cannot_pay(ctx: Context, layer: int, rate: float) -> bool:
        """A drop here gains at most the template work left in this step, (L - l) x (full - cached layer); if this
        layer's shard cannot be decoded within that (at ``rate``, behind the transfers already requested), keeping
        the template finishes no later, whatever the plan (a plan would keep it too)."""
        p = ctx.profile
        gain = (ctx.layers_per_step - ctx.layer_of(layer)) * (p.layer_full_s - p.layer_cached_s)
        ready = ctx.known_ready(layer)
        if ready is None:
            lv = ctx.ladder(layer)[ctx.floor_of(layer)]
            start = max(ctx.now, ctx.link_busy_until()) if lv.reuse else ctx.first_byte_t()
            ready = start + lv.nbytes / rate + lv.decode_s
        return ready - max(ctx.compute_t, ctx.now) > gain

    def recompute_late(self, ctx: Context, layer: int) -> bool:
        since = self._late_since.setdefault(layer, ctx.now)
        recent = self._recent_rate(ctx)  # at every ask: the rate is over the time since the previous one
        resume = ctx.resume_pass_s()  # the template pass resumes where this step's template was dropped
        # patience, but never past the edit's waiting allowance: giving up later than that could not keep the edit
        # within stall_budget of fetching nothing any more (the resumed pass costs what fetching nothing would)
        allowance = self.stall_budget * ctx.fetch_nothing_s - ctx.stalled_s
        # the runtime asks again one cached-layer time later: the last ask inside the allowance is where it ends
        # (waiting on to the next ask would overshoot it by up to a poll)
        poll = ctx.profile.layer_cached_s
        patience = min(self.late_patience * resume, max(ctx.now - since + allowance - poll, 0.0))
        if ctx.now - since < patience:
            return False
        rate = self.rate(ctx)
        if rate is not None and ctx.now - since >= resume:
            # ski rental: waited as long as the pass costs; wait on only while bytes still arrive, predicted at the
            # rate they arrive now (a transfer stuck with most of its bytes reads "almost done" at any average
            # rate: a dead link then costs at most about twice the pass; a slow live one is waited on, as its
            # bytes say when it ends)
            if not recent:
                return True
            rate = min(rate, recent)
        snap = self.snapshot(ctx, rate)
        wait = snap.finish([snap.l0] * (snap.S - snap.cs), upto_step=snap.cs)
        recompute = ctx.now + resume + (ctx.layers_per_step - ctx.layer_of(layer)) * ctx.profile.layer_cached_s
        if rate is not None and patience < self.late_patience * resume:
            # past the allowance a wait that overruns its prediction breaks the guard, where the edit has no lead
            # over fetching nothing to absorb it: there the wait must be predicted to take at most late_margin of
            # what the pass takes (a wait predicted on a link that then halves still ends within the pass). The
            # prediction slips ask by ask on a link that slowed after the drop (each ask: "a few seconds more")
            overrun = (wait - ctx.now) * (1.0 / self.late_margin - 1.0)
            edit_end = snap.finish([snap.l0] * (snap.S - snap.cs))
            if edit_end + overrun > (1.0 + self.stall_budget) * ctx.fetch_nothing_s:
                return recompute - ctx.now < (wait - ctx.now) / self.late_margin
        return recompute < wait

    def _recent_rate(self, ctx: Context) -> float | None:
        """Bytes/s the transfer in progress received since the previous ask (the runtime asks about a late shard
        every cached-layer time; asks at one moment share the answer); its average at the first ask about it;
        None without a report of it or at the first ask."""
        prog, last = ctx.link_progress(), self._last_progress
        if last is not None and ctx.now == last[0]:
            return last[3]
        recent = None
        if prog is not None and last is not None:
            if abs((ctx.now - prog[0]) - last[2]) > 1e-6 or prog[1] < last[1]:  # another transfer since
                recent = prog[1] / max(prog[0] - ctx.rtt_s, 1e-3)
            else:
                recent = (prog[1] - last[1]) / (ctx.now - last[0])
        self._last_progress = None if prog is None else (ctx.now, prog[1], ctx.now - prog[0], recent)
        return recent

    def upgrade(self, ctx: Context) -> tuple[int, int] | None:
        if ctx.per_step:  # never ahead of a shard the plan still needs
            plan, snap = self._replan(ctx, self.rate(ctx))
            if snap.pending(plan.splits):
                return None
        best, best_gain = None, 0.0
        fetched = ctx.fetched_levels()
        per_step, used, L, n = ctx.per_step, ctx.compute_layer, ctx.layers_per_step, ctx.num_layers  # read once
        for shard, level in fetched.items():
            if per_step and shard <= used:
                continue  # used already (per-step KV serves one step only)
            nxt = shard + L
            if per_step and nxt < n and nxt not in fetched and feeds_twin(ctx.ladder(shard), level, ctx.ladder(nxt)):
                continue  # the next step's twin is coded against this level: an upgrade would leave the track
            ladder = ctx.ladder(shard)
            if level + 1 < len(ladder) and ladder[level + 1].progressive:
                gain = (ladder[level].mse - ladder[level + 1].mse) / max(ladder[level + 1].increment_bytes, 1)
                if gain > best_gain:
                    best, best_gain = (shard, level + 1), gain
        return best


class Oracle(Sakura):
    """Knows the future: transfer times come from the trace itself (ready times are exact, not estimated). On a live
    link without a trace there is no future to know: it plans on the estimator's rates, as ``sakura`` does.

    The simulator additionally searches the per-step split vector with exact timings and keeps the best run, so
    the oracle is a lower bound over this policy space.
    """

    name = "oracle"

    def rate(self, ctx: Context) -> float | None:
        # None = exact transfer times from the trace; a live link without one has no future to know: the estimate
        return None if ctx.has_trace else super().rate(ctx)

    def drop_rate(self, ctx: Context) -> float | None:
        return None if ctx.has_trace else super().drop_rate(ctx)
