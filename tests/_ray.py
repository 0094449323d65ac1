"""A local Ray instance for the Ray tests, and a tiny model saved where its actors can load it."""

from __future__ import annotations

import logging
from pathlib import Path


def start_ray(num_cpus: int, store_mb: int) -> None:
    """``ray.init`` on this machine; ray gives a new node 30 s to register, which a loaded machine can miss once."""
    import ray

    for attempt in (1, 2):
        try:
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                object_store_memory=store_mb * 2**20,
                logging_level=logging.WARNING,
            )
            return
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise


def saved_tiny_llama(folder: Path) -> Path:
    """The tiny random Llama of :func:`walklens.testing.tiny_model`, saved in ``folder/tiny-llama``."""
    from walklens.testing import tiny_model

    lm0 = tiny_model("llama")
    mdir = folder / "tiny-llama"
    lm0.model.save_pretrained(mdir)
    lm0.tokenizer.save_pretrained(mdir)
    return mdir
