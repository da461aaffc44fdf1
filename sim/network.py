"""Message-level network model (HACO App. C.2.1, spec §8).

One transmission of ``M`` bytes over a link with base latency μ (ms), jitter σ (ms),
bandwidth B (tokens/ms) and loss p:

- T_tx = M / (bytes_per_token · B) ms;
- T_path = max(T_min(μ), μ + ξ), ξ ~ N(0, σ²), T_min(μ) = t_min_factor · μ;
- with probability p the message is lost and costs T_timeout; else t_net = T_tx + T_path.

Randomness comes only from the generator passed in, two draws per transmission in a
fixed order, so a seed fixes every outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from schemas.models import ZoneLink
from schemas.scenario import LinkChange, NetworkSpec


@dataclass(frozen=True, slots=True)
class LinkState:
    latency_ms: float
    jitter_ms: float
    bandwidth_tokens_per_ms: float
    loss: float

    @classmethod
    def from_link(cls, link: ZoneLink) -> LinkState:
        return cls(link.latency_ms, link.jitter_ms, link.bandwidth_tokens_per_ms, link.loss)

    def changed(self, change: LinkChange) -> LinkState:
        updates = {
            name: getattr(change, name)
            for name in ("latency_ms", "jitter_ms", "bandwidth_tokens_per_ms", "loss")
            if getattr(change, name) is not None
        }
        return replace(self, **updates)


@dataclass(frozen=True, slots=True)
class Transmission:
    bytes: float
    lost: bool
    t_net_s: float  # what the transmission cost: T_tx + T_path, or T_timeout when lost
    t_tx_s: float  # the transfer part M / bandwidth (0 when lost)
    t_path_s: float  # the path-delay part (an RTT-like observation); timeout when lost


def transmit(
    link: LinkState, nbytes: float, net: NetworkSpec, rng: np.random.Generator, lossy: bool = True
) -> Transmission:
    u = rng.random()
    xi = rng.standard_normal() * link.jitter_ms
    if lossy and u < link.loss:
        return Transmission(nbytes, True, net.timeout_s, 0.0, net.timeout_s)
    t_tx_ms = nbytes / (net.bytes_per_token * link.bandwidth_tokens_per_ms)
    t_path_ms = max(net.t_min_factor * link.latency_ms, link.latency_ms + xi)
    return Transmission(
        nbytes, False, (t_tx_ms + t_path_ms) / 1000.0, t_tx_ms / 1000.0, t_path_ms / 1000.0
    )
