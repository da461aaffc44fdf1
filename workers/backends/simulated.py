"""The simulator's candidates, served in real time inside workers.

A call is drawn exactly as in the discrete-event simulator (:mod:`sim.candidates`)
and then lived through: the worker waits ``total_s × time_scale`` in slices of
``poll_s``, asking between slices whether the group was cancelled (with the cancel
watcher's stop check: one wait, which a cancel interrupts). Zone faults injected
by an operator (``haco:sim:faults``) override link loss, for outage drills.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from schemas.enums import FailureKind
from schemas.models import Candidate, MemberTask
from schemas.scenario import Scenario
from sim.candidates import CallDraw, link_observations, simulate_call
from sim.network import LinkState
from sim.world import SimWorld
from workers.backends.base import BackendResult, StopCheck, WaitableStop

FaultReader = Callable[[], Mapping[str, float]]  # zone -> forced link loss


def _no_faults() -> Mapping[str, float]:
    return {}


class SimBackend:
    def __init__(
        self,
        scenario: Scenario,
        time_scale: float,
        poll_s: float,
        faults: FaultReader = _no_faults,
        wait: Callable[[float], object] | None = None,
        commit_effect: Callable[[MemberTask], None] | None = None,
    ) -> None:
        self.world = SimWorld(scenario)
        self.time_scale = time_scale
        self.poll_s = poll_s
        self.faults = faults
        # Waiting on an Event (never set) is an interruptible, injectable sleep.
        self._injected_wait = wait is not None
        self._wait = wait or threading.Event().wait
        self._commit = commit_effect
        self._lock = threading.Lock()
        # Unseeded members draw from one generator per backend: a fresh OS-seeded
        # generator per call reads the kernel's entropy twice per member (~0.1 ms each
        # on a VM), more than the rest of the draw.
        self._shared = np.random.default_rng()

    def _draw(self, task: MemberTask) -> CallDraw:
        request_bytes = len("".join(m.content for m in task.payload).encode()) + 200
        cand = self._as_sim(task.candidate)
        with self._lock:
            rng = self._rng(task.sim_seed)
            forced = self.faults().get(cand.zone)
            link = self.world.link_to(cand.zone)
            if forced is not None:
                link = LinkState(
                    link.latency_ms, link.jitter_ms, link.bandwidth_tokens_per_ms, forced
                )
            return self._call(cand, link, request_bytes, rng)

    def _rng(self, seed: int | None) -> np.random.Generator:
        """A seeded member's own generator (its draw is fixed), else the shared one (call
        with the lock held)."""
        return self._shared if seed is None else np.random.default_rng(seed)

    def _call(
        self, cand: Candidate, link: LinkState, request_bytes: float, rng: np.random.Generator
    ) -> CallDraw:
        return simulate_call(
            self.world.models[self.world.model_of[cand.id]],
            self.world.failure_rate[cand.id],
            link,
            request_bytes,
            self.world.scenario.network,
            rng,
        )

    def _as_sim(self, cand: Candidate) -> Candidate:
        ref = str(cand.backend.settings.get("candidate", cand.id))
        if ref not in self.world.model_of:
            self.world.register(cand)
            return cand
        return cand.model_copy(update={"id": ref})

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        draw = self._draw(task)
        if self._sleep_cancellable(draw.total_s * self.time_scale, should_stop):
            return BackendResult(FailureKind.CANCELLED, "cancelled while running")
        return self._result(task, draw)

    def _sleep_cancellable(self, total_s: float, should_stop: StopCheck) -> bool:
        end = time.monotonic() + total_s
        while True:
            if should_stop():
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._pause(left, should_stop)

    def _pause(self, left: float, should_stop: StopCheck) -> None:
        """Sleep until the end or, with the cancel watcher's stop check, until a cancel
        wakes it (no polling); else, or with an injected wait, a ``poll_s`` slice."""
        if isinstance(should_stop, WaitableStop) and not self._injected_wait:
            should_stop.wait(left)
        else:
            self._wait(min(left, self.poll_s))

    def _result(self, task: MemberTask, draw: CallDraw) -> BackendResult:
        links = link_observations(draw, time.time(), self.world.scenario.network)
        delivered = not draw.request.lost
        rtt = draw.request.t_path_s if delivered else None
        bw = draw.request.bytes / draw.request.t_tx_s if delivered and draw.request.t_tx_s else None
        base = BackendResult(
            failure=draw.failure,
            tokens_in=draw.tokens_in,
            tokens_out=draw.tokens_out,
            proc_latency_s=draw.proc_latency_s,
            bytes_sent=int(draw.request.bytes),
            rtt_s=rtt,
            bandwidth_Bps=bw,
            lost=draw.request.lost or (draw.response is not None and draw.response.lost),
            delivered=delivered,
            link_observations=links,
        )
        if draw.failure is FailureKind.NETWORK:
            return replace(base, reason="message lost on the link")
        if draw.failure is not None:
            return replace(base, reason="the service failed")
        quality = self._judge(draw.quality or 0.0, task.sim_seed)
        text = f"[{task.candidate.model}@{task.candidate.zone}] {task.candidate.role} output"
        return replace(base, output=text, quality=quality)

    def _judge(self, true_quality: float, seed: int | None) -> float:
        with self._lock:
            z = self._rng(seed).standard_normal()
        noise = self.world.judge_noise() * z
        q = true_quality + noise
        return 0.0 if q < 0 else min(1.0, q) if math.isfinite(q) else 0.0

    def commit(self, task: MemberTask) -> None:
        if self._commit is not None:
            self._commit(task)
