"""One hostile device must never ruin the global model: update screening, robust masked
aggregators, client-level differential privacy, and the guard on the new state.

Every rule works per tensor name over the clients that held that tensor this round (the mask
every layer-plan method shares) and on a client's *update*: the tensor it sent back minus the
tensor the server sent it.

Screening (on by default, every method, before its aggregation). A reply is rejected as a whole
when, for any of its tensors t, its update Delta_t is

  * with 3 or more holders of t, far above its peers': ||Delta_t|| > screen-peer-ratio x the
    median of ||Delta_t|| over the holders of t, and rms(Delta_t) > screen-rms-floor (an update
    that hardly moves the weights is harmless, however it compares to peers that moved even
    less). The median of the peers' update norms as the yardstick of an acceptable update is
    FLAME's (Nguyen et al., USENIX Security 2022, Sec. 4.2 "adaptive clipping"); rejecting
    instead of clipping is the norm bounding of Sun et al., "Can You Really Backdoor Federated
    Learning?" (arXiv:1911.07963, 2019) with a bound that follows the round. Where the peers'
    yardstick exists, it alone judges: an honest client whose data holds few classes moves the
    head several times further than its peers, and in the first rounds, while the global head
    is still near zero, far beyond any multiple of the head's own size (measured in
    ``benchmarks/screening_false_rejections.py``: up to 1.45 x the bound below; its bias,
    with 6 of 20 clients sampled, up to 21.7 x the peers' median, hence the third rule).
  * with one or two holders (the median of 1 or 2 norms is no robust statistic: an attacker
    would be half or all of it), far too large for the tensor itself:
    rms(Delta_t) > screen-max-growth x max(rms(w_t), screen-rms-floor), w_t the tensor the
    server sent (a freshly initialised LoRA B is all zeros, hence the floor).
  * whatever its holders, for a tensor whose loss gradient is bounded whatever the data (the
    recipe's ``gradient_bounds``: the classification head's bias under cross-entropy, norm <=
    sqrt(2)), beyond the farthest the client's local training could move it: ||Delta_t|| >
    ``sgd_reach`` of its steps (local epochs x its batches), the round's rate, momentum, weight
    decay and FedProx term. This bound alone judges such a tensor: no honest client ever
    exceeds it, and the peer rule, which judges the others, rejects an honest client holding
    one or two classes among few sampled peers (its head bias moves more than 10 x theirs).

Aggregators (key ``aggregator``), per tensor over its holders; with one holder every rule gives
that holder's tensor (the fallback: screening has already bounded it against the global
tensor), with two the median and the trimmed mean are the plain mean of the two:

  mean           example-weighted mean, FedRA Eq. 2 (``aggregation.masked_weighted_mean``)
  median         coordinate-wise median, unweighted, as Flower's FedMedian (Yin et al. 2018)
  trimmed-mean   coordinate-wise mean after cutting the ``trim-beta`` fraction of each tail,
                 unweighted, scipy's ``trim_mean`` (Flower's FedTrimmedAvg rule; Yin et al. 2018);
                 int(beta x holders) values are cut per tail, so 3 holders need beta >= 1/3
  clipped-mean   each update clipped to the median of the holders' update norms (FLAME's
                 adaptive bound; with fewer than 3 holders, the median over the clients of
                 each one's median norm on the same tensor of every block, ``role_of``), then
                 the example-weighted mean with each example count capped at the median count
                 of the round's replies (a count is the client's own claim: an inflated one
                 weighs no more than a typical one)
  fltrust        FLTrust (Cao et al., NDSS 2021): the server trains the global model (every
                 block) for one local round on its root set, the proxy split held out of every
                 client's data (``proxy-fraction``), giving its update g; client i's trust score
                 is ReLU(cos(Delta_i, g)) over the tensors it held (g masked to its plan); each
                 holder's update of t is rescaled to ||g_t|| and the trust-weighted mean taken.
                 No trusted holder: t does not move. Example counts are not used.
                 ``fltrust-scale = clip-median`` (ours, not the paper's): each update clipped
                 to clipped-mean's bound instead of rescaled to ||g_t||, so that the step is
                 the clients' size and not what the small root set moves
  centred-clip   centred clipping (Karimireddy, He and Jaggi, ICML 2021, Alg. 2):
                 v <- v + mean_i clip_tau(Delta_i - v), ``cc-iterations`` times, from v = the
                 previous round's aggregated update of t (server momentum: the history the rule
                 is centred on; kept in the checkpoint); tau = ``cc-tau`` or, 0, the holders'
                 median distance to v (with fewer than 3 holders, the median over the clients
                 of each one's median distance on the same tensor of every block, as
                 clipped-mean's bound). Unweighted. The paper's worker momentum is not here:
                 clients are sampled and keep no state; a local round of several steps plays
                 its part of averaging out the noise.
  multi-krum     (Blanchard et al., NeurIPS 2017) the mean of the n - f updates of lowest Krum
                 score (sum of squared distances to the n - f - 2 nearest), f = ``krum-f``,
                 computed per tensor over its n holders; needs n >= 2f + 3
  bulyan         (El Mhamdi et al., ICML 2018) n - 2f updates picked by Krum one at a time, then
                 per coordinate the mean of the n - 4f values nearest the median; n >= 4f + 3
                 multi-krum and bulyan with fewer holders than they need: the coordinate-wise
                 median (their guarantee is void there, as the median's with 1 or 2 holders).

Coverage (``min-holders`` k > 1, FedRA): the allocation holds every block with at least k of
the round's clients (``allocation.k_cover_plans``), so that every rule above has k values.

Client-level DP (``dp-noise-multiplier`` > 0; DP-FedAvg, McMahan et al., ICLR 2018): each
client's whole update (all tensors it sent, as one vector) is clipped to L2 norm
``dp-clip-norm`` C; per tensor, the clipped updates of its holders are summed, Gaussian noise
N(0, (sigma C)^2) is added to every coordinate on the server, and the sum is divided by the
number of holders (unweighted: example counts are the clients' own, unbounded claims). One
client's data changes the released noisy sums by at most C in L2 over all tensors together,
whichever and however many layers it holds, so every client gets the same (epsilon, delta)
guarantee, which Opacus' RDP accountant reports per round. Protected: the content of each
client's update (hence its training data) on every tensor it held. NOT protected: which layers
a client held (its capacity and plan, decided by the server from what the client declared at
start), its example count and training loss (reported to the server in the clear and logged),
and whether it replied. The server is trusted (central DP). A tensor with few holders carries
the same noise over fewer clients: its average is noisier (deep layers held only by large
clients). Under DP the peer-ratio screening rule is off (it lets one client's data decide
another's rejection, so the sensitivity would no longer be C); the rule against the global
tensor, which depends on public values only, judges every tensor.

State guard: a new state with a non-finite value, or a tensor whose change exceeds both the
bound against the global tensor (``screen-max-growth``) and the largest update of it that
screening accepted, is not taken: the round keeps the previous state and says why.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

import numpy as np

from fedtune_app.config import RobustConfig
from fedtune_app.federated.aggregation import (
    ClientUpdate,
    keyed_weighted_mean,
    masked_weighted_mean,
)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def norm(x: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64).ravel()))


# float32 training rounds each of its steps: an update may pass its exact bound by that much
REACH_SLACK = 1e-4


def sgd_reach(steps: int, lr: float, momentum: float, grad_bound: float,
              weight_decay: float = 0.0, start_norm: float = 0.0, pull: float = 0.0) -> float:
    """The farthest (L2) ``steps`` steps of torch's SGD (v <- momentum v + g + weight_decay w;
    w <- w - lr v) can move a tensor of norm ``start_norm`` when its loss gradient has norm at
    most ``grad_bound`` at every step; ``pull``: FedProx's mu, adding mu (w - w_start) to the
    gradient. The triangle inequality step by step; reached exactly by a constant gradient of
    norm ``grad_bound`` without decay or pull."""
    moved = speed = 0.0
    for _ in range(steps):
        speed = momentum * speed + grad_bound + weight_decay * (start_norm + moved) + pull * moved
        moved += lr * speed
    return moved


def screen_verdict(size_rms: float, ref_rms: float, length: float, median: float,
                   holders: int, robust: RobustConfig, peers: bool = True,
                   reach: float | None = None) -> str | None:
    """Why one tensor's update is rejected (module docstring), or None. ``size_rms`` and
    ``length``: rms and L2 norm of the update; ``ref_rms``: rms of the tensor sent; ``median``:
    the median update norm of the tensor's ``holders`` (this one included); ``reach``: the
    farthest the client's training can move the tensor, where its gradient is bounded."""
    if reach is not None:
        if length > reach * (1 + REACH_SLACK):
            return (f"update norm {length:.3g} > {reach:.3g}, the farthest its local training "
                    "can move it")
        return None
    ratio, growth, floor = (robust.screen_peer_ratio, robust.screen_max_growth,
                            robust.screen_rms_floor)
    if holders >= 3 and peers:
        if size_rms > floor and length > ratio * median:
            return (f"update norm {length:.3g} > {ratio:g} x the median {median:.3g} of its "
                    f"{holders} holders")
        return None
    bound = growth * max(ref_rms, floor)
    if size_rms > bound:
        return (f"update has rms {size_rms:.3g} > {growth:g} x max(rms of the global tensor "
                f"{ref_rms:.3g}, {floor:g})")
    return None


def screen(updates: list[ClientUpdate], sent: dict[str, dict[str, np.ndarray]],
           robust: RobustConfig, peers: bool = True,
           reach: dict[str, dict[str, float]] | None = None) -> dict[str, str]:
    """Client id -> why its update is rejected (module docstring), for the clients rejected.
    ``sent``: client id -> the tensors the server sent it. ``peers`` False (under DP): every
    tensor is judged against the global tensor only. ``reach``: client id -> tensor name ->
    the farthest its training can move that tensor (``sgd_reach``), where known."""
    reach = reach or {}
    stats: dict[str, dict[str, tuple[float, float, float]]] = {}  # name -> client -> stats
    for u in sorted(updates, key=lambda u: u.client):
        for name, value in sorted(u.tensors.items()):
            ref = sent[u.client][name]
            delta = value.astype(np.float64) - ref
            stats.setdefault(name, {})[u.client] = (rms(delta), rms(ref), norm(delta))
    rejected: dict[str, str] = {}
    for name, by_client in sorted(stats.items()):
        median = float(np.median([n for _, _, n in by_client.values()]))
        for client, (size_rms, ref_rms, length) in sorted(by_client.items()):
            why = screen_verdict(size_rms, ref_rms, length, median, len(by_client), robust, peers,
                                 reach.get(client, {}).get(name))
            if why and client not in rejected:
                rejected[client] = f"screening: '{name}': {why}"
    return rejected


def names_of(keys: dict[str, str]) -> dict[str, list[str]]:
    """key -> the tensor names that share it."""
    names: dict[str, list[str]] = {}
    for name, key in keys.items():
        names.setdefault(key, []).append(name)
    return names


def combine(state: dict[str, np.ndarray], updates: list[ClientUpdate], robust: RobustConfig,
            keys: dict[str, str] | None = None, reference: dict[str, np.ndarray] | None = None,
            memory: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """New state from ``updates`` with the run's aggregator (module docstring); tensors with the
    same key (``keys``: name -> key, default each name its own) share one value. ``reference``:
    the server's own update on its root set, name -> tensor (fltrust); ``memory``: key -> the
    previous round's aggregated update, updated in place (centred-clip)."""
    rule = robust.aggregator
    if rule == "mean":
        return (masked_weighted_mean(state, updates) if keys is None else
                keyed_weighted_mean(state, updates, keys))
    keys = keys or {n: n for n in state}
    names = names_of(keys)
    trust = trust_scores(updates, state, reference) if rule == "fltrust" else {}
    groups: dict[str, list[Held]] = {}  # key -> its holders' (client, update, sent, examples)
    for u in sorted(updates, key=lambda u: u.client):
        for name, value in u.tensors.items():
            groups.setdefault(keys[name], []).append(
                Held(u.client, value.astype(np.float64) - state[name], state[name],
                     u.num_examples))
    centres = {key: (memory or {}).get(key, np.zeros_like(held[0].delta))
               for key, held in groups.items()} if rule == "centred-clip" else {}
    radii: dict[str, float] = {}  # centred-clip, tau 0: the radius of a tensor with few holders
    if rule in ("clipped-mean", "fltrust"):
        clip_bounds = role_clip_bounds(groups, lambda key, h: norm(h.delta))
    if rule == "clipped-mean":
        weight_cap = float(np.median([u.num_examples for u in updates]))
    elif rule == "centred-clip" and not robust.cc_tau:
        radii = role_clip_bounds(groups, lambda key, h: norm(h.delta - centres[key]))
    new_state = dict(state)
    for key, held in groups.items():
        values = np.stack([h.sent + h.delta for h in held])
        deltas = np.stack([h.delta for h in held])
        if rule == "median":
            agg = np.median(values, axis=0)
        elif rule == "trimmed-mean":
            # imported here: every client process loads this module, and scipy.stats costs
            # about a second of each one's start-up
            from scipy.stats import trim_mean

            agg = trim_mean(values, robust.trim_beta, axis=0)
        elif rule == "clipped-mean":
            bound = median_bound(key, deltas, clip_bounds)
            clipped = [h.sent + h.delta * min(1.0, bound / max(norm(h.delta), 1e-300))
                       for h in held]
            weights = np.array([min(h.examples, weight_cap) for h in held], dtype=np.float64)
            agg = np.tensordot(weights, np.stack(clipped), axes=1) / weights.sum()
        elif rule == "fltrust":
            agg = held[0].sent + fltrust_step(
                deltas, [trust[h.client] for h in held], reference[names[key][0]],
                None if robust.fltrust_scale == "server" else
                median_bound(key, deltas, clip_bounds))
        elif rule == "centred-clip":
            step = centred_clip(deltas, centres[key], radii.get(key, robust.cc_tau),
                                robust.cc_iterations)
            if memory is not None:
                memory[key] = step
            agg = held[0].sent + step
        elif rule == "multi-krum":
            agg = held[0].sent + multi_krum(deltas, robust.krum_f)
        else:  # bulyan
            agg = held[0].sent + bulyan(deltas, robust.krum_f)
        for name in names[key]:
            new_state[name] = agg.astype(state[name].dtype)
    return new_state


# -- clipping bounds (clipped-mean, centred-clip, fltrust clip-median): a role's peers ----------
PEERS_NEEDED = 3  # the median of 1 or 2 norms is no robust statistic: an attacker is half of it


def median_bound(key: str, deltas: np.ndarray, role_bounds: dict[str, float]) -> float:
    """The median norm of the tensor's holders' updates, or its role's (``role_clip_bounds``)."""
    return role_bounds[key] if key in role_bounds else float(np.median([norm(d) for d in deltas]))


def role_of(key: str) -> str:
    """The tensor's role, the same in every block: blocks.3.attn.lora_B -> blocks.*.attn.lora_B."""
    return re.sub(r"\bblocks\.\d+\.", "blocks.*.", key)


def role_clip_bounds(groups: dict[str, list[Held]], size) -> dict[str, float]:
    """key -> the clipping bound of a tensor with fewer than PEERS_NEEDED holders: the median,
    over the clients holding any tensor of its role this round (the same tensor of the other
    blocks, which more clients hold: FedRA's deep blocks often have one or two holders, and the
    median of their sizes would be the attacker's own), of each client's median ``size(key,
    held)`` on that role (clipped-mean: the update's norm; centred-clip: its distance to the
    centre). One value per client, so that a client holding every block, whose tensors are
    most of the role's, still has one vote. Absent where fewer than PEERS_NEEDED clients hold
    the role."""
    pools: dict[str, dict[str, list[float]]] = {}
    for key, held in groups.items():
        for h in held:
            pools.setdefault(role_of(key), {}).setdefault(h.client, []).append(size(key, h))
    medians = {role: float(np.median([np.median(v) for v in by_client.values()]))
               for role, by_client in pools.items() if len(by_client) >= PEERS_NEEDED}
    return {key: medians[role_of(key)] for key, held in groups.items()
            if len(held) < PEERS_NEEDED and role_of(key) in medians}


@dataclass
class Held:
    """One holder's update of one tensor."""

    client: str
    delta: np.ndarray
    sent: np.ndarray
    examples: int


# -- FLTrust (Cao et al., NDSS 2021) --------------------------------------------------------------
def trust_scores(updates: list[ClientUpdate], state: dict[str, np.ndarray],
                 reference: dict[str, np.ndarray] | None) -> dict[str, float]:
    """Client -> ReLU(cos(its update, the server's update)), both over the tensors the client
    held (the server's update masked to the client's plan)."""
    if reference is None:
        raise ValueError("aggregator = fltrust needs the server's update on its root set")
    scores = {}
    for u in updates:
        dot = sq_u = sq_g = 0.0
        for name, value in u.tensors.items():
            d = value.astype(np.float64).ravel() - state[name].ravel()
            g = reference[name].astype(np.float64).ravel()
            dot, sq_u, sq_g = dot + float(d @ g), sq_u + float(d @ d), sq_g + float(g @ g)
        scores[u.client] = max(0.0, dot / np.sqrt(sq_u * sq_g)) if sq_u * sq_g > 0 else 0.0
    return scores


def fltrust_step(deltas: np.ndarray, trust: list[float], server: np.ndarray,
                 clip_to: float | None = None) -> np.ndarray:
    """FLTrust's aggregate of one tensor: the holders' updates rescaled to the norm of the
    server's update of that tensor (or, ``clip_to`` given, clipped to norm ``clip_to``),
    averaged with weights = their trust scores; nothing (a zero step) when no holder is
    trusted."""
    weights = np.asarray(trust, dtype=np.float64)
    if weights.sum() <= 0:
        return np.zeros_like(deltas[0])
    if clip_to is None:
        target = norm(server)
        rescaled = [d * (target / n if (n := norm(d)) > 0 else 0.0) for d in deltas]
    else:
        rescaled = [d * min(1.0, clip_to / n) if (n := norm(d)) > 0 else d for d in deltas]
    return np.tensordot(weights, np.stack(rescaled), axes=1) / weights.sum()


# -- centred clipping (Karimireddy, He and Jaggi, ICML 2021, Alg. 2) -----------------------------
def centred_clip(deltas: np.ndarray, centre: np.ndarray, tau: float,
                 iterations: int) -> np.ndarray:
    """v <- v + mean_i clip_tau(Delta_i - v), ``iterations`` times from v = ``centre`` (the
    previous round's aggregated update: the history the rule is centred on); clip_tau scales a
    vector down to L2 norm tau. ``tau`` 0: the median of the holders' ||Delta_i - centre||."""
    v = centre.astype(np.float64)
    for _ in range(iterations):
        gaps = [d - v for d in deltas]
        radius = tau or float(np.median([norm(g) for g in gaps]))
        v = v + np.mean([g * min(1.0, radius / n) if (n := norm(g)) > 0 else g
                         for g in gaps], axis=0)
    return v


# -- Multi-Krum and Bulyan (Blanchard et al. 2017; El Mhamdi et al. 2018) ------------------------
def krum_scores(deltas: np.ndarray, f: int) -> np.ndarray:
    """Krum's score of each update: the sum of its squared distances to its n - f - 2 nearest
    other updates."""
    flat = deltas.reshape(len(deltas), -1)
    d2 = np.sum((flat[:, None, :] - flat[None, :, :]) ** 2, axis=-1)
    nearest = max(len(deltas) - f - 2, 0)
    return np.array([np.sort(np.delete(row, i))[:nearest].sum() for i, row in enumerate(d2)])


def multi_krum(deltas: np.ndarray, f: int) -> np.ndarray:
    """Mean of the n - f updates of lowest Krum score (needs n >= 2f + 3 holders; with fewer,
    Krum's guarantee is void and the coordinate-wise median is taken instead)."""
    n = len(deltas)
    if n < 2 * f + 3:
        return np.median(deltas, axis=0)
    chosen = np.argsort(krum_scores(deltas, f), kind="stable")[: n - f]
    return deltas[np.sort(chosen)].mean(axis=0)


def bulyan(deltas: np.ndarray, f: int) -> np.ndarray:
    """Bulyan: theta = n - 2f updates chosen by Krum one at a time (each pick removed), then per
    coordinate the mean of the beta = theta - 2f values closest to the coordinate's median
    (needs n >= 4f + 3 holders; with fewer, the coordinate-wise median).

    As in the paper's recursion, each pick is Krum over what is left with the same f, so the
    last pick (2f + 1 left) scores f - 1 neighbours: none when f = 1, where every score is 0
    and the lowest index left is taken (Flower's ``aggregate_krum`` scores at least one
    neighbour instead). That pick can be an attacker's; the per-coordinate trim that follows
    is what bounds its weight."""
    n = len(deltas)
    if n < 4 * f + 3:
        return np.median(deltas, axis=0)
    left = list(range(n))
    chosen = []
    while len(chosen) < n - 2 * f:
        chosen.append(left.pop(int(np.argmin(krum_scores(deltas[left], f)))))
    picked = deltas[sorted(chosen)]
    beta = len(picked) - 2 * f
    median = np.median(picked, axis=0)
    order = np.argsort(np.abs(picked - median), axis=0, kind="stable")[:beta]
    return np.take_along_axis(picked, order, axis=0).mean(axis=0)


def dp_noise_entropy(robust: RobustConfig) -> np.ndarray:
    """The DP noise seed: ``dp-noise-seed``, or 128 fresh bits from the OS (the noise must be
    unknown to anyone who knows the run config), as uint32 words for the checkpoint."""
    seed = robust.dp_noise_seed or secrets.randbits(128)
    return np.array([(seed >> (32 * i)) & 0xFFFFFFFF for i in range(4)], dtype=np.uint32)


def dp_combine(state: dict[str, np.ndarray], updates: list[ClientUpdate], robust: RobustConfig,
               entropy: np.ndarray, server_round: int,
               keys: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """DP-FedAvg over the masked tensors (module docstring). The noise of a round comes from
    (entropy, round) alone, so a resumed run draws exactly the noise of the uninterrupted one."""
    keys = keys or {n: n for n in state}
    names = names_of(keys)
    clip = robust.dp_clip_norm
    sums: dict[str, np.ndarray] = {}
    holders: dict[str, int] = {}
    for u in sorted(updates, key=lambda u: u.client):
        deltas = {n: v.astype(np.float64) - state[n] for n, v in u.tensors.items()}
        total = float(np.sqrt(sum(np.sum(np.square(d)) for d in deltas.values())))
        scale = min(1.0, clip / total) if total > 0 else 1.0
        for name, d in deltas.items():
            sums[keys[name]] = sums.get(keys[name], 0.0) + d * scale
            holders[keys[name]] = holders.get(keys[name], 0) + 1
    rng = np.random.default_rng([*entropy.tolist(), server_round])
    sigma = robust.dp_noise_multiplier * clip
    new_state = dict(state)
    for key in sorted(sums):
        noisy = (sums[key] + rng.normal(0.0, sigma, size=np.shape(sums[key]))) / holders[key]
        for name in names[key]:
            new_state[name] = (state[name] + noisy).astype(state[name].dtype)
    return new_state


def dp_epsilon(robust: RobustConfig, rounds: int, sample_rate: float) -> float:
    """Privacy spent after ``rounds`` rounds, epsilon for ``dp-delta``, by Opacus' RDP
    accountant. Each round is one Gaussian mechanism on the sampled clients; with a fraction
    ``sample_rate`` < 1 of the clients sampled the accountant assumes Poisson sampling (ours
    is a fixed-size draw without replacement, for which this is the usual approximation)."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(robust.dp_noise_multiplier, sample_rate, rounds)]
    return float(accountant.get_epsilon(robust.dp_delta))


def largest_updates(updates: list[ClientUpdate], state: dict[str, np.ndarray]) -> dict[str, float]:
    """Tensor name -> the largest rms of an update of it among ``updates`` (for the guard)."""
    out: dict[str, float] = {}
    for u in updates:
        for name, value in u.tensors.items():
            if name in state:
                out[name] = max(out.get(name, 0.0), rms(value.astype(np.float64) - state[name]))
    return out


def state_problem(old: dict[str, np.ndarray], new: dict[str, np.ndarray], robust: RobustConfig,
                  check_jump: bool = True, skip_jump: tuple[str, ...] = (),
                  accepted: dict[str, float] | None = None) -> str | None:
    """Why ``new`` must not replace ``old`` (module docstring), or None; tensors named in
    ``skip_jump`` need only be finite. ``accepted``: name -> the largest rms of an update of that
    tensor that screening accepted this round; the aggregate may move a tensor that far (a
    mean of accepted updates never moves it further than the largest of them)."""
    growth, floor = robust.screen_max_growth, robust.screen_rms_floor
    accepted = accepted or {}
    for name in sorted(new):
        if new[name] is old.get(name):
            continue
        if not np.isfinite(new[name]).all():
            return f"'{name}' has NaN or Inf values"
        if check_jump and name in old and name not in skip_jump:
            jump, ref = rms(new[name].astype(np.float64) - old[name]), rms(old[name])
            bound = max(growth * max(ref, floor), accepted.get(name, 0.0))
            if jump > bound:
                return (f"'{name}' moved by rms {jump:.3g} > max({growth:g} x max(rms before "
                        f"{ref:.3g}, {floor:g}), the largest accepted update's rms "
                        f"{accepted.get(name, 0.0):.3g})")
    return None
