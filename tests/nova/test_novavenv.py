"""The Nova venv's cache: keyed by the pin, rebuilt when the pin or the
constraints change, reused otherwise (no pip run here: ``_run`` is recorded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.nova import novavenv


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    monkeypatch.setenv(novavenv.CACHE_ENV, str(tmp_path / "cache"))
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("pbr==7.1.3\n")
    monkeypatch.setattr(novavenv, "CONSTRAINTS", constraints)
    runs: list[list[str]] = []

    def run(command: list[str]) -> None:
        runs.append(command)
        if command[1:3] == ["-m", "venv"]:
            python = Path(command[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.touch()

    monkeypatch.setattr(novavenv, "_run", run)
    return runs


def test_the_venv_is_outside_the_repo_and_keyed_by_the_pin(cache) -> None:
    python = novavenv.ensure(log=lambda _: None)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert python.parent.parent.name == f"venv-{novavenv.NOVA_VERSION}-py{version}"
    assert not python.is_relative_to(novavenv.HERE.parents[1])
    [_, pip] = cache
    assert f"nova=={novavenv.NOVA_VERSION}" in pip and str(novavenv.CONSTRAINTS) in pip


def test_a_built_venv_is_reused(cache) -> None:
    novavenv.ensure(log=lambda _: None)
    novavenv.ensure(log=lambda _: None)
    assert len(cache) == 2  # venv + pip once


def test_new_constraints_or_a_new_pin_rebuild_it(cache, monkeypatch) -> None:
    novavenv.ensure(log=lambda _: None)
    novavenv.CONSTRAINTS.write_text("pbr==7.1.4\n")
    novavenv.ensure(log=lambda _: None)
    assert len(cache) == 4
    monkeypatch.setattr(novavenv, "NOVA_VERSION", "34.0.1")
    novavenv.ensure(log=lambda _: None)
    assert len(cache) == 6 and "nova==34.0.1" in cache[-1]


def test_a_failed_pip_is_an_error_naming_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(novavenv.CACHE_ENV, str(tmp_path))
    with pytest.raises(novavenv.NovaVenvError, match="failed"):
        novavenv._run([sys.executable, "-c", "raise SystemExit(3)"])
