"""`wamkit --help` answers what a newcomer asks: every positional explained, every default shown,
the --set syntax with an example; `wamkit --version`."""

import argparse

import pytest

from wamkit import __version__
from wamkit.cli import HelpFormatter, build_parser, main


def _parsers(parser: argparse.ArgumentParser, name: str = "wamkit"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_positional_has_help_and_every_default_is_shown():
    for name, parser in _parsers(build_parser()):
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction)):
                continue
            if not action.option_strings:
                assert action.help, f"{name}: positional {action.dest} has no help"
            elif not (action.default is None or action.default is False or action.default == []):
                shown = HelpFormatter(name)._get_help_string(action)
                assert "default" in shown, f"{name} {action.option_strings[0]}: default {action.default!r} not in its help"
        assert "(default: %(default)s)" not in text  # the formatter filled every placeholder


def test_set_syntax_is_explained_with_examples(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--set trainer.max_iter=100" in out and "checkpoint.load_path=''" in out and "examples:" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"wamkit {__version__}"
