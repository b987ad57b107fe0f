"""The one thing pyproject.toml cannot say: a built package carries the documents the server
shows at /docs/ (sheepop.serve.documents.shown.files), copied from docs/ at build time, so the
repository holds them once. An editable install reads docs/ itself and copies nothing."""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHOWN = HERE / "src" / "sheepop" / "serve" / "documents" / "shown.py"


class BuildWithDocuments(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        spec = importlib.util.spec_from_file_location("shown", SHOWN)
        shown = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(shown)
        source = HERE / "docs"
        target = Path(self.build_lib) / "sheepop" / "serve" / "documents" / "docs"
        for name in shown.files(source):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)


setup(cmdclass={"build_py": BuildWithDocuments})
