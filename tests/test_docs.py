"""Every ```python block of the documentation site runs, so the docs cannot drift from the code.

Each block of ``docs/**/*.md`` is a whole program: it runs alone, in a fresh interpreter
(this tree first on the path), in an empty temporary directory, and must exit 0 within
the time bound (its asserts are the check). A block that is not meant to run (a
fragment, a sketch of a deployment) is preceded by ``<!-- no-run: REASON -->``, and the
reason may not be empty. Other fences (``text``, ``bash``, ``console``) are not code.

A ``text`` fence preceded by ``<!-- output -->`` is what the python block before it
prints: the block's standard output must be exactly that text, so a page that shows
what the reader will see stays true. A block preceded by ``<!-- needs: postgresql -->``
starts a throwaway PostgreSQL itself (``idempotency.stores.pgcluster``) and is skipped,
saying why, where PostgreSQL or psycopg is not installed.

The examples of the docstrings the reference renders run the same way: each reST literal
block (``Quick use::`` and an indented block) of a rendered module's docstring, or of a
public name's, is a whole program.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# A fenced block at the start of a line: an optional marker on the line before (no-run
# with its reason, output, needs with what), the info string, the body, the closing fence.
_FENCE = re.compile(
    r"^(?:<!-- (?:no-run:(?P<reason>[^>]*)|(?P<output>output) |needs: (?P<needs>[\w-]+) )-->\n)?"
    r"```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$",
    re.M | re.S,
)
# The things a ``<!-- needs: X -->`` block may name (_missing says why one is absent).
_NEEDS = ("postgresql",)
_SECONDS = 120  # a bound for a loaded 2-core machine; the blocks take about a second


class Block:
    def __init__(
        self,
        page: Path,
        line: int,
        info: str,
        body: str,
        reason: str | None,
        is_output: bool = False,
        needs: str | None = None,
    ) -> None:
        self.page = page
        self.line = line
        self.info = info
        self.body = body
        self.reason = reason
        self.is_output = is_output  # the shown output of the python block before it
        self.needs = needs
        self.output: Block | None = None  # for a python block: its shown output, if any

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def parse(page: Path, text: str) -> list[Block]:
    """The fenced blocks of one page, each output block attached to the python block
    before it (the one python block since the previous python block or output)."""
    out: list[Block] = []
    last_python: Block | None = None
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start("info")) + 1
        block = Block(
            page,
            line,
            m["info"].strip(),
            m["body"],
            m["reason"],
            m["output"] is not None,
            m["needs"],
        )
        if block.is_output:
            assert block.info == "text", f"{block.name}: an output block is a ```text fence"
            assert last_python is not None, (
                f"{block.name}: an output block with no python block before it"
            )
            assert last_python.output is None, (
                f"{block.name}: a second output block for {last_python.name}"
            )
            assert last_python.reason is None, (
                f"{block.name}: the output of a block that does not run"
            )
            last_python.output = block
        if block.needs is not None:
            assert block.needs in _NEEDS, f"{block.name}: unknown need {block.needs!r}"
        if block.info.split()[:1] == ["python"]:
            last_python = block
        out.append(block)
    return out


def blocks() -> list[Block]:
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        out.extend(parse(page, page.read_text(encoding="utf-8")))
    return out


def _missing(need: str) -> str | None:
    """Why a block that needs ``need`` cannot run here, or None."""
    if need == "postgresql":
        from idempotency.stores.pgcluster import PG_BIN  # noqa: PLC0415

        if PG_BIN is None:
            return "PostgreSQL is not installed (apt-get install postgresql)"
        try:
            import psycopg  # noqa: F401, PLC0415
        except ImportError:
            return "psycopg is not installed (pip install -e '.[postgres]')"
    return None


def python_blocks() -> list[Block]:
    return [b for b in blocks() if b.info.split()[:1] == ["python"]]


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.name)
def test_block_runs(block: Block, tmp_path: Path) -> None:
    if block.reason is not None:
        assert block.reason.strip(), f"{block.name}: a no-run marker must say why"
        pytest.skip(f"marked no-run: {block.reason.strip()}")
    if block.needs is not None and (why := _missing(block.needs)) is not None:
        pytest.skip(f"needs {block.needs}: {why}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", block.body],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=_SECONDS,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{block.name} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    if block.output is not None:
        assert proc.stdout == block.output.body, (
            f"{block.name} printed what {block.output.name} does not show:\n"
            f"--- printed\n{proc.stdout}--- shown\n{block.output.body}"
        )


def test_output_blocks_are_attached() -> None:
    """An output block belongs to the python block before it; one that follows text or
    a second output, or shows the output of a block that does not run, is an error."""
    page = DOCS / "example.md"
    text = (
        "```python\nprint(1)\n```\n\nIt prints:\n\n<!-- output -->\n```text\n1\n```\n\n"
        "```python\nx = 1\n```\n"
    )
    first, shown, second = parse(page, text)
    assert first.output is shown and shown.is_output and shown.body == "1\n"
    assert second.output is None
    for bad in (
        "<!-- output -->\n```text\n1\n```\n",  # no python block before it
        "```python\nprint(1)\n```\n<!-- output -->\n```text\n1\n```\n"
        "<!-- output -->\n```text\n1\n```\n",  # two outputs for one block
        "<!-- no-run: a sketch -->\n```python\nprint(1)\n```\n"
        "<!-- output -->\n```text\n1\n```\n",  # the output of a block that does not run
        "```python\nprint(1)\n```\n<!-- output -->\n```console\n1\n```\n",  # not text
    ):
        with pytest.raises(AssertionError):
            parse(page, bad)


def test_tutorial_examples_show_their_output() -> None:
    """Every example of the tutorial that runs prints what it computes, and the page
    shows it."""
    tutorial = [b for b in python_blocks() if b.page.parent == DOCS / "tutorial"]
    assert len({b.page for b in tutorial}) >= 6, "the tutorial's pages have no examples"
    for block in tutorial:
        if block.reason is not None:  # a deployment sketch, not an example
            continue
        assert block.output is not None, f"{block.name}: shows no output (<!-- output -->)"
        assert block.output.body.strip(), f"{block.name}: shows an empty output"


def test_every_code_fence_says_its_language() -> None:
    """A python block written ```py or with no language would silently not run."""
    for block in blocks():
        lang = block.info.split()[:1]
        assert lang, f"{block.name}: a fence without a language"
        # no mermaid: the site reads offline, and a diagram is an SVG in docs/img
        assert lang[0] in ("python", "text", "bash", "console", "toml", "yaml"), (
            f"{block.name}: unknown fence language {lang[0]!r}"
        )


def test_the_guides_have_code_that_runs() -> None:
    """The extraction finds the guides' examples (an empty match would pass every page)."""
    running = [b for b in python_blocks() if b.reason is None]
    pages = {b.page.relative_to(DOCS).as_posix() for b in running}
    for page in (
        "getting-started.md",
        "guides/goroutines.md",
        "guides/services.md",
        "guides/linearizability.md",
        "guides/netframe.md",
        "guides/idempotency.md",
        "guides/rpc.md",
    ):
        assert page in pages, f"docs/{page} has no python block that runs"


def test_the_reference_covers_every_public_name() -> None:
    """Each package's reference page renders the package, whose __all__ mkdocstrings
    follows; every name of that __all__ must exist (a stale entry would break the build
    with a less clear message)."""
    import gosim  # noqa: PLC0415 -- imported here: the test is about these packages
    import idempotency  # noqa: PLC0415
    import idempotency.rpc  # noqa: PLC0415
    import netframe  # noqa: PLC0415

    pages = {
        "gosim": (gosim, "reference/gosim.md"),
        "netframe": (netframe, "reference/netframe.md"),
        "idempotency": (idempotency, "reference/idempotency.md"),
        "idempotency.rpc": (idempotency.rpc, "reference/rpc.md"),
    }
    for name, (module, page) in pages.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        assert f"::: {name}\n" in text, f"docs/{page} does not render {name}"
        for public in module.__all__:
            assert hasattr(module, public), f"{name}.__all__ names {public!r}, which is missing"
        public_reexports = {
            n
            for n, obj in vars(module).items()
            if not n.startswith("_")
            and getattr(obj, "__module__", "").startswith(name + ".")
            and not isinstance(obj, type(os))
        }
        missing = public_reexports - set(module.__all__)
        assert not missing, f"{name} exports {sorted(missing)} without listing them in __all__"


def test_statistics_types_have_one_naming() -> None:
    """What a ``statistics()`` returns is named ``...Statistics`` across the public API,
    as trio names its own (``ParkingLotStatistics``); the one exception is gosim.mem,
    whose ``MemStats`` (and its ``PerP`` entries, ``PStats``) keep Go's
    ``runtime.MemStats`` name, as its fields keep Go's."""
    import importlib  # noqa: PLC0415 -- imported here: the test is about these packages

    go_names = {"gosim.mem": {"MemStats", "PStats"}}
    packages = (
        "gosim",
        "gosim.lowlevel",
        "gosim.sync",
        "gosim.context",
        "gosim.net",
        "gosim.mem",
        "netframe",
        "idempotency",
        "idempotency.rpc",
        "idempotency.stores",
    )
    for name in packages:
        module = importlib.import_module(name)
        public = set(getattr(module, "__all__", ())) - go_names.get(name, set())
        odd = sorted(n for n in public if n.endswith("Stats") or n.endswith("Stat"))
        assert not odd, f"{name} names {odd}: say ...Statistics, as statistics() does"


# -- the docstrings' examples ------------------------------------------------------------

# A `::: module` line of a reference page: the modules whose docstrings the site renders.
_RENDERED = re.compile(r"^::: ([\w.]+)$", re.M)


def rendered_modules() -> list[str]:
    names: set[str] = set()
    for page in sorted((DOCS / "reference").glob("*.md")):
        names.update(_RENDERED.findall(page.read_text(encoding="utf-8")))
    return sorted(names)


def literal_blocks(doc: str) -> list[tuple[int, str]]:
    """The reST literal blocks of a docstring (a paragraph ending in ``::``, then an
    indented block), dedented, with the line each starts on."""
    lines = inspect.cleandoc(doc).split("\n")
    out = []
    for n, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        body = []
        for after in lines[n + 1 :]:
            if after.strip() and len(after) - len(after.lstrip()) <= len(line) - len(line.lstrip()):
                break
            body.append(after)
        if any(b.strip() for b in body):
            out.append((n + 2, textwrap.dedent("\n".join(body)).strip() + "\n"))
    return out


def public_docstrings() -> dict[str, str]:
    """Every docstring the reference renders: each rendered module's own, and those of
    the names in its ``__all__`` and of their public attributes."""
    import importlib  # noqa: PLC0415 -- imported here: the test is about these packages

    docs: dict[str, str] = {}
    for name in rendered_modules():
        module = importlib.import_module(name)
        docs[name] = module.__doc__ or ""
        for public in getattr(module, "__all__", ()):
            obj = getattr(module, public)
            docs[f"{name}.{public}"] = getattr(obj, "__doc__", None) or ""
            if isinstance(obj, type):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_"):
                        doc = getattr(member, "__doc__", None) or ""
                        docs[f"{name}.{public}.{attr}"] = doc
    return docs


def docstring_examples() -> list[tuple[str, str]]:
    examples = []
    for owner, doc in public_docstrings().items():
        if isinstance(doc, str):
            examples.extend((f"{owner}:{line}", body) for line, body in literal_blocks(doc))
    return examples


@pytest.mark.parametrize(("where", "body"), docstring_examples(), ids=lambda v: v[:60])
def test_docstring_example_runs(where: str, body: str, tmp_path: Path) -> None:
    """Every example of a public docstring (a reST literal block, shown on the site as a
    python block) is a whole program that runs, as the pages' blocks are."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", body],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=_SECONDS,
        check=False,
    )
    assert proc.returncode == 0, f"{where} failed (exit {proc.returncode}):\n{proc.stderr}"


def test_the_docstring_examples_are_found() -> None:
    """The extraction finds the package docstrings' examples (an empty match would pass)."""
    owners = {where.rsplit(":", 1)[0] for where, _ in docstring_examples()}
    for name in ("gosim", "gosim.signal", "netframe", "idempotency"):
        assert name in owners, f"no example found in {name}'s docstring"
