"""docs/ is the one copy of the maths pages: a built package carries them, copied from docs/ by
setup.py's build_py, and serves them from there (sheepop.serve.documents.shown).

The wheel is built by pip from a copy of the checkout (no build isolation: the venv's
setuptools, no network; ~10 s), then unpacked alone on a Python path where no docs/ is near:
what an installed package sees."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sheepop.serve.documents import shown

ROOT = Path(__file__).resolve().parents[2]
BUILT_FROM = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "src", "docs")
IN_WHEEL = "sheepop/serve/documents/docs/"

SERVE_FROM_THE_WHEEL = """
import sys
from pathlib import Path
from starlette.applications import Starlette
from starlette.testclient import TestClient
import sheepop
from sheepop.serve.documents import routes, shown
assert Path(sheepop.__file__).is_relative_to(Path(sys.argv[1])), sheepop.__file__
assert shown.root() == shown.SHIPPED and shown.SHIPPED.is_relative_to(Path(sys.argv[1]))
client = TestClient(Starlette(routes=routes.ROUTES))
page = client.get("/docs/math/04-attention.md")
picture = client.get("/docs/images/attention.png")
print(page.status_code, picture.status_code, len(shown.files(shown.root())))
print(page.text)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source, out = tmp_path_factory.mktemp("checkout"), tmp_path_factory.mktemp("wheel")
    for name in BUILT_FROM:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copyfile
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns(
            "__pycache__", "*.egg-info")} if (ROOT / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(source)], check=True, timeout=300,
                   capture_output=True)
    (built,) = out.glob("sheepop-*.whl")
    return built


def test_the_wheel_carries_every_shown_file_as_docs_has_it(wheel):
    wanted = shown.files(shown.SOURCE)
    assert len(wanted) > 30
    assert "math/04-attention.md" in wanted and "images/attention.png" in wanted
    with zipfile.ZipFile(wheel) as z:
        carried = sorted(n[len(IN_WHEEL):] for n in z.namelist() if n.startswith(IN_WHEEL))
        assert carried == sorted(wanted)
        for name in wanted:
            assert z.read(IN_WHEEL + name) == (shown.SOURCE / name).read_bytes(), name


def test_the_installed_package_serves_its_own_copy(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    run = subprocess.run([sys.executable, "-c", SERVE_FROM_THE_WHEEL, str(tmp_path / "site")],
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    statuses, _, page = run.stdout.partition("\n")
    assert statuses == f"200 200 {len(shown.files(shown.SOURCE))}"
    assert "<title>4. Multi-head causal self-attention · sheepop</title>" in page
    assert "<math" in page
