"""FedMD: heterogeneous federated learning via model distillation (Li and Wang, NeurIPS'19
workshop, arXiv 1910.03581), Algorithm 1, over model groups.

Public set D_0: ``public-fraction`` (default 20%, HeteroTune's setup) of the training data,
held out and excluded from every client's partition (``splits.public_split``). Per round t:
  1. Communicate: each party k sends its class scores f_k(x) on D_0 (logits, P x C);
  2. Aggregate: the server averages them into the consensus f~ = 1/m sum_k f_k(x);
  3. Distribute: f~ goes to every party with the next round's task;
  4. Digest: party k trains f_k to approach f~ on D_0 (mean absolute error on logits, as the
     FedMD code), ``distill-epochs`` at ``distill-lr``;
  5. Revisit: party k trains on its own private data (``local-epochs``), then goes to step 1.
Round 1 has no consensus yet: parties only revisit and communicate (steps 5, 1).

What a party trains: its whole model, as FedMD's paper does ("each party trains its model",
its code fits every layer of each party's CNN: Keras model.fit on the whole model in both the
digest and the revisit) with 'client-trains = full' or the HeteroTune presets' 'heterotune';
'client-trains = adapters' is the adapter reading (adapters + head on a frozen backbone), which
HeteroTune's text neither states nor rules out. The digest's budget: ``distill-epochs`` (FedMD's
code: N_logits_matching_round = 1 epoch over the public alignment set a round) at
``distill-lr``; both are keys, the rate chosen on validation like every arm's.

Choices made here:
  * FedMD keeps one model per party and exchanges no parameters; HeteroTune's tables evaluate
    one global model per model group, so the parties' trainable tensors (adapters, head) are
    also averaged within their group each round (Homo-training plus FedMD's consensus). The
    bytes per round therefore hold both: the group's tensors and the P x C scores down and up;
    the scores' share grows with the public set, not with the model (run-config
    ``public-fraction``). Wire name of the scores/consensus: ``fedmd.consensus``.
  * FedMD's first step (transfer learning on the labelled public set) is left out: the backbone
    is pretrained already, and the public labels are never used (only scores).
  * The consensus is the plain mean over the parties that replied (FedMD's 1/m), while the
    parameter means are example-weighted as everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedtune_app.config import ConfigPart, RunConfig, config_key, register_keys
from fedtune_app.data.splits import public_split, run_num_classes, run_splits
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method
from fedtune_app.training.distill import consensus, digest_loss, distill, scores_on
from fedtune_app.training.local import train_local
from fedtune_app.training.recipes import ClientRecipe

CONSENSUS = "fedmd.consensus"


def public_set(cfg: RunConfig):
    return public_split(cfg.held_out, run_splits(cfg))[1]


class FedMDRecipe(ClientRecipe):
    """Digest the received consensus, revisit local data, reply with the scores on D_0."""

    gradient_bounds: dict[str, float] = {}  # the digest trains on the public set first

    def received(self, model, plan):
        if not hasattr(self, "_consensus"):
            self._public = public_set(self.cfg)
            self._consensus = torch.zeros(len(self._public), run_num_classes(self.cfg))
        return super().received(model, plan) | {CONSENSUS: self._consensus}

    def fit(self, model, plan, params, examples, seed, device, loss_fn, server_round) -> float:
        trainable = list(params.values())
        if server_round > 1:  # digest
            own = self.cfg.own
            distill(model, plan, trainable, self._public, self._consensus.numpy(), digest_loss,
                    self.cfg.training, own.distill_epochs, own.distill_lr, seed=seed + 1,
                    device=device)
        loss = train_local(model.subnetwork(plan), trainable, examples, self.cfg.training,
                           seed=seed, device=device, loss_fn=loss_fn)  # revisit
        self._scores = scores_on(model, plan, self._public,
                                 self.cfg.federation.eval_batch_size, device)
        return loss

    def reply(self) -> dict[str, np.ndarray]:
        return {CONSENSUS: self._scores}


class FedMD(GroupStrategy):
    full_fine_tuning = True  # FedMD's parties train their whole models; averaged as they come
    name = "fedmd"
    unscreened = (CONSENSUS,)  # scores on the public set replace the last ones: no update
    private_aggregation = False  # the consensus averages every client's scores in the clear

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        shape = (len(public_set(cfg)), run_num_classes(cfg))
        self.state[CONSENSUS] = np.zeros(shape, dtype=np.float32)

    def client_payload(self, client, plan):
        return super().client_payload(client, plan) + [CONSENSUS]

    def payload_names(self, entry):
        """Trained tensors only: the scores travel (bytes) but are no parameters."""
        return {pid: [n for n in names if n != CONSENSUS]
                for pid, names in super().payload_names(entry).items()}

    def aggregate(self, updates):
        params = [ClientUpdate(u.client, {n: v for n, v in u.tensors.items() if n != CONSENSUS},
                               u.num_examples) for u in updates]
        new = self.server_objective(params, self.combine(params))
        new[CONSENSUS] = consensus([u.tensors[CONSENSUS] for u in updates])
        return new


@dataclass(frozen=True)
class DistillConfig(ConfigPart):
    """The public set and server-side distillation of FedMD and FedDF."""
    public_fraction: float = config_key(0.2, minimum=0.01, maximum=0.9, help=
        "FedMD/FedDF: share of the training data held out as the public set (nobody's private "
        "data; HeteroTune: 20%)")
    distill_epochs: int = config_key(1, minimum=1, help=
        "FedMD digest / FedDF server distillation with feddf-distillation = epochs: epochs over "
        "the public set per round (FedMD's code: N_logits_matching_round = 1)")
    distill_lr: float = config_key(0.01, minimum=0, help=
        "SGD learning rate of FedMD's digest (and FedDF's epochs stand-in); FedMD's own rate "
        "is not stated in its paper: choose it on validation like every arm's")


register_keys("the public set and distillation of FedMD and FedDF", DistillConfig)
register_method("fedmd", group_strategy=FedMD, recipe=FedMDRecipe, holdout="public",
                config=DistillConfig)
