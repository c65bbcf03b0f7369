"""Local objectives against client drift: FedProx and FedDyn, for every method that trains the
tensors it receives (FedRA, AllLarge, AllSmall, InclusiveFL, DepthFL, ...).

Run-config key ``local-objective`` (a method may choose its own: ``RunConfig.objective``):

* ``plain``: the method's own loss.
* ``fedprox`` (Li et al., MLSys'20, Eq. 2): loss += mu/2 ||theta - theta_global||^2 .
* ``feddyn`` (Acar et al., ICLR'21, Algorithm 1), with node state h_i kept in the node's
  ``context.state`` across rounds (one entry per tensor name the node ever trained):
      loss += -<theta, h_i> + alpha/2 ||theta - theta_global||^2 ;
      after training: h_i <- h_i - alpha (theta_i - theta_global).
  Server, per tensor n held by m_n of the N clients this round (a depth- or layer-partial
  client holds only some tensors, so FedDyn's 1/m over all clients is scaled to the share that
  held n, as in DepthFL's code), with mean_n the method's aggregate of n:
      h_n <- h_n - alpha m_n/N (mean_n - theta_n),   theta_n <- mean_n - h_n / alpha .
  A tensor nobody held this round keeps its value and its h_n.

Choices made here: theta are the trainable tensors a client is sent (LoRA/adapters, head,
method extras), not the frozen backbone; mean_n is the method's own aggregate (example-weighted,
FedDyn's is unweighted); N counts all clients of the federation (FedDyn's m), not only the ones
sampled this round; the node's h_i of a tensor outside this round's plan is left as it is.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from fedtune_app.config import RunConfig, TrainingConfig
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.records import from_record, to_record


def objective_of(training: TrainingConfig) -> tuple[str, float]:
    """(kind, coefficient) of key 'local-objective': (plain, 0), (fedprox, mu) or
    (feddyn, alpha). A run's objective is ``RunConfig.objective``: this, unless its method
    chooses its own."""
    kind = training.local_objective
    return kind, {"plain": 0.0, "fedprox": training.fedprox_mu,
                  "feddyn": training.feddyn_alpha}[kind]


def state_key(cfg: RunConfig) -> str:
    """Where a node keeps its FedDyn h_i in ``context.state`` (one entry per method)."""
    return f"{cfg.method}-feddyn-h"


class LocalObjective:
    """Client side: ``begin`` (params hold what the server sent), ``penalty`` (added to the
    method's loss at every step), ``end`` (params hold the trained values)."""

    def __init__(self, cfg: RunConfig):
        self.kind, self.coef = cfg.objective
        self.key = state_key(cfg)

    def begin(self, params: dict[str, nn.Parameter], context: Context) -> None:
        if self.kind == "plain":  # nothing to remember: skip copying the received tensors
            return
        self._params = params
        self._global = {n: p.detach().clone() for n, p in params.items()}
        self._h = {}
        if self.kind == "feddyn":
            stored = from_record(context.state[self.key]) if self.key in context.state else {}
            self._h = {n: torch.as_tensor(stored[n]).to(p.device) if n in stored
                       else torch.zeros_like(p) for n, p in params.items()}

    def penalty(self) -> torch.Tensor | float:
        if self.kind == "plain":
            return 0.0
        drift = sum((p - self._global[n]).pow(2).sum() for n, p in self._params.items())
        if self.kind == "fedprox":
            return self.coef / 2 * drift
        linear = sum((p * self._h[n]).sum() for n, p in self._params.items())
        return self.coef / 2 * drift - linear

    def end(self, params: dict[str, nn.Parameter], context: Context) -> None:
        if self.kind != "feddyn":
            return
        stored = from_record(context.state[self.key]) if self.key in context.state else {}
        for n, p in params.items():
            stored[n] = (self._h[n] - self.coef * (p.detach() - self._global[n])).cpu().numpy()
        context.state[self.key] = to_record(stored)


def feddyn_server_step(h: dict[str, np.ndarray], state: dict[str, np.ndarray],
                       mean: dict[str, np.ndarray], updates: list[ClientUpdate], alpha: float,
                       num_clients: int) -> dict[str, np.ndarray]:
    """FedDyn's server update of the tensors held this round (``h`` is updated in place; a
    tensor first seen gets h = 0). ``state``: the previous global state, ``mean``: the
    method's aggregate of the round. Returns the new global state."""
    new = dict(mean)
    for name in sorted({n for u in updates for n in u.tensors}):
        held = sum(name in u.tensors for u in updates)
        prev = h.get(name, np.zeros_like(state[name], dtype=np.float64))
        h[name] = prev - alpha * held / num_clients * (mean[name] - state[name])
        new[name] = (mean[name] - h[name] / alpha).astype(state[name].dtype)
    return new
