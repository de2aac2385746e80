"""Prebuilt start models: a warm start trained once, kept with the project, verified on every load.

``mgrpo warm-start --config FILE --out DIR`` (``make warm-start``) trains the config's warm start
(:func:`mgrpo_algo.training.trainer.role_model_paths`) and exports each role's folder to ``DIR/<role>`` with a
``DIR/SHA256SUMS`` file. A config that names such a folder as a role's ``model`` loads it like any
``from_pretrained`` folder; :func:`verify_folder` checks it against the checksums first, so a
corrupted or hand-edited start model is refused with the file that differs, never silently used.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CHECKSUMS", "export_models", "verify_folder", "ChecksumError"]

CHECKSUMS = "SHA256SUMS"
# What a role folder needs to load (weights, configs, tokenizer) and what its warm start recorded.
_KEEP = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "chat_template.jinja", "warm_start.json")


class ChecksumError(ValueError):
    """A prebuilt model folder does not match its SHA256SUMS."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_models(paths: Mapping[str, str | Path], out: str | Path) -> Path:
    """Copy each role's model folder to ``out/<role>`` (loadable files only) and write ``out/SHA256SUMS``.

    The folder is replaced as a whole, but for its ``README.md`` (how the models were built: written
    by hand, not a model file, not checksummed), which a rebuild keeps. Returns ``out``.
    """
    out = Path(out)
    readme = out / "README.md"
    kept = readme.read_text() if readme.is_file() else None
    if out.exists():
        shutil.rmtree(out)
    lines = []
    for role, source in sorted(paths.items()):
        target = out / role
        target.mkdir(parents=True)
        for name in _KEEP:
            if (Path(source) / name).is_file():
                shutil.copy2(Path(source) / name, target / name)
        for file in sorted(target.iterdir()):
            lines.append(f"{_sha256(file)}  {role}/{file.name}")
    (out / CHECKSUMS).write_text("\n".join(lines) + "\n")
    if kept is not None:
        readme.write_text(kept)
    return out


def verify_folder(model_dir: str | Path) -> bool:
    """Check a role folder against the ``SHA256SUMS`` of its parent, when there is one.

    Returns True when checked, False when the folder carries no checksums (an ordinary model folder).

    Raises:
        ChecksumError: a listed file is missing or differs, or a file of the folder is not listed.
    """
    folder = Path(model_dir)
    sums = folder.parent / CHECKSUMS
    if not sums.is_file():
        return False
    expected = {}
    for line in sums.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            expected[name.strip()] = digest
    role = folder.name
    listed = {name.split("/", 1)[1]: digest for name, digest in expected.items() if name.startswith(f"{role}/")}
    if not listed:
        raise ChecksumError(f"{sums} lists no file of {folder}")
    for name, digest in listed.items():
        file = folder / name
        if not file.is_file():
            raise ChecksumError(f"{file} is missing (listed in {sums})")
        if _sha256(file) != digest:
            raise ChecksumError(f"{file} does not match {sums}: rebuild it with `make warm-start`")
    extra = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in listed)
    if extra:
        raise ChecksumError(f"{folder} holds files not in {sums}: {extra}")
    return True
