"""Shared by every tier: keep accelctl's config cache out of the real
/var/cache (subprocesses inherit the environment)."""

import os
import tempfile

import pytest

from accel_agent.config import cache as config_cache


@pytest.fixture(autouse=True, scope="session")
def _private_config_cache():
    previous = os.environ.get(config_cache.CACHE_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="accel-config-cache-") as directory:
        os.environ[config_cache.CACHE_DIR_ENV] = directory
        yield directory
    if previous is None:
        os.environ.pop(config_cache.CACHE_DIR_ENV, None)
    else:
        os.environ[config_cache.CACHE_DIR_ENV] = previous
