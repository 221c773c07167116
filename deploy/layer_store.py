"""A build's layer store: the one owner of its layout.

`<root>/<diff ID hex>.tar` is a layer's tar, the bytes whose sha256 is its diff ID, written whole or
not at all; `<root>/<image ID hex>.json` is an assembled image's config, whose sha256 is the image ID.
The build writes them (toolchain/image/layers.py, toolchain/image/venv_layer.py), the push compresses the tars and
sends the config (toolchain/publish/layer_sources.py, toolchain/publish/push.py), the incremental .sqsh appends the top
ones (deploy/targets/pyxis/enroot_incremental.py). Each asks the store for a path by digest; none
spells a file name. A digest that is not one is refused here, so no name can leave the root.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

from runtime.digest import Digest
from runtime.files import read_regular

MAX_CONFIG = 16 << 20  # an image config (the example's: 30 KiB)


class LayerStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def of(cls, where: "LayerStore | os.PathLike | str") -> "LayerStore":
        """WHERE as a store: a LayerStore, or the directory of one (what a caller outside the build holds)."""
        return where if isinstance(where, LayerStore) else cls(Path(where))

    def __repr__(self) -> str:
        return f"LayerStore({str(self.root)!r})"

    def __str__(self) -> str:  # messages name the directory
        return str(self.root)

    def tar(self, diff_id: str) -> Path:
        """Where the layer's tar is, or goes."""
        return self.root / f"{Digest(diff_id, 'layer diff ID').hex}.tar"

    def config(self, image_id: str) -> Path:
        """Where the image's config is, or goes."""
        return self.root / f"{Digest(image_id, 'image ID').hex}.json"

    def read_config(self, image_id: str) -> Optional[bytes]:
        """The image's config bytes when the store has them and they are that image's (their sha256 is its
        ID); None otherwise. Bounded (MAX_CONFIG), and only a regular file is read."""
        try:
            data = read_regular(self.config(image_id), MAX_CONFIG)
        except OSError:
            return None
        return data if Digest.of(data) == Digest(image_id, "image ID") else None

    def has_tar(self, diff_id: str) -> bool:
        return self.tar(diff_id).is_file()

    def has_config(self, image_id: str) -> bool:
        return self.config(image_id).is_file()

    def tar_size(self, diff_id: str) -> Optional[int]:
        """The tar's size (the layer's uncompressed size); None when it is not here."""
        try:
            return self.tar(diff_id).stat().st_size
        except OSError:
            return None

    def partial(self, what: str) -> Path:
        """A file to write before it is renamed into place (this process's, in the store's directory)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / f".{what}.{os.getpid()}.partial"

    def put_tar(self, tmp: Path, diff_id: str) -> Path:
        """Move a finished tar (written at `partial`) into place."""
        return tmp.replace(self.tar(diff_id))

    def drop_tar(self, diff_id: str, smaller_than: int = 0) -> None:
        """Delete the layer's tar unless it is smaller than SMALLER_THAN bytes."""
        path = self.tar(diff_id)
        try:
            if path.stat().st_size >= smaller_than:
                path.unlink()
        except FileNotFoundError:
            pass

    def prune_big(self, keep: Iterable[Path], newest: int, min_bytes: int) -> list[Path]:
        """Delete the tars of MIN_BYTES and up but those in KEEP and the NEWEST most recent others (their
        layers are written again when a build needs them); the paths deleted."""
        keep = set(keep)
        big = []
        for p in self.root.glob("*.tar"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if st.st_size >= min_bytes and p not in keep:
                big.append((st.st_mtime, p))
        big.sort(reverse=True)
        gone = [p for _, p in big[max(0, newest - len(keep)):]]
        for p in gone:
            p.unlink(missing_ok=True)
        return gone
