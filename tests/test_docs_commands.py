"""Every shell command in the README's and docs' code blocks runs as written, checked cheaply:

- ``fedtune ...`` and ``python -m fedtune_app...`` / ``python benchmarks/X.py``: their arguments
  parsed by the command's own argparse parser (stopped right after parsing, nothing runs);
  ``--run-config`` strings, TOML files and ``make run CONFIG=...`` resolved and checked against
  the typed run config (``fedtune_app.methods.resolve_config``), as a run would at its start;
- ``flwr``, ``mlflow``, ``wandb`` (click command lines): parsed by their own click commands;
- ``flower-superlink`` / ``flower-supernode`` / ``ray``: each option is one their ``--help`` lists;
- ``make X``: the Makefile has target X; ``python -m M``: module M imports; files named exist;
  ``jupyter X``: the lock installs the package X.

A command that cannot be checked this way is listed in ``UNCHECKED`` with the reason, and an
entry that matches no command any more fails the test (it would hide nothing but rot). Markdown
tables are checked too: the divider row has as many cells as the header (else no table renders).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks" / "README.md"]
SHELL = {"bash", "sh", "shell", "console"}
# a command containing one of these is not checked (or only partly): why
UNCHECKED = {
    "openssl ": "certificate tooling (scripts/make_credentials.sh runs these; "
                "tests/test_deployment.py uses its output)",
    "ssh-keygen ": "key tooling (scripts/make_credentials.sh runs it)",
    "sha256sum ": "coreutils",
    "git worktree ": "git",
    "printf ": "writes a Flower connection entry (the TOML is what Flower 1.41 and 1.42 read; the "
               "deployment tests write the same)",
    "node() {": "a shell function (the flower-supernode options in it are the ones checked "
                "in section 1.3's command)",
    "node 0 3": "calls the shell function above",
    "for i in 0 1 2": "a loop over `flwr supernode register`, checked on its own line above",
    "flower-supernode ... --node-config": "elides the SuperNode's other options (shown above)",
    'layered-url="..." layered-sha256="..."': "placeholders for the values the command before "
                                              "prints",
    'checkpoint-sha256="<64 hex digits>"': "a placeholder for the file's hash",
    "fedra-rare-power=2.0": "needs examples/fedra_rare.py copied into fedtune_app/methods/ first "
                            "(tests/test_example_method.py runs it)",
    "cp examples/fedra_rare.py": "copies the example method (tests/test_example_method.py)",
    "tensorboard --logdir": "TensorBoard's own flags (absl), not parsed here",
    "wandb sync": "click checks that the offline run folders a tracked run writes exist",
    "/tmp/mlflow-ui/bin/": "a separate environment the command before creates",
}


# -- collecting the commands ----------------------------------------------------------------
def code_blocks(path: Path):
    """(line number, language, text) of each fenced code block."""
    lines, block, start, lang = path.read_text().splitlines(), None, 0, ""
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            if block is None:
                block, start, lang = [], i, line.strip()[3:].strip().lower()
            else:
                yield start, lang, "\n".join(block)
                block = None
        elif block is not None:
            block.append(line)


def shell_commands():
    """(where, command text) of every command of a bash/sh/console block."""
    for path in DOCS:
        for start, lang, text in code_blocks(path):
            if lang not in SHELL:
                continue
            text = re.sub(r"\\\n\s*", " ", text)  # continuation lines
            command = ""
            for line in text.splitlines():
                line = re.sub(r"^\$ ", "", line.strip())
                if not command and (not line or line.startswith("#")):
                    continue
                command = f"{command}\n{line}" if command else line
                if command.rstrip().endswith("{") or command.count("{") > command.count("}"):
                    continue  # a shell function: up to its closing brace
                try:
                    shlex.split(command, comments=True)
                except ValueError:  # a quoted string goes on over the next line
                    continue
                yield f"{path.relative_to(ROOT)}:{start}", command
                command = ""
            assert not command, f"{path.relative_to(ROOT)}:{start}: unterminated: {command}"


COMMANDS = list(shell_commands())


# -- parsing with the real parsers --------------------------------------------------------------
class Parsed(Exception):
    pass


def parse_with_argparse(call, argv: list[str], prog_argv0: str) -> argparse.Namespace:
    """Run ``call`` until its argparse parser has parsed ``argv``; nothing after that runs."""
    original, depth = argparse.ArgumentParser.parse_known_args, [0]

    def parse_known_args(self, args=None, namespace=None):
        depth[0] += 1  # a subcommand's parser runs inside its parent's
        try:
            namespace, extras = original(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0]:
            return namespace, extras
        if extras:
            raise AssertionError(f"{prog_argv0}: unrecognized arguments {extras}")
        raise Parsed(namespace)

    saved = sys.argv
    sys.argv = [prog_argv0, *argv]
    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        call()
    except Parsed as done:
        return done.args[0]
    except SystemExit as err:
        raise AssertionError(f"{prog_argv0} {shlex.join(argv)}: argparse refused it "
                             f"(exit {err.code})") from None
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = saved
    raise AssertionError(f"{prog_argv0}: no argparse parser ran")


def check_run_config(text: str) -> None:
    """A ``--run-config`` value (key=value string or TOML file) resolves as a run would."""
    from fedtune_app.config import app_defaults
    from fedtune_app.federated.flower_private import parse_config_args
    from fedtune_app.methods import resolve_config

    if text.strip().endswith(".toml"):
        assert (ROOT / text.strip()).is_file() or Path(text.strip()).is_file(), text
    given = parse_config_args([text]) if text.strip() else {}
    resolve_config({**app_defaults(), **given})


def check_namespace(ns: argparse.Namespace) -> None:
    for name in ("run_config", "set"):
        value = getattr(ns, name, None)
        if isinstance(value, str) and value:
            check_run_config(value)


def check_fedtune(argv: list[str]) -> None:
    from fedtune_app.tools import cli

    if argv and argv[0] in cli.TOOLS:
        module = importlib.import_module(cli.TOOLS[argv[0]][0])
        ns = parse_with_argparse(lambda: module.main(argv[1:]), argv[1:], f"fedtune {argv[0]}")
    else:
        try:
            ns = cli.parser().parse_args(argv)
        except SystemExit as err:
            raise AssertionError(f"fedtune {shlex.join(argv)}: refused (exit {err.code})") \
                from None
    check_namespace(ns)


def check_python(argv: list[str]) -> None:
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        if module.startswith("fedtune_app.") and "argparse" in Path(
                importlib.util.find_spec(module).origin).read_text():
            main = importlib.import_module(module).main
            check_namespace(parse_with_argparse(lambda: main(rest), rest, module))
        elif module.startswith("fedtune_app."):  # a hand-parsed main: its flags in its source
            source = Path(importlib.util.find_spec(module).origin).read_text()
            for flag in [a for a in rest if a.startswith("--")]:
                assert f'"{flag}"' in source, f"{module} does not take {flag}"
        return
    script = ROOT / argv[0]
    assert script.is_file(), f"no file {argv[0]}"
    if "argparse" in script.read_text():
        sys.path.insert(0, str(script.parent))
        try:
            ns = parse_with_argparse(lambda: runpy.run_path(str(script), run_name="__main__"),
                                     argv[1:], str(script))
        finally:
            sys.path.remove(str(script.parent))
        check_namespace(ns)
    else:
        assert not argv[1:], f"{argv[0]} takes no arguments"


@functools.cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))


def check_make(argv: list[str]) -> None:
    for arg in argv:
        if "=" in arg:
            name, _, value = arg.partition("=")
            if name == "CONFIG":
                check_run_config(value)
            elif name == "FEDERATION":
                check_federation(value)
        else:
            assert arg in make_targets(), f"the Makefile has no target {arg!r}"


def check_federation(text: str) -> None:
    from fedtune_app.federated.flower_private import parse_config_args

    known = {"num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus"}
    assert set(parse_config_args([text])) <= known, text


def click_command(name: str):
    import click
    import typer

    (ep,) = entry_points(group="console_scripts", name=name)
    obj = ep.load()
    obj = typer.main.get_command(obj) if isinstance(obj, typer.Typer) else obj
    assert isinstance(obj, click.Command), f"{name} is not a click command"
    return obj


def check_click(name: str, argv: list[str]):
    """Parse ``argv`` down the click groups of console script ``name``; returns the leaf's
    parameters."""
    import click

    cmd, args, parent, path = click_command(name), list(argv), None, [name]
    while True:
        try:
            ctx = cmd.make_context(" ".join(path), list(args), parent=parent,
                                   resilient_parsing=False)
        except click.ClickException as err:
            raise AssertionError(f"{' '.join(path)} {shlex.join(args)}: {err}") from None
        if not isinstance(cmd, click.Group):
            return ctx.params
        rest = ctx.protected_args + ctx.args if hasattr(ctx, "protected_args") else ctx.args
        sub_name, sub, rest = cmd.resolve_command(ctx, rest)
        cmd, args, parent, path = sub, rest, ctx, path + [sub_name]


def check_flwr(argv: list[str]) -> None:
    params = check_click("flwr", argv)
    if argv[0] == "run":
        assert (ROOT / params["app"]).exists() if "app" in params else True
        for text in params.get("run_config_overrides") or []:
            check_run_config(text)
        for text in params.get("federation_config_overrides") or []:
            check_federation(text)


@functools.cache
def help_options(*command: str) -> set[str]:
    out = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60,
                         env=os.environ | {"FLWR_HOME": str(ROOT / ".flwr")})
    return set(re.findall(r"--[\w-]+", out.stdout + out.stderr))


def check_by_help(command: list[str], argv: list[str]) -> None:
    known = help_options(*command)
    assert known, f"{' '.join(command)} --help listed no options"
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in known, f"{' '.join(command)} has no option {flag}"
    for i, arg in enumerate(argv[:-1]):
        if arg == "--node-config":
            from fedtune_app.federated.flower_private import parse_config_args

            assert parse_config_args([argv[i + 1]]), argv[i + 1]


def substitute(tokens: list[str], variables: dict) -> list[str]:
    def one(token):
        return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), token)
    return [one(t) for t in tokens]


SHELL_BUILTINS = {"export", "cd"}
SYSTEM = {"openssl", "ssh-keygen", "sha256sum", "git", "printf"}


def check_command(command: str, variables: dict) -> None:
    tokens = substitute(shlex.split(command, comments=True), variables)
    for part in split_commands(tokens):
        while part and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", part[0]):
            name, _, value = part.pop(0).partition("=")
            variables[name] = value  # an assignment alone sets a shell variable
        if not part:
            continue
        word = part[0].removeprefix(".venv/bin/").removeprefix(f"{ROOT}/.venv/bin/")
        argv = part[1:]
        if word == "fedtune":
            check_fedtune(argv)
        elif word in ("python", "python3", "python3.11"):
            check_python(argv)
        elif word == "make":
            check_make(argv)
        elif word in ("flwr", "mlflow", "wandb"):
            if word == "flwr":
                check_flwr(argv)
            else:
                check_click(word, argv)
        elif word in ("flower-superlink", "flower-supernode"):
            check_by_help([str(BIN / word)], argv)
        elif word == "ray":
            check_by_help([str(BIN / "ray"), argv[0]], argv[1:])
        elif word == "pip":
            if "-r" in argv:
                assert (ROOT / argv[argv.index("-r") + 1]).is_file()
        elif word == "jupyter":  # `jupyter X` is the package X, which the lock must install
            assert re.search(rf"^{argv[0]}==", (ROOT / "requirements.lock").read_text(), re.M), \
                f"jupyter {argv[0]}: the package {argv[0]!r} is not in requirements.lock"
        elif word == "source":  # the venv's activation script, which `make setup` makes
            assert (ROOT / argv[0]).is_file(), f"source {argv[0]}: no such file"
        elif word in SHELL_BUILTINS:
            pass
        else:
            assert (BIN / word).exists() or word in SYSTEM and shutil.which(word), \
                f"unknown command {word!r}: check it here or list it in UNCHECKED"


def split_commands(tokens: list[str]):
    part = []
    for token in tokens:
        if token in ("&&", "||", ";", "&", "|"):
            yield part
            part = []
        elif token.endswith(("&", ";")) and token not in ("&", ";") and not token.startswith("'"):
            part.append(token[:-1])
            yield part
            part = []
        else:
            part.append(token)
    yield part


# -- the tests ------------------------------------------------------------------------------------
def test_the_docs_have_commands_to_check():
    words = {shlex.split(c, comments=True)[0] for _, c in COMMANDS}
    assert {"fedtune", "make", "flwr", "flower-superlink", "flower-supernode"} <= words


@pytest.fixture(scope="module")
def env_for_docs():
    import fedtune_app.methods  # noqa: F401 - registers every method's keys

    saved = dict(os.environ)
    os.environ.update({"FLWR_HOME": str(ROOT / ".flwr"), "FLWR_TELEMETRY_ENABLED": "0",
                       "FLWR_DISABLE_UPDATE_CHECK": "1", "HF_HUB_OFFLINE": "1"})
    yield {"PWD": str(ROOT), "FLWR_HOME": str(ROOT / ".flwr"), "HOME": str(Path.home())}
    os.environ.clear()
    os.environ.update(saved)


def by_file():
    out = {}
    for where, command in COMMANDS:
        out.setdefault(where, []).append(command)
    return out


@pytest.mark.parametrize("where", sorted(by_file()))
def test_commands_run_as_written(where, env_for_docs):
    """One code block: its commands in order (a variable set in one is used by the next)."""
    variables = dict(env_for_docs)
    for command in by_file()[where]:
        if any(key in command for key in UNCHECKED):
            continue
        try:
            check_command(command, variables)
        except AssertionError as err:
            raise AssertionError(f"{where}: `{command}`: {err}") from None


def test_every_unchecked_entry_still_matches_a_command():
    stale = [k for k in UNCHECKED if not any(k in c for _, c in COMMANDS)]
    assert not stale, f"UNCHECKED entries that match no command in the docs: {stale}"


def test_python_modules_named_anywhere_in_the_docs_and_presets_exist():
    """``python -m X`` in prose, comments and preset headers too (not only code blocks)."""
    texts = {p: p.read_text() for p in [*DOCS, *sorted((ROOT / "conf").glob("*.toml")),
                                        ROOT / "pyproject.toml", ROOT / "Makefile"]}
    missing = {f"{p.relative_to(ROOT)}: {m}" for p, text in texts.items()
               for m in re.findall(r"python -m ((?:fedtune_app|benchmarks)[\w.]*\w)", text)
               if importlib.util.find_spec(m) is None}
    assert not missing, sorted(missing)


def table_cells(line: str) -> int:
    text = line.strip().removeprefix("|")
    text = text[:-1] if text.endswith("|") and not text.endswith("\\|") else text
    return len(re.split(r"(?<!\\)\|", text))


DIVIDER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def markdown_tables(path: Path):
    """(line, header cells, divider cells, row cell counts) of each table outside code."""
    lines, fence = path.read_text().splitlines(), False
    for i, line in enumerate(lines):
        fence ^= line.lstrip().startswith("```")
        if not fence and i and DIVIDER.match(line) and "|" in lines[i - 1]:
            rows = []
            for row in lines[i + 1:]:
                if "|" not in row or not row.strip():
                    break
                rows.append(table_cells(row))
            yield i + 1, table_cells(lines[i - 1]), table_cells(line), rows


def test_the_table_checker_counts_cells():
    assert table_cells("| a | b \\| c | d |") == 3 and table_cells("a | b") == 2
    assert DIVIDER.match("|---|:--:|") and not DIVIDER.match("| a | b |")


@pytest.mark.parametrize("path", DOCS + sorted((ROOT / "docs" / "claims").rglob("*.md")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_tables_have_as_many_divider_cells_as_header_cells(path):
    bad = [(line, head, div) for line, head, div, _ in markdown_tables(path) if head != div]
    assert not bad, f"{path.relative_to(ROOT)}: (line, header cells, divider cells) {bad}"


def test_the_main_jobs_time_is_stated_once():
    """The main job's wall time is a number in the README only; other pages refer to it."""
    # within one sentence of the phrase
    pattern = re.compile(r"(main job|default job|embedded default)[^.]{0,300}?about [\d.]+ min")
    pages = [ROOT / "pyproject.toml", *DOCS[1:]]
    stated = [str(p.relative_to(ROOT)) for p in pages if pattern.search(p.read_text())]
    assert not stated, f"the main job's time stated outside README.md: {stated}"
    assert re.search(r"It takes about [\d.]+ minutes", (ROOT / "README.md").read_text())
