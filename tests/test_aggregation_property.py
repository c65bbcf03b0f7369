"""Property test of the masked weighted mean: for random plans, weights and tensors,
each name gets the example-weighted mean over the clients that sent it, a name nobody sent
keeps its value exactly, and the order replies arrive in does not change a single bit."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtune_app.federated.aggregation import ClientUpdate, masked_weighted_mean
from floats import assert_rounded_mean

NAMES = [f"blocks.{j}.lora_A.weight" for j in range(5)] + ["head.weight"]


@st.composite
def rounds(draw):
    """(state, updates, a permutation of the updates)."""
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    values = st.floats(-1e3, 1e3, width=32)
    tensor = lambda: np.array(draw(st.lists(values, min_size=shape[0] * shape[1],  # noqa: E731
                                            max_size=shape[0] * shape[1])),
                              dtype=np.float32).reshape(shape)
    state = {name: tensor() for name in NAMES}
    updates = []
    for i in range(draw(st.integers(1, 5))):
        plan = draw(st.lists(st.sampled_from(NAMES), min_size=1, unique=True))
        updates.append(ClientUpdate(f"client-{i}", {name: tensor() for name in plan},
                                    draw(st.integers(1, 10**6))))
    order = draw(st.permutations(range(len(updates))))
    return state, updates, [updates[i] for i in order]


@settings(max_examples=100, deadline=None)
@given(rounds())
def test_masked_weighted_mean_properties(case):
    state, updates, shuffled = case
    before = {k: v.copy() for k, v in state.items()}
    new = masked_weighted_mean(state, updates)
    for name in NAMES:
        senders = [u for u in updates if name in u.tensors]
        if not senders:
            assert new[name].tobytes() == state[name].tobytes()  # kept exactly (FedRA Eq. 2)
            continue
        assert_rounded_mean(new[name], [u.tensors[name] for u in senders],
                            weights=[u.num_examples for u in senders])
    again = masked_weighted_mean(state, shuffled)
    assert all(again[k].tobytes() == new[k].tobytes() for k in NAMES)  # order-free, bit for bit
    assert all(state[k].tobytes() == before[k].tobytes() for k in NAMES)  # input untouched
