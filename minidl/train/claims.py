"""The claims a notebook measures, recorded as it runs: what was claimed, what was measured, on what machine.

    from minidl.train.claims import ClaimLog
    claims = ClaimLog("17_generalization", "Generalization")
    ...                                                     # a measurement, and its assert
    claims.add("L1 makes weights sparse, L2 only shrinks them", section="L1 against L2: sparsity",
               seeds=3, verdict="reproduced", measured=f"{l1:.0%} of the L1 weights near 0 against {l2:.0%}",
               code="optim.l1_penalty")
    claims.save()                                           # the notebook's last cell

A claim's ``verdict`` is one of :data:`VERDICTS`: ``"reproduced"`` (the direction
the text states holds over every seed run, by the margin the notebook asserts),
``"partly"`` (part of the claim holds, the notebook says which), ``"not at this
scale"`` (the measurement at this size does not show it; the notebook asserts
what does happen). ``seeds`` is the number of seeds, or a word such as
``"deterministic"`` or ``"exact"`` where no randomness is involved.

``save()`` writes ``<MINIDL_CLAIMS_DIR>/<notebook>.json`` when that environment
variable names a folder (the documentation build sets it, and builds the page of
the chapter's claims, docs/claims.md, from those files: the numbers on the page
are the numbers of the build's run), with the machine, the date and the seconds
the notebook took; without it nothing is written. Either way it prints the claims
as a table and returns the record.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass

from minidl.serialization import atomic_write

__all__ = ["Claim", "ClaimLog", "VERDICTS", "load_records", "machine_description", "seeds_text"]

VERDICTS = ("reproduced", "partly", "not at this scale")
ENVIRONMENT = "MINIDL_CLAIMS_DIR"


@dataclass
class Claim:
    """One claim: the text's statement, the notebook section that measures it, and what it gave."""

    claim: str
    section: str
    seeds: int | str
    verdict: str
    measured: str
    code: str = ""


def machine_description() -> str:
    """The machine in a few words: architecture, CPU model where the system says it, cores."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    cores = os.cpu_count() or 1
    return f"{platform.machine()}{', ' + model if model else ''}, {cores} core{'s' if cores != 1 else ''}"


def seeds_text(seeds) -> str:
    """``3`` → "3 seeds", ``1`` → "1 seed", a word as it is."""
    return f"{seeds} seed{'s' if seeds != 1 else ''}" if isinstance(seeds, int) else str(seeds)


class ClaimLog:
    """The claims one notebook measures; :meth:`add` one per measurement, :meth:`save` at the end.

    ``notebook`` is the notebook's file name without ``.ipynb`` (the name the
    documentation links to); ``title`` its title. The clock starts here.
    """

    def __init__(self, notebook: str, title: str):
        if not isinstance(notebook, str) or not notebook or os.sep in notebook or notebook.endswith(".ipynb"):
            raise ValueError(f"ClaimLog: notebook must be the notebook's file name without .ipynb, got {notebook!r}")
        self.notebook, self.title = notebook, str(title)
        self.claims: list[Claim] = []
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def add(self, claim: str, *, section: str, seeds, verdict: str, measured: str, code: str = "") -> Claim:
        """Record one claim; ``verdict`` one of :data:`VERDICTS`, ``seeds`` a count or a word."""
        if verdict not in VERDICTS:
            raise ValueError(f"ClaimLog.add: verdict must be one of {VERDICTS}, got {verdict!r}")
        if isinstance(seeds, bool) or not isinstance(seeds, (int, str)) or (isinstance(seeds, int) and seeds < 1):
            raise ValueError(f"ClaimLog.add: seeds must be a count >= 1 or a word such as 'deterministic', "
                             f"got {seeds!r}")
        for name, text in (("claim", claim), ("section", section), ("measured", measured)):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"ClaimLog.add: {name} must be a non-empty string, got {text!r}")
        if any(c.claim == claim for c in self.claims):
            raise ValueError(f"ClaimLog.add: the claim {claim!r} is already recorded in {self.notebook}")
        entry = Claim(claim, section, seeds, verdict, measured, code)
        self.claims.append(entry)
        return entry

    def record(self) -> dict:
        """The notebook's record: its claims, the machine, the date, the wall and CPU seconds so far."""
        return {"notebook": self.notebook, "title": self.title, "machine": machine_description(),
                "date": time.strftime("%Y-%m-%d"), "seconds": round(time.perf_counter() - self._wall, 1),
                "cpu_seconds": round(time.process_time() - self._cpu, 1),
                "claims": [asdict(c) for c in self.claims]}

    def save(self, folder: str | None = None) -> dict:
        """Print the claims and write the record to ``folder`` (default: ``$MINIDL_CLAIMS_DIR``, else nowhere)."""
        if not self.claims:
            raise ValueError(f"ClaimLog.save: {self.notebook} recorded no claim; call add() for each measurement")
        record = self.record()
        folder = folder if folder is not None else os.environ.get(ENVIRONMENT)
        if folder:
            text = json.dumps(record, indent=1, ensure_ascii=False)

            def write(tmp):
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)

            atomic_write(os.path.join(folder, f"{self.notebook}.json"), write)
        width = max(len(c.verdict) for c in self.claims)
        for c in self.claims:
            print(f"{c.verdict:>{width}}  {c.claim}  [{seeds_text(c.seeds)}]")
        print(f"{len(self.claims)} claims; the notebook ran in {record['seconds']:.0f} s "
              f"({record['cpu_seconds']:.0f} s of CPU) on {record['machine']}")
        return record


def load_records(folder) -> dict:
    """Every record in ``folder`` (``{notebook: record}``), each checked to hold what :meth:`ClaimLog.save`
    writes; a file that does not raises ValueError naming it."""
    records = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        needed = ("notebook", "title", "machine", "date", "seconds", "cpu_seconds", "claims")
        missing = [k for k in needed if k not in record] if isinstance(record, dict) else list(needed)
        if missing or record["notebook"] != name[:-5]:
            raise ValueError(f"{path}: not a claims record of ClaimLog.save (missing {missing}, or a notebook "
                             "name that is not the file's)")
        for claim in record["claims"]:
            if set(claim) != {f for f in Claim.__dataclass_fields__} or claim["verdict"] not in VERDICTS:
                raise ValueError(f"{path}: a claim without the fields {list(Claim.__dataclass_fields__)} or with "
                                 f"a verdict outside {VERDICTS}: {claim}")
        records[record["notebook"]] = record
    return records
