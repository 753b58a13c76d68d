"""The benchmarks folder keeps only what is cited (issue 17's "benchmarks folder").

- Every file in ``benchmarks/results/`` belongs to a run that NOTES.md, README.md, docs/ or the
  benchmarks' README cite. A file ``<gpu>_<date>_<run>[_<part>].<ext>`` is cited when the text names
  ``<date>_<prefix>`` or ``..._<prefix>`` for some leading part ``<prefix>`` of ``<run>_<part>``
  (cut at underscores) followed by ``.``, ``*``, ``_`` or ``{`` (how NOTES names a run's files:
  ``..._s6_grid.*`` covers ``..._s6_grid_table.txt``).
- Every plain citation ``results/<file>`` (no wildcard, no brace) names a file that exists.
- Every script in ``benchmarks/tools/`` is cited by a document or run by ``device_run.sh``.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TOOLS = ROOT / "benchmarks" / "tools"


def _cited_text() -> str:
    docs = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "NOTES.md"]
    docs += sorted((ROOT / "docs").glob("*.md"))
    return "\n".join(p.read_text() for p in docs)


_NAME = re.compile(r"^(?P<gpu>[a-z0-9]+)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<run>[^.]+)\.")


def _is_cited(name: str, text: str) -> bool:
    m = _NAME.match(name)
    if m is None:
        return name in text
    parts = m["run"].split("_")
    for n in range(len(parts), 0, -1):
        prefix = "_".join(parts[:n])
        for head in (f"{m['date']}_{prefix}", f"..._{prefix}"):
            if re.search(re.escape(head) + r"(?=[.*_{])", text):
                return True
    return False


def test_every_result_file_is_cited():
    text = _cited_text()
    uncited = [p.name for p in sorted(RESULTS.iterdir()) if not _is_cited(p.name, text)]
    assert not uncited, f"results nothing cites (cite them in NOTES.md or delete them): {uncited}"


def test_every_plain_citation_exists():
    text = _cited_text()
    tokens = {t.rstrip(".,") for t in re.findall(r"results/([A-Za-z0-9_.+{},*-]+)", text)}
    plain = {t for t in tokens if "*" not in t and "{" not in t}
    assert len(plain) > 50, "the citation pattern no longer finds NOTES.md's citations"
    missing = sorted(n for n in plain if not (RESULTS / n).exists())
    assert not missing, f"cited but absent from benchmarks/results/: {missing}"


def test_every_tool_is_used():
    text = _cited_text() + (ROOT / "benchmarks" / "device_run.sh").read_text()
    tools = [p for p in sorted(TOOLS.iterdir()) if p.suffix in (".py", ".sh")]
    tools += sorted((TOOLS / "calls").glob("*.sh"))
    unused = [p.name for p in tools if p.name not in text]
    assert not unused, f"tools nothing cites or runs (delete them): {unused}"
