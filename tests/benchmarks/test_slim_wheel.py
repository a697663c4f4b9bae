"""benchmarks/slim_wheel.py --drop on a hand-made wheel: the folder and its RECORD lines go, the rest installs
and imports; a folder the wheel lacks is refused before the wheel is touched."""

import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "benchmarks" / "slim_wheel.py"
DIST = "toypkg-1.0.dist-info"


def _make_wheel(path):
    files = {
        "toypkg/__init__.py": "from .core import answer\n",
        "toypkg/core.py": "answer = 42\n",
        "toypkg/pipelines/__init__.py": "raise ImportError('pipelines were meant to be left out')\n",
        "toypkg/pipelines/big.py": "x = 1\n" * 1000,
        f"{DIST}/METADATA": "Metadata-Version: 2.1\nName: toypkg\nVersion: 1.0\n",
        f"{DIST}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{DIST}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(f"{DIST}/RECORD", record)


def _slim(wheel, *args):
    return subprocess.run([sys.executable, str(SCRIPT), str(wheel), *args], capture_output=True, text=True)


def test_drop_removes_the_folder_and_its_record_lines_and_the_rest_installs(tmp_path):
    wheel = tmp_path / "toypkg-1.0-py3-none-any.whl"
    _make_wheel(wheel)
    done = _slim(wheel, "--drop", "toypkg/pipelines")
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(wheel) as slimmed:
        names = slimmed.namelist()
        record = slimmed.read(f"{DIST}/RECORD").decode()
    assert not [n for n in names if n.startswith("toypkg/pipelines/")]
    assert "pipelines" not in record
    assert "toypkg/core.py" in names and "toypkg/core.py," in record

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    str(wheel)], check=True)
    assert not (target / "toypkg" / "pipelines").exists()
    imported = subprocess.run([sys.executable, "-c", "import toypkg; print(toypkg.answer)"], cwd=target,
                              capture_output=True, text=True)
    assert imported.stdout.strip() == "42", imported.stderr


def test_drop_of_a_missing_folder_is_refused_and_leaves_the_wheel_alone(tmp_path):
    wheel = tmp_path / "toypkg-1.0-py3-none-any.whl"
    _make_wheel(wheel)
    before = wheel.read_bytes()
    done = _slim(wheel, "--drop", "toypkg/pipeline")
    assert done.returncode != 0
    assert "no folder toypkg/pipeline/" in done.stderr
    assert wheel.read_bytes() == before


@pytest.mark.parametrize("folder", ["toypkg/pipelines", "toypkg/pipelines/"])
def test_a_trailing_slash_names_the_same_folder(tmp_path, folder):
    wheel = tmp_path / "toypkg-1.0-py3-none-any.whl"
    _make_wheel(wheel)
    assert _slim(wheel, "--drop", folder).returncode == 0
    with zipfile.ZipFile(wheel) as slimmed:
        assert not [n for n in slimmed.namelist() if "pipelines" in n]
