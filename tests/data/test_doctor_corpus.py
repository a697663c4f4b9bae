"""wamkit's verdict on every case of the doctor corpus (tests/data/doctor_corpus.py): exactly the
intended errors (each printed with a fix), at least the intended warnings; where the training loader
can see the problem it raises a DataError naming the file or field, and every case without errors
is read window by window as training reads it. The comparison with lerobot-doctor is
benchmarks/doctor_coverage.py (it needs lerobot-doctor installed; this test does not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.doctor_corpus import CASES, build_case, read_all_windows, write_base
from wamkit.data.doctor import diagnose
from wamkit.errors import DataError


@pytest.fixture(scope="module")
def base_root(tmp_path_factory) -> Path:
    return write_base(tmp_path_factory.mktemp("corpus") / "demo")


def test_corpus_size_and_names():
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)
    assert sum(not c.breaks_training for c in CASES) >= 10 and sum(c.breaks_training for c in CASES) >= 30


def test_base_is_clean(base_root):
    report = diagnose(base_root, CASES[0].expect)
    assert report.findings == [], report.format()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_wamkit_verdict(case, base_root, tmp_path):
    root = build_case(case, base_root, tmp_path / "ds")
    report = diagnose(root, case.expect)
    text = report.format()
    assert report.codes("error") == case.errors, text
    assert case.warnings <= report.codes("warning"), text
    assert all(f.fix for f in report.findings), text
    if case.loader:
        with pytest.raises(DataError) as info:
            read_all_windows(root, case.expect)
        assert case.loader in str(info.value)
    elif not case.breaks_training:
        assert read_all_windows(root, case.expect) > 0
