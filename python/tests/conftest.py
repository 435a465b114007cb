"""conftest.py - what every test of the Python module shares: a private
XDG_RUNTIME_DIR, so each test's pools live apart (children inherit it)."""

import os
import tempfile

import pytest


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch):
    with tempfile.TemporaryDirectory(prefix="xmem-py-") as path:
        os.chmod(path, 0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", path)
        yield path
