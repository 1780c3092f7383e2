"""The profile summary of ``python -m bench.profile``: self and total shares from py-spy's
collapsed stacks."""

from __future__ import annotations

from bench.stacks import function_of, parse, render

STACKS = """\
main (edge/cli.py:10);run (uvloop/__init__.py:92);append (storage/ledger.py:203) 6
main (edge/cli.py:10);run (uvloop/__init__.py:92);append (storage/ledger.py:210) 2
main (edge/cli.py:10);run (uvloop/__init__.py:92) 2
"""


def test_function_of_drops_the_line_number() -> None:
    assert function_of("append (storage/ledger.py:203)") == "append (storage/ledger.py)"


def test_self_and_total_shares() -> None:
    profile = parse(STACKS)
    assert profile.samples == 10
    assert profile.top(profile.self_counts, 1) == [("append (storage/ledger.py)", 80.0, 8)]
    assert dict((n, s) for n, s, _ in profile.top(profile.total_counts, 5))[
        "run (uvloop/__init__.py)"] == 100.0
    assert profile.file_counts["storage/ledger.py"] == 8
    assert "80.0%" in render(profile)
