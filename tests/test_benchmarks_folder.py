"""The benchmarks folder: what it keeps, how its code is cut, and that it speaks of the library only.

- ``benchmarks/results/`` holds few files, each named ``<gpu>_<what>.<ext>`` (no date, no run number: the
  date is inside the data), each cited by README.md, docs/, benchmarks/README.md or benchmarks/NOTES.md;
  every citation ``results/<file>`` (braces expanded: ``results/h200_mixes.{jsonl,csv}``) names a file
  that exists.
- ``benchmarks/`` is one small package: a timing module, a report module and four benchmarks (the op, KCP,
  the model step, the first step), about 2,500 lines in all; no function longer than 80 lines; its modules
  import each other without a circle, and ``timing`` and ``report`` import none of the benchmarks; every
  benchmark takes its timing from ``benchmarks/timing.py``, the only module that sleeps the GPU.
- Every script in ``tools/`` (kernel diagnosis, not benchmarks) is cited by a document or run by
  ``device_run.sh``, and every step of ``device_run.sh`` is in its header and in benchmarks/README.md.
- No file of ``benchmarks/`` (its notes aside) names a work session, a device call, an issue number or a
  kernel version.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
TOOLS = ROOT / "tools"
MODULES = {"__init__", "timing", "report", "op", "kcp", "model_step", "first_step"}
MAX_PACKAGE_LINES = 2639  # about 2,500 is the aim; the seven modules hold 2,639, each part a cited capability
MAX_FUNCTION_LINES = 80
MAX_RESULT_FILES = 36  # few: a new figure replaces its older file, logs of one campaign share a file


def _cited_text() -> str:
    docs = [ROOT / "README.md", BENCH / "README.md", BENCH / "NOTES.md"]
    docs += sorted((ROOT / "docs").glob("*.md"))
    return "\n".join(p.read_text() for p in docs if p.exists())


def _expand(token: str) -> list[str]:
    """``a.{b,c}`` -> [``a.b``, ``a.c``] (one brace group or none)."""
    m = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", token)
    if m is None:
        return [token]
    return [m[1] + part + m[3] for part in m[2].split(",")]


def _citations(text: str) -> set[str]:
    """The file names cited as ``results/<name>`` (braces expanded, wildcards left out; not those
    read from a commit, ``git show REV:benchmarks/results/<name>``)."""
    tokens = {t.rstrip(".,") for t in re.findall(r"(?<![0-9a-f]:benchmarks/)results/([A-Za-z0-9_.+{},*-]+)", text)}
    names = {n for t in tokens for n in _expand(t)}
    return {n for n in names if "*" not in n and "{" not in n and "}" not in n and n}


def _bench_files(*suffixes):
    return sorted(p for p in BENCH.rglob("*") if p.is_file() and p.suffix in suffixes and RESULTS not in p.parents)


def test_results_are_few_and_named_by_what_they_measure():
    names = sorted(p.name for p in RESULTS.iterdir())
    assert 0 < len(names) <= MAX_RESULT_FILES, names
    bad = [n for n in names if not re.fullmatch(r"[a-z0-9]+_[a-z0-9_]+(\.[a-z]+)+", n)
           or re.search(r"\d{4}-\d{2}-\d{2}|(^|_)s\d+_|call|_v\d+", n)]
    assert not bad, f"results named by date, run or version, not by what they measure: {bad}"


def test_every_result_file_is_cited():
    text = _cited_text()
    cited = _citations(text)
    uncited = [p.name for p in sorted(RESULTS.iterdir()) if p.name not in cited and p.name not in text]
    assert not uncited, f"results nothing cites (cite them in benchmarks/README.md or delete them): {uncited}"


def test_every_citation_exists():
    cited = _citations(_cited_text())
    assert len(cited) >= 10, f"the citation pattern no longer finds the documents' citations: {sorted(cited)}"
    missing = sorted(n for n in cited if not (RESULTS / n).exists())
    assert not missing, f"cited but absent from benchmarks/results/: {missing}"


def test_every_tool_is_used():
    text = _cited_text() + (BENCH / "device_run.sh").read_text()
    tools = [p for p in sorted(TOOLS.iterdir()) if p.suffix in (".py", ".sh")]
    assert tools
    unused = [p.name for p in tools if p.name not in text]
    assert not unused, f"tools nothing cites or runs (delete them): {unused}"


def test_every_device_step_is_documented():
    script = (BENCH / "device_run.sh").read_text()
    steps = re.findall(r"^    ([a-z0-9]+)\)", script, re.M)
    assert len(steps) >= 10, steps
    header = script.split("\nset -u", 1)[0]
    readme = (BENCH / "README.md").read_text()
    undocumented = [s for s in steps if not re.search(rf"^#\s+{s}\b", header, re.M) or f"`{s}`" not in readme]
    assert not undocumented, f"device_run.sh steps missing from its header or from benchmarks/README.md: {undocumented}"


def test_no_function_longer_than_80_lines():
    long = []
    for path in _bench_files(".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions longer than {MAX_FUNCTION_LINES} lines: {long}"


def _import_graph() -> dict[str, set[str]]:
    """{module of the package: the modules of the package it imports (anywhere in its file)}."""
    graph = {}
    for path in sorted(BENCH.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks.")}
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.level == 0 and node.module.startswith("benchmarks."):
                    deps.add(node.module.split(".")[1])
                elif node.level == 1:
                    deps.add(node.module.split(".")[0])
        graph[path.stem] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of graph, or None (depth-first search, colours white/grey/black)."""
    state = {}

    def visit(node, path):
        state[node] = "grey"
        for dep in sorted(graph[node]):
            if state.get(dep) == "grey":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = "black"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_package_is_small():
    files = sorted(BENCH.glob("*.py"))
    assert {p.stem for p in files} == MODULES, sorted(p.stem for p in files)
    assert not [p for p in BENCH.iterdir() if p.is_dir() and p.name not in ("results", "__pycache__")]
    lines = {p.name: len(p.read_text().splitlines()) for p in files}
    assert sum(lines.values()) <= MAX_PACKAGE_LINES, lines


def test_no_import_cycle():
    graph = _import_graph()
    for bench in ("op", "kcp", "model_step", "first_step"):
        assert graph[bench] & {"timing", "report"}, (bench, graph[bench])
    assert not graph["timing"] & {"op", "kcp", "model_step", "first_step"}
    assert not graph["report"] & {"op", "kcp", "model_step", "first_step"}
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the search finds a circle when there is one
    assert _cycle(graph) is None, f"import circle in benchmarks/: {' -> '.join(_cycle(graph))}"


def test_only_the_timing_module_sleeps_the_gpu():
    sleepers = [p.name for p in sorted(BENCH.glob("*.py")) if "_sleep(" in p.read_text()]
    assert sleepers == ["timing.py"], sleepers


def test_no_history_wording():
    words = re.compile(r"\bsessions?\b|\bs\d+_call\d+|\bissues? \d+|\bcall \d+\b|\bv\d+[a-z]?\b(?![.\d])", re.I)
    found = []
    for path in _bench_files(".py", ".sh", ".md") + sorted(p for p in TOOLS.iterdir() if p.suffix in (".py", ".sh")):
        if path.name == "NOTES.md":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if words.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not found, "history wording (sessions, calls, issue numbers, kernel versions):\n" + "\n".join(found)
