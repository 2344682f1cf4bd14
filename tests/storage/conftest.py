"""The storage tests: skipped whole without moto's server or obstore; their tokenizer. The
loopback store itself (``loopback_s3``, ``s3``) is a fixture of ``tests/conftest.py``, one per
test process, whichever folder asks for it."""

from __future__ import annotations

import pytest

pytest.importorskip("moto.server", reason="moto's server mode is not installed (pip install 'moto[server]')")
pytest.importorskip("obstore", reason="obstore is not installed (pip install 'speech-dataprep[store]')")


@pytest.fixture(scope="session")
def tiny_spm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 200-piece sentencepiece model (local: a tokenizer is read from disk)."""
    from dataprep.testing import sample_corpus
    from dataprep.tokenize import train_model

    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    train_model(sample_corpus(2000)[1], path, vocab_size=200)
    return str(path)
