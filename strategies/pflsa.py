"""PF-LSA: personalized federated LSA (docs/algorithms.md section 3; Labbi, Mangold, Moulines 2026).

Every agent keeps its own parameter theta_c on its node; the server only ever sees and
averages *updates*. One exchange per iteration, pipelined: the message of iteration t
carries ``g_bar^{t-1} = (1/N) sum_c g_c^{t-1}``; client c applies

    theta_c <- theta_c - eta beta g_c^{t-1} - eta (1 - beta) g_bar^{t-1}

with its stored ``g_c^{t-1}``, then replies ``g_c^t = A_c(Z_c^t) theta_c - b_c(Z_c^t)``. The
evaluate exchange after the last round carries ``g_bar^T`` and completes iteration T.
For any beta > 0 each theta_c converges to its own ``theta_c* = A_bar_c^{-1} b_bar_c``;
``pflsa-beta = 0`` selects the recommended beta = 1/N.
"""

from __future__ import annotations

from flwr.app import ConfigRecord

from hetfed.methods.lsa import PFLSAParams
from hetfed.params import ConfigError
from hetfed.strategies.lsa import LSAStrategy


class PFLSA(LSAStrategy):
    """Server of PF-LSA: averages the agents' updates g_c into g_bar (see the module docs)."""

    broadcast_key = "g-bar"
    reply_key = "g"
    client_handler = "lsa-mixing"

    params_type = PFLSAParams
    params: PFLSAParams

    def check_params(self) -> None:
        """PF-LSA exchanges every iteration: one local step per round."""
        if self.params.local_steps != 1:
            raise ConfigError(
                "run config 'lsa-local-steps': PF-LSA exchanges every iteration, must be 1, "
                f"got {self.params.local_steps}"
            )

    @property
    def beta(self) -> float:
        """``beta``, or 1/N when it is 0."""
        return self.params.beta or 1.0 / len(self.pool.partitions)

    def client_config(self, config: ConfigRecord, server_round: int, report: bool) -> ConfigRecord:
        return ConfigRecord({**super().client_config(config, server_round, report), "beta": self.beta})

    def summary(self) -> None:
        super().summary()
        self.log(f"PF-LSA: beta = {self.beta:g} over {len(self.pool.partitions)} agents")
