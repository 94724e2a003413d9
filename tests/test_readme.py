"""The README's example runs as printed, and trains: the first thing a newcomer copies must work."""
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_learns():
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    scope = {}
    exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - our own README
    mdl, model = scope["mdl"], scope["model"]
    x, y = scope["images"] / 16, scope["labels"]
    with mdl.no_grad():
        predictions = model(mdl.tensor(x)).numpy().argmax(axis=1)
    assert (predictions == y).mean() > 0.95  # five epochs on the digits: well above chance (0.1)
    assert np.isfinite(scope["loss"].item())
