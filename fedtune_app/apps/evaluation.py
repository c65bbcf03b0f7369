"""The server's global model(s) and their evaluation on the held-out test set.

One backbone with adapters (``GlobalEvaluator``), or with model groups one model per group
(``GroupedEvaluator``: HeteroTune's Avg over model sizes and its Table-2 parameter counts)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import matthews_corrcoef
from torch import nn

from fedtune_app.config import RunConfig
from fedtune_app.data.groups import GroupedModel, GroupedRecipe, group_config, group_specs
from fedtune_app.data.splits import run_num_classes, run_splits
from fedtune_app.federated.strategy import ClientInfo
from fedtune_app.methods import recipe_for
from fedtune_app.model.adapters import added_parameters
from fedtune_app.model.backbones import ModelSpec
from fedtune_app.training.local import check_precision, pick_device, predict_outputs


class GlobalEvaluator:
    """Accuracy and loss of the global model on the held-out test set, overall and per group.

    Groups: the test set's domains when it has them (accuracy on each domain's test examples);
    otherwise one group per client, whose accuracy is the test accuracy re-weighted to that
    client's label distribution (the global model's accuracy on data distributed like the
    client's). ``test-correct``: which test examples the headline output got right, per domain
    (``pack_correct``; one stratum "all" without domains), for a bootstrap over test examples
    (``claims.stats.bootstrap_se``). ``accuracy`` is the papers' headline: the mean over the
    domains when the test set has domains (FedRA's and FedBRICK's "Average"), else the accuracy
    over all test examples; ``accuracy-pooled`` is always the latter. A method whose global
    model has more than one output (DepthFL: ensemble and last exit) also reports
    ``accuracy-<output>`` (headline)."""

    def __init__(self, cfg: RunConfig, model, clients: list[ClientInfo], recipe=None):
        self.cfg, self.model, self.clients = cfg, model, clients
        self.recipe = recipe or recipe_for(cfg)
        self.device = pick_device(cfg.training.device)
        check_precision(cfg.training.precision, self.device)
        self.model.to(self.device)
        splits = run_splits(cfg)
        self.test, self.domain_names = splits.test, splits.domain_names

    def per_domain(self, correct: np.ndarray) -> dict[str, float]:
        """Domain name -> accuracy on its test examples ({} without domains)."""
        if self.test.domains is None:
            return {}
        domains = self.test.domains.numpy()
        return {name: float(correct[domains == d].mean())
                for d, name in enumerate(self.domain_names) if (domains == d).any()}

    def strata(self, correct: np.ndarray) -> dict[str, str]:
        """Domain name (or "all") -> its test examples' correctness, packed."""
        if self.test.domains is None:
            return {"all": pack_correct(correct)}
        domains = self.test.domains.numpy()
        return {name: pack_correct(correct[domains == d])
                for d, name in enumerate(self.domain_names) if (domains == d).any()}

    def headline(self, correct: np.ndarray) -> float:
        """Mean over domains where the test set has them, else over all test examples."""
        domains = self.per_domain(correct)
        return float(np.mean(list(domains.values()))) if domains else float(correct.mean())

    def __call__(self, state: dict[str, np.ndarray], plan) -> dict:
        self.recipe.load(self.model, state)
        outputs = predict_outputs(self.model, plan, self.test, self.cfg.federation.eval_batch_size,
                                  self.device, self.cfg.training.precision, self.recipe.eval_logits)
        preds, losses = next(iter(outputs.values()))
        labels = self.test.labels.numpy()
        correct = preds == labels
        per_class = np.array([correct[labels == c].mean() if (labels == c).any() else np.nan
                              for c in range(run_num_classes(self.cfg))])
        groups = self.per_domain(correct)
        for c in self.clients if not groups else ():
            weights = np.asarray(c.label_counts, dtype=float)
            ok = ~np.isnan(per_class) & (weights > 0)
            groups[c.group] = float((per_class[ok] * weights[ok]).sum() / weights[ok].sum())
        extra = {f"accuracy-{name}": self.headline(p == labels)
                 for name, (p, _) in list(outputs.items())[1:]}
        return {"accuracy": self.headline(correct), "accuracy-pooled": float(correct.mean()),
                "loss": float(losses.mean()),
                # GLUE's metric for CoLA (HeteroTune Table 3), reported for every run
                "matthews-corr": float(matthews_corrcoef(labels, preds)),
                "accuracy-per-group": groups,
                "accuracy-per-class": dict(zip(map(str, range(len(per_class))),
                                               np.nan_to_num(per_class).tolist())),
                "test-correct": self.strata(correct)} | extra


def pack_correct(correct: np.ndarray) -> str:
    """0/1 per example as "n:hex" (8 examples a byte): a few hundred characters per thousand."""
    return f"{len(correct)}:{np.packbits(np.asarray(correct, dtype=bool)).tobytes().hex()}"


def unpack_correct(text: str) -> np.ndarray:
    n, bits = text.split(":")
    return np.unpackbits(np.frombuffer(bytes.fromhex(bits), dtype=np.uint8))[:int(n)]


def global_recipe(cfg: RunConfig):
    """The recipe the server holds: the method's, or a ``GroupedRecipe`` of one per group."""
    groups = len(group_specs(cfg.model))
    return GroupedRecipe([recipe_for(cfg, g) for g in range(groups)]) if groups else recipe_for(cfg)


def build_global(cfg: RunConfig):
    """(model, recipe) the server holds: one backbone + adapters, or a ``GroupedModel``."""
    recipe = global_recipe(cfg)
    if not isinstance(recipe, GroupedRecipe):
        return recipe.build(ModelSpec.from_config(cfg.model, run_num_classes(cfg))), recipe
    groups = [group_config(cfg, g) for g in range(len(recipe.recipes))]
    models = [r.build(ModelSpec.from_config(g.model, run_num_classes(g)))
              for g, r in zip(groups, recipe.recipes)]
    return GroupedModel(models), recipe


def parameter_counts(model: nn.Module, recipe) -> dict[str, float]:
    """Table 2 for one group's model: the parameters full fine-tuning would train and send (the
    backbone with its head, without any adapter), those a client of the method trains and sends
    back, those it receives each round, and the reduction 1 - trained / full in %."""
    plan = tuple(range(model.num_blocks))
    size = lambda params: int(sum(p.numel() for p in params))  # noqa: E731
    adapters = added_parameters(model)
    full = size(p for p in model.parameters() if id(p) not in adapters)
    trained = size(recipe.trainables(model, plan).values())
    return {"model-params": full, "trainable-params": trained,
            "received-params": size(recipe.received(model, plan).values()),
            "reduction-%": 100.0 * (1 - trained / full)}


class GroupedEvaluator:
    """Each group's global model on the test set; ``accuracy`` is the mean over the groups that
    have clients (the paper's Avg) of each group's headline accuracy (``accuracy-pooled``: of
    their accuracies over all test examples), with ``accuracy-smallest`` /
    ``accuracy-largest`` (groups are listed smallest first), ``accuracy-per-model-group``, and
    every group's Table-2 parameter counts (``params-per-model-group``).
    ``accuracy-per-class``: the largest group's; ``test-correct``: each group's."""

    def __init__(self, cfg: RunConfig, model: GroupedModel, clients, recipe: GroupedRecipe):
        used = sorted({c.model_group for c in clients})
        self.counts = {str(g): parameter_counts(m, r)
                       for g, (m, r) in enumerate(zip(model.groups, recipe.recipes))}
        self.evaluators = {g: GlobalEvaluator(group_config(cfg, g), model.groups[g],
                                              [c for c in clients if c.model_group == g],
                                              recipe.recipes[g]) for g in used}

    def __call__(self, state, plan) -> dict:
        per = {g: ev(state, tuple(range(ev.model.num_blocks)))
               for g, ev in self.evaluators.items()}
        first, last = min(per), max(per)
        acc = {str(g): m["accuracy"] for g, m in per.items()}
        return {"accuracy": float(np.mean(list(acc.values()))),
                "accuracy-pooled": float(np.mean([m["accuracy-pooled"] for m in per.values()])),
                "loss": float(np.mean([m["loss"] for m in per.values()])),
                "matthews-corr": float(np.mean([m["matthews-corr"] for m in per.values()])),
                "matthews-corr-per-model-group": {str(g): m["matthews-corr"]
                                                  for g, m in per.items()},
                "accuracy-smallest": per[first]["accuracy"],
                "accuracy-largest": per[last]["accuracy"],
                "accuracy-per-model-group": acc,
                "accuracy-per-group": {f"{g}/{k}": v for g, m in per.items()
                                       for k, v in m["accuracy-per-group"].items()},
                "accuracy-per-class": per[last]["accuracy-per-class"],
                "test-correct": {str(g): m["test-correct"] for g, m in per.items()},
                "params-per-model-group": self.counts}
