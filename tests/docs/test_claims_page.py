"""The tables of docs/claims.md: built from a notebook's record, each section linked to its anchor."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_ext"))
from claimspage import build_table, inline, section_ids  # noqa: E402 - docs/_ext is not a package
from docutils import nodes  # noqa: E402
from docutils.core import publish_doctree  # noqa: E402

RECORD = {"notebook": "99_x", "title": "X", "machine": "x86_64, 2 cores", "date": "2025-01-01", "seconds": 12.3,
          "cpu_seconds": 10.0,
          "claims": [{"claim": "L1 makes weights **sparse**", "section": "L1 against L2", "seeds": 3,
                      "verdict": "reproduced", "measured": "47% near 0", "code": "`optim.l1_penalty`"},
                     {"claim": "Adam needs more decay", "section": "Gone", "seeds": "deterministic",
                      "verdict": "not at this scale", "measured": "same best decay", "code": ""}]}


def test_inline_markup_becomes_nodes():
    parts = inline("use `F.relu` and **never** sigmoid")
    assert [type(p).__name__ for p in parts] == ["Text", "literal", "Text", "strong", "Text"]
    assert parts[1].astext() == "F.relu" and parts[3].astext() == "never"


def test_a_table_has_a_row_per_claim_and_links_only_known_sections():
    links = {"L1 against L2": "notebooks/99_x.html#l1-against-l2"}
    run, table = build_table(RECORD, links.get)
    assert "2025-01-01" in run.astext() and "12 s (10 s of CPU)" in run.astext()
    rows = list(table.findall(nodes.row))
    assert len(rows) == 3  # the header and one row per claim
    cells = [[entry.astext() for entry in row.findall(nodes.entry)] for row in rows[1:]]
    assert cells[0] == ["L1 makes weights sparse", "L1 against L2, 3 seeds", "47% near 0", "reproduced",
                        "optim.l1_penalty"]
    assert cells[1][1] == "Gone, deterministic" and cells[1][3] == "not at this scale"
    references = list(table.findall(nodes.reference))
    assert [r["refuri"] for r in references] == ["notebooks/99_x.html#l1-against-l2"]


def test_a_title_s_typographic_quotes_match_the_source_s_plain_ones():
    from claimspage import plain_title
    assert plain_title(" Adam’s “four” ") == "Adam's \"four\""


def test_section_ids_reads_a_page_s_anchors():
    doctree = publish_doctree("Title\n=====\n\nA section\n---------\n\ntext\n\nThe other one\n-------------\n\nx\n")
    assert section_ids(doctree) == {"A section": "a-section", "The other one": "the-other-one"}


def test_every_notebook_that_records_claims_has_its_table_on_the_page():
    import json
    import re
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "claims.md").read_text(encoding="utf-8")
    listed = re.findall(r"```\{claims\}\s+(\S+)", page)
    recording = {}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                       if c["cell_type"] == "code")
        names = re.findall(r'ClaimLog\("([^"]+)"', code)
        if names:
            recording[path.stem] = names
    assert recording, "no notebook records claims"
    assert all(names == [stem] for stem, names in recording.items()), "a ClaimLog named other than its notebook"
    assert sorted(listed) == sorted(recording) and len(listed) == len(set(listed))
