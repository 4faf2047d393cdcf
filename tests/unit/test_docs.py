"""The README and docs/ stay true to the code: every `routerkt ...` command line in their code blocks
parses with the real argument parser, every metric they name is registered (and every registered
metric is documented), the set-up commands are the Makefile's, every page is linked from the
README, links point at files that exist, and nothing cites notes outside the repository.

Rule for command lines in code blocks: lines ending in `\\` are joined with the next; a `#` comment
is dropped; `<placeholder>` stands for a value and becomes `placeholder`; an optional group
`[...]` is expanded (brackets removed; of `A | B` the first alternative is kept), except that a
group or a word that is only `...` ("and so on") is dropped. Nothing is run: only parsed."""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
METRIC_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks of a Markdown text."""
    blocks, current, inside = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if inside:
                blocks.append("\n".join(current))
                current = []
            inside = not inside
        elif inside:
            current.append(line)
    return blocks


def _joined_lines(block: str) -> list[str]:
    lines, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            lines.append(pending + line)
            pending = ""
    if pending:
        lines.append(pending)
    return lines


def _expand_optional(line: str) -> str:
    """`[--flag V]` -> `--flag V`; `[A | B]` -> `A`; `[--x ...]` and a bare `...` -> nothing."""
    def group(match: re.Match) -> str:
        inner = match.group(1)
        if "..." in inner:
            return " "
        return " " + inner.split(" | ")[0] + " "
    previous = None
    while previous != line:
        previous, line = line, re.sub(r"\[([^\[\]]*)\]", group, line)
    line = re.sub(r"<([^<>\s]+)>", r"\1", line)
    return " ".join(word for word in line.split(" ") if word != "...")


def _command_lines() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in _code_blocks(page.read_text()):
            for line in _joined_lines(block):
                if line.strip().startswith("routerkt "):
                    found.append((page.name, line.strip()))
    return found


def _argv(line: str) -> list[str]:
    return shlex.split(_expand_optional(line), comments=True)[1:]


class _Refused(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _Refused(message)

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise _Refused(message or f"exit {status}")


def _parse(argv: list[str]) -> argparse.Namespace:
    """What routerkt/cli.py main() does up to parse_args, without running the command."""
    from routerkt import cli
    _, modules = cli.build_parser()
    key, rest = argv[0], argv[1:]
    if key in cli.GROUPS:
        assert rest and rest[0] in cli.GROUPS[key], f"unknown {key} command in {argv}"
        key, rest = f"{key} {rest[0]}", rest[1:]
    assert key in modules, f"unknown command {key!r}"
    module = importlib.import_module(modules[key])
    parser = _RaisingParser(prog=f"routerkt {key}")
    module.add_arguments(parser)
    return parser.parse_args(rest)


def test_the_placeholder_rule():
    assert _argv("routerkt serve --repository model_repository [--grpc-port 50051] "
                 "[--store sqlite:///PATH | redis://HOST:PORT/DB]  # comment") == \
        ["serve", "--repository", "model_repository", "--grpc-port", "50051", "--store", "sqlite:///PATH"]
    assert _argv("routerkt bench throughput [--presets ...] [--threads 2]") == ["bench", "throughput", "--threads", "2"]
    assert _argv("routerkt evaluate --run runs/<id> --data x.csv") == ["evaluate", "--run", "runs/id", "--data", "x.csv"]


def test_the_parser_refuses_what_routerkt_refuses():
    with pytest.raises(_Refused):
        _parse(["serve", "--repository", "model_repository", "--no-such-flag"])


COMMANDS = _command_lines()


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 30, COMMANDS
    assert {page for page, _ in COMMANDS} >= {"README.md", "training.md", "benchmarks.md", "operations.md"}


@pytest.mark.parametrize("page,line", COMMANDS, ids=[f"{p}:{line[:60]}" for p, line in COMMANDS])
def test_every_documented_command_parses(page, line):
    try:
        _parse(_argv(line))
    except _Refused as exc:
        pytest.fail(f"{page}: `{line}` does not parse: {exc}")


def _registered_families() -> set[str]:
    from serving.metrics import Metrics
    return {family.name for family in Metrics().registry.collect() if family.name.startswith("routerkt_")}


def _family(name: str, families: set[str]) -> str | None:
    if name in families:
        return name
    for suffix in METRIC_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return None


def test_every_documented_metric_exists():
    from serving.metrics import TRITON_METRICS
    families = _registered_families()
    unknown = set()
    for page in PAGES:
        # (a file name such as routerkt_held_states.py is not a metric)
        for name in set(re.findall(r"\brouterkt_[a-z0-9_]*[a-z0-9]\b(?!\.py)", page.read_text())):
            if _family(name, families) is None and name not in TRITON_METRICS:
                unknown.add(f"{page.name}: {name}")
    assert not unknown, sorted(unknown)


def test_every_registered_metric_is_documented_in_operations():
    text = (ROOT / "docs" / "operations.md").read_text()
    named = set(re.findall(r"\brouterkt_[a-z0-9_]*[a-z0-9]", text))
    families = _registered_families()
    assert len(families) >= 30
    missing = [f for f in sorted(families) if not any(f + s in named for s in ("",) + METRIC_SUFFIXES)]
    assert not missing, f"registered but not in docs/operations.md: {missing}"


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def test_setup_commands_are_the_makefiles():
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].split() for block in _code_blocks(setup) for line in block.splitlines()]
    make_commands = {c[1] for c in commands if len(c) == 2 and c[0] == "make"}
    assert make_commands == {"serve", "test"}
    assert make_commands <= _make_targets()
    assert re.search(r"^\s*make test\b", (ROOT / ".ci" / "run").read_text(), flags=re.M)


def test_setup_text_names_the_torch_pin_and_index():
    pyproject = (ROOT / "pyproject.toml").read_text()
    pin = re.search(r'"(torch==[^"]+)"', pyproject).group(1)
    assert pin.endswith("+cpu")
    readme = README.read_text()
    assert pin in readme
    index = re.search(r"--extra-index-url (https?://[^\s)]+)", (ROOT / "Makefile").read_text()).group(1)
    assert index in readme


def test_every_docs_page_is_linked_from_the_readme_and_the_readme_is_short():
    text = README.read_text()
    assert DOCS, "no docs/*.md"
    for page in DOCS:
        assert f"](docs/{page.name}" in text, f"README does not link docs/{page.name}"
    assert len(text.splitlines()) <= 320


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces -> '-'."""
    prose = re.sub(r"^\s*```.*?^\s*```", "", page.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#+ (.+)$", prose, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_point_at_files_and_headings_that_exist():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path, _, anchor = target.partition("#")
            if re.match(r"^[a-z]+:", path):
                continue
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


# The notes beside the checkout that nothing in the repository may cite (what the project needs from
# them, its own docs say). Spelled in pieces so that this file does not cite them either.
OUTSIDE_NOTES = ["/".join(("shared", folder)) for folder in ("docs", "papers")] + \
    [name + ".md" for name in ("models", "design", "-".join(("serving", "notes")))]


def test_nothing_cites_notes_outside_the_repository():
    """No tracked text file (code, tests, docs, results) names the notes outside the repository."""
    cited = re.compile("|".join(r"(?<![\w-])" + re.escape(name) for name in OUTSIDE_NOTES))
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in tracked:
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue                                  # binary files (plots) cite nothing
        hits += [f"{name}: {m.group(0)}" for m in cited.finditer(text)]
    assert not hits, hits
