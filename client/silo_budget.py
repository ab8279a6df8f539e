"""A silo's own differential-privacy budget under local DP: the releases of its data it actually made,
counted from its own ledger, never from what the server declares (docs/algorithms.md "Differential
privacy").

Under ``dp = local`` each train reply is the silo's update clipped to ``||x|| <= S`` plus
N(0, (z S)^2 I), noised on the silo: one Gaussian release at noise multiplier z of its data
(add/remove of the silo's whole contribution changes the update by at most S). The ledger
(client/ledger.py) records z with every such reply before it leaves; the silo's epsilon at
``delta`` composes every release with Rényi DP (Mironov 2017; dp-accounting's accountant, RDP
alpha / (2 z^2) per release), with no amplification by sampling (the silo knows it was asked).
Its policy (client/silo_policy.py) bounds it per run (``max-epsilon``) and over every run the silo
served (``lifetime-epsilon``), and refuses the release that would exceed either; ``hetfed
federation ledger`` prints both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

RELEASE = "dp-release"  # the ledger entry's key: the release's noise multiplier z
DEFAULT_DELTA = 1e-5


def release_of(config: Mapping[str, Any]) -> float | None:
    """z of the local-DP release a train message asks (``dp-local-noise`` with a ``dp-clip``), else None."""
    z, clip = config.get("dp-local-noise", 0.0), config.get("dp-clip", 0.0)
    if isinstance(z, int | float) and isinstance(clip, int | float) and z > 0 and clip > 0:
        return float(z)
    return None


def releases(entries: Iterable[Mapping[str, Any]], run_id: str | None = None) -> list[float]:
    """The noise multipliers of the releases a ledger records (of run ``run_id``, or of every run)."""
    return [float(e[RELEASE]) for e in entries if RELEASE in e and run_id in (None, str(e.get("run-id")))]


def epsilon(multipliers: Iterable[float], delta: float = DEFAULT_DELTA) -> float:
    """epsilon at ``delta`` after Gaussian releases at these noise multipliers (RDP composition)."""
    from dp_accounting import GaussianDpEvent
    from dp_accounting.rdp import RdpAccountant

    counts = Counter(multipliers)
    if not counts:
        return 0.0
    accountant = RdpAccountant()
    for z, count in counts.items():
        accountant.compose(GaussianDpEvent(z), count)
    return float(accountant.get_epsilon(delta))
