"""The code fingerprint of a claim run: the package's sources but its tools and the method
modules its method does not import."""

import shutil

import pytest

from fedtune_app.tools.fingerprint import ROOT, code_fingerprint, code_fingerprints


@pytest.fixture
def checkout(tmp_path):
    """A copy of the package's sources (what a fingerprint reads), to edit."""
    shutil.copytree(ROOT / "fedtune_app", tmp_path / "fedtune_app",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _edit(root, relative):
    path = root / "fedtune_app" / relative
    path.write_text(path.read_text() + "\n# an edit\n")


def test_every_registered_method_has_a_fingerprint_and_a_copy_has_the_same(checkout):
    from fedtune_app.methods import METHODS

    here = code_fingerprints()
    assert set(here) == set(METHODS)  # read from the sources: every register_method call
    assert code_fingerprints(checkout) == here  # by content, not by place
    # AllLarge and AllSmall live in one module: the same code
    assert here["all-large"] == here["all-small"] != here["fedra"]


def test_an_edit_reaches_the_methods_that_run_it_and_no_other(checkout):
    before = code_fingerprints(checkout)

    def changed():
        now = code_fingerprints(checkout)
        return {m for m in now if now[m] != before[m]}

    _edit(checkout, "methods/fedbrick.py")  # FedBRICK's own module: FedBRICK only
    assert changed() == {"fedbrick"}
    before = code_fingerprints(checkout)
    _edit(checkout, "methods/fedra.py")  # FedBRICK extends FedRA; the rank methods' base
    # (lora_ranks) imports it too
    assert changed() == {"fedra", "fedbrick", "fedit", "flora", "flexlora", "hetlora",
                         "fedex-lora", "ffa-lora", "fedsa-lora"}
    before = code_fingerprints(checkout)
    _edit(checkout, "training/local.py")  # shared: every method
    assert changed() == set(before)
    before = code_fingerprints(checkout)
    _edit(checkout, "methods/__init__.py")  # it imports every method to register it: shared
    assert changed() == set(before)
    before = code_fingerprints(checkout)
    _edit(checkout, "tools/cli.py")  # the command line: no run's code
    assert changed() == set()
    _edit(checkout, "claims/verdicts.py")  # the claims harness plans and judges runs: no run's code
    assert changed() == set()


def test_code_fingerprint_of_one_method():
    assert code_fingerprint("fedra") == code_fingerprints()["fedra"]
    with pytest.raises(KeyError):
        code_fingerprint("no-such-method")
