"""The claim record the notebooks write (minidl.train.claims), read back as the docs build reads it."""
import json

import pytest

from minidl.train.claims import VERDICTS, ClaimLog, load_records, seeds_text


def _log():
    log = ClaimLog("99_example", "Example")
    log.add("Small batches find flatter minima", section="Batch size", seeds=3, verdict="reproduced",
            measured="trace 7.5 against 12.5", code="`train.sharpness`")
    log.add("Adam needs more regularization", section="Adam", seeds="deterministic", verdict="not at this scale",
            measured="both best at 0.003")
    return log


def test_save_writes_the_record_where_the_environment_says_and_it_reads_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINIDL_CLAIMS_DIR", str(tmp_path))
    record = _log().save()
    on_disk = json.loads((tmp_path / "99_example.json").read_text(encoding="utf-8"))
    assert on_disk == record
    assert [c["verdict"] for c in on_disk["claims"]] == ["reproduced", "not at this scale"]
    assert on_disk["claims"][1]["seeds"] == "deterministic" and on_disk["notebook"] == "99_example"
    assert on_disk["seconds"] >= 0 and on_disk["cpu_seconds"] >= 0 and "core" in on_disk["machine"]
    assert load_records(tmp_path) == {"99_example": record}
    printed = capsys.readouterr().out
    assert "reproduced  Small batches find flatter minima  [3 seeds]" in printed and "2 claims" in printed


def test_without_a_folder_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIDL_CLAIMS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    _log().save()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change, match", [
    ({"verdict": "holds"}, "verdict must be one of"),
    ({"seeds": 0}, "seeds must be a count"),
    ({"seeds": True}, "seeds must be a count"),
    ({"measured": " "}, "measured must be a non-empty string"),
])
def test_a_bad_claim_is_refused_by_name(change, match):
    kwargs = dict(section="s", seeds=1, verdict="reproduced", measured="m", **{})
    kwargs.update(change)
    with pytest.raises(ValueError, match=match):
        ClaimLog("01_x", "X").add("a claim", **kwargs)


def test_a_claim_is_recorded_once_and_a_log_needs_one():
    log = _log()
    with pytest.raises(ValueError, match="already recorded"):
        log.add("Small batches find flatter minima", section="s", seeds=1, verdict="partly", measured="m")
    with pytest.raises(ValueError, match="recorded no claim"):
        ClaimLog("01_x", "X").save()
    with pytest.raises(ValueError, match="without .ipynb"):
        ClaimLog("01_x.ipynb", "X")


def test_a_record_that_is_not_one_is_named(tmp_path):
    (tmp_path / "01_x.json").write_text(json.dumps({"notebook": "02_y"}), encoding="utf-8")
    with pytest.raises(ValueError, match="01_x.json"):
        load_records(tmp_path)
    assert load_records(tmp_path / "missing") == {}


def test_seeds_text_and_the_verdicts():
    assert (seeds_text(1), seeds_text(3), seeds_text("exact")) == ("1 seed", "3 seeds", "exact")
    assert VERDICTS == ("reproduced", "partly", "not at this scale")
