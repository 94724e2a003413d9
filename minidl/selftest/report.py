"""The results stage: every figure into one folder, at most :data:`MAX_FILES` files, none in a subfolder.

    selftest.json              every stage's status, time, findings and figures
    summary.txt                the stage lines and the speed table, as printed
    roofline.png               minidl's ops under the measured ceilings (speed stage)
    step_profile.png           where one training step's time goes (speed stage)

Each file is written to a temporary name and renamed, so a folder never holds
half a file; each stays under :data:`MAX_BYTES`.
"""
from __future__ import annotations

import json
import os

from minidl.serialization import atomic_write, plain

MAX_FILES = 8
MAX_BYTES = 16 << 20
JSON_NAME, SUMMARY_NAME = "selftest.json", "summary.txt"
RESULT_FILES = (JSON_NAME, SUMMARY_NAME, "roofline.png", "step_profile.png")  # what a run writes into --out


def _write_text(path: str, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` through :func:`minidl.serialization.atomic_write`."""
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
    return path


def write_json(results: dict, out: str) -> str:
    """``out/selftest.json``: the stages' records (the roofline suite's raw rows left out: the PNGs hold them)."""
    os.makedirs(out, exist_ok=True)
    kept = {k: v for k, v in results.items() if k != "roofline"}
    text = json.dumps(kept, indent=1, default=lambda value: plain(value, other=str))
    return _write_text(os.path.join(out, JSON_NAME), text)


def write_summary(results: dict, out: str) -> str:
    """``out/summary.txt``: :func:`summary_text`."""
    return _write_text(os.path.join(out, SUMMARY_NAME), summary_text(results))


def speed_table(results: dict) -> list[str]:
    """One line per speed figure: minidl's time, PyTorch's, their ratio."""
    figures = results.get("stages", {}).get("speed", {}).get("figures", {})
    lines = []
    for name in ("mlp", "cnn", "gpt", "optimizer", "launch"):
        figure = figures.get(name)
        if not figure or "minidl" not in figure:
            continue
        torch_ms = figure.get("torch", {}).get("best_ms")
        lines.append(f"  {name:<10} minidl {figure['minidl']['best_ms']:9.3f} ms"
                     + (f"   PyTorch {torch_ms:9.3f} ms   ratio {figure['ratio']:.2f}" if torch_ms else ""))
    roof = figures.get("roofline")
    if roof:
        c = roof["ceilings"]
        peaks = ", ".join(f"{k} {v / 1e12:.1f}" for k, v in roof["gemm_peaks_flops"].items())
        lines.append(f"  roofline   copy {c['copy_bandwidth'] / 1e9:.0f} GB/s, GEMM {roof['gemm_n']}³ TFLOP/s: {peaks}")
    gpt = figures.get("gpt", {})
    if "peak_bytes" in gpt:
        from minidl.memory import format_bytes
        lines.append(f"  GPT step peak memory: {format_bytes(gpt['peak_bytes'])}, with block checkpointing "
                     f"{format_bytes(gpt['peak_bytes_checkpointed'])}"
                     + (f", PyTorch {format_bytes(gpt['torch_peak_bytes'])}" if "torch_peak_bytes" in gpt else ""))
    return lines


def summary_text(results: dict) -> str:
    lines = [f"minidl selftest on {results['device']}{' (quick)' if results['quick'] else ''}"]
    for name, record in results["stages"].items():
        lines.append(f"{name:<12} {record['status']:<9} {record['seconds']:6.1f} s  {record.get('summary', '')}")
        lines += [f"    {f}" for f in record.get("failures", [])[:20]]
    if "passed" in results:
        verdict = "every stage passed" if results["passed"] else "FAILED"
        lines.append(f"verdict: {verdict} in {results['seconds']:.0f} s")
    table = speed_table(results)
    if table:
        lines += ["", "speed (best of the rounds; ratio = median of per-round minidl/PyTorch):", *table]
    return "\n".join(lines) + "\n"


def run(stage) -> dict:
    from minidl.roofline import figures
    out = stage.results["out"]
    os.makedirs(out, exist_ok=True)
    roofline = stage.results.pop("roofline", None)  # its rows go into the PNGs and the speed figures
    written = []
    if roofline:
        for name, make in (("roofline", figures.roofline_figure), ("step_profile", figures.step_profile_figure)):
            written.append(figures.save_figure(make(roofline), os.path.join(out, f"{name}.png")))
    written += [write_json(stage.results, out),
                write_summary(stage.results, out)]
    failures = check_folder(out)
    return {"files": sorted(os.path.basename(p) for p in written), "failures": failures,
            "summary": f"{len(written)} files in {out}/"}


def check_folder(out: str) -> list[str]:
    """What breaks the results' limits: more than MAX_FILES files, a subfolder, a file of MAX_BYTES or more."""
    entries = os.listdir(out)
    problems = [f"{name} is a folder" for name in entries if os.path.isdir(os.path.join(out, name))]
    problems += [f"{name} has {os.path.getsize(os.path.join(out, name)):,} bytes" for name in entries
                 if os.path.isfile(os.path.join(out, name)) and os.path.getsize(os.path.join(out, name)) >= MAX_BYTES]
    if len(entries) > MAX_FILES:
        problems.append(f"{len(entries)} files, more than {MAX_FILES}")
    return problems
