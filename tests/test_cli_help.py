"""`minidl --help` and every subcommand's: a description, one line of help per option with its default."""
import argparse
import os
import re

import pytest

from minidl.cli import build_parser, default_out, main

RAW_MARKUP = re.compile(r"``|:(func|class|mod|meth|ref):`|\*\*")


def _subparsers(parser):
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in action._choices_actions}
    return action.choices, helps


def _commands():
    return sorted(_subparsers(build_parser())[0])


def test_every_command_is_listed_with_help():
    commands, helps = _subparsers(build_parser())
    assert {"gradcheck", "train", "diagnose", "optimizers", "lr-find", "bench", "predict"} <= set(commands)
    for name in commands:
        assert helps.get(name), f"minidl {name} has no one-line help in 'minidl --help'"


def _nested(name, parser):
    """The parser of ``name`` and of each subcommand below it (``gpt train``, ``gpt sample``)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child, child_parser in action.choices.items():
                yield from _nested(f"{name} {child}", child_parser)


ALL_PARSERS = dict(item for command, parser in _subparsers(build_parser())[0].items()
                   for item in _nested(command, parser))


@pytest.mark.parametrize("name", sorted(ALL_PARSERS))
def test_every_option_has_help_and_its_default(name):
    parser = ALL_PARSERS[name]
    assert parser.description and not RAW_MARKUP.search(parser.description), f"minidl {name}: description"
    text = parser.format_help()
    assert not RAW_MARKUP.search(text), f"minidl {name} --help shows raw reStructuredText markup"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        label = action.option_strings[-1] if action.option_strings else action.dest
        assert action.help and action.help.strip(), f"minidl {name} {label}: no help text"
        takes_value = action.option_strings and action.nargs != 0
        if takes_value:  # an option that takes a value says what it is when not given
            shown = parser._get_formatter()._get_help_string(action)
            assert "default" in shown, f"minidl {name} {label}: the help does not show the default ({shown!r})"


def test_defaults_are_shown_as_typed(capsys):
    with pytest.raises(SystemExit):
        main(["gradcheck", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "finite-difference step (default: 1e-06)" in out and "(default: every op)" in out
    with pytest.raises(SystemExit):
        main(["lr-find", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "first learning rate (default: 1e-05)" in out and "(default: runs/lr-find-<time>)" in out


def test_default_out_folder_is_named_after_the_command(tmp_path, monkeypatch):
    import datetime
    monkeypatch.chdir(tmp_path)
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert default_out("bench", now) == "runs/bench-20260102-030405"
    assert os.path.isdir("runs/bench-20260102-030405")   # taken: created by the call that named it
    assert default_out("bench", now) == "runs/bench-20260102-030405-2"  # never into an earlier run's folder
