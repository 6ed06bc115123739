"""Read a TorchScript archive's module tree and tensors without torch, running none of its code.

A TorchScript file (``torch.jit.save``) is a zip: ``<root>/data.pkl`` pickles the module
tree (each module an object of a ``__torch__.*`` class whose state is a dict of attributes,
submodules and tensors), ``<root>/data/<key>`` holds each tensor storage's raw bytes
(``<root>/byteorder`` says which order), ``<root>/constants.pkl`` the tensors the code uses
as constants, and ``<root>/code/`` the modules' TorchScript source (text; never executed
here). Unpickling is restricted to what such a tree needs: ``collections.OrderedDict``,
torch's tensor rebuild functions and storage types (mapped to numpy builders and dtypes
here) and ``__torch__.*`` classes (mapped to :class:`ScriptObject`, an attribute holder
with no behaviour). Any other global is refused, so a crafted file cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["ScriptObject", "TorchScriptArchive", "TorchScriptError", "state_dict"]

#: torch's storage classes (``torch.<Name>``) and the numpy dtypes of their elements.
_STORAGES: dict[str, str] = {
    "FloatStorage": "f4",
    "DoubleStorage": "f8",
    "HalfStorage": "f2",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}


class TorchScriptError(ValueError):
    """A file is not a TorchScript archive this reader accepts (message names the file)."""


class ScriptObject:
    """An object of a ``__torch__.*`` class: its pickled attributes, nothing else.

    ``torch_type`` is the class's qualified name (``__torch__.torch.nn.modules.conv.Conv2d``,
    with any ``___torch_mangle_N`` part); attributes are set from the pickled state.
    """

    torch_type = ""

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"{self.torch_type}: state is not a dict")
        self.__dict__.update(state)

    @property
    def kind(self) -> str:
        """The class name without module or mangling (``"Conv2d"``)."""
        return self.torch_type.rsplit(".", 1)[-1]

    def children(self) -> list[tuple[str, ScriptObject]]:
        """Submodules in the pickled order, as (attribute, module)."""
        return [(k, v) for k, v in self.__dict__.items() if isinstance(v, ScriptObject)]

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        """Return the module's own tensors (parameters and buffers), as (attribute, array)."""
        return [(k, v) for k, v in self.__dict__.items() if isinstance(v, np.ndarray)]

    def __getattr__(self, name: str) -> Any:
        """Pickled attributes are set on the object; any other is missing (said so)."""
        raise AttributeError(f"{self.torch_type or 'module'} has no attribute {name!r}")

    def __getitem__(self, key: str | int) -> ScriptObject:
        """Submodule ``key`` of a container (``seq[0]``, ``blocks["1"]``)."""
        value = self.__dict__[str(key)]
        if not isinstance(value, ScriptObject):
            raise KeyError(f"{self.torch_type}: {key!r} is not a submodule")
        return value

    def __repr__(self) -> str:
        return f"<{self.kind} {sorted(self.__dict__)}>"


_CLASSES: dict[str, type[ScriptObject]] = {}


def _script_class(name: str) -> type[ScriptObject]:
    """One inert :class:`ScriptObject` subclass per TorchScript class name."""
    cls = _CLASSES.get(name)
    if cls is None:
        cls = type(name.rsplit(".", 1)[-1], (ScriptObject,), {"torch_type": name})
        _CLASSES[name] = cls
    return cls


class _StorageType:
    """What ``torch.FloatStorage`` and kin unpickle to: the element dtype."""

    def __init__(self, dtype: str) -> None:
        self.dtype = np.dtype(dtype)


def _rebuild_tensor(
    storage: np.ndarray,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *_: Any,
) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2`` in numpy: a copy of the strided view of `storage`."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise pickle.UnpicklingError(f"tensor with negative size or stride {size} {stride}")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) if all(size) else 0
    if offset < 0 or (all(size) and last >= storage.size):
        raise pickle.UnpicklingError(
            f"tensor (offset {offset}, size {size}, stride {stride}) outside its storage "
            f"of {storage.size} elements"
        )
    if not all(size):
        return np.zeros(size, storage.dtype)
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
    )
    return np.array(view, copy=True)


def _rebuild_parameter(data: np.ndarray, *_: Any) -> np.ndarray:
    """``torch._utils._rebuild_parameter``: the tensor itself."""
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", k): _StorageType(v) for k, v in _STORAGES.items()},
}


class _Unpickler(pickle.Unpickler):
    """Unpickle a TorchScript ``data.pkl`` / ``constants.pkl`` with nothing executable."""

    def __init__(self, data: bytes, archive: TorchScriptArchive) -> None:
        super().__init__(io.BytesIO(data))
        self._archive = archive

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is not None:
            return found
        if module.startswith("__torch__.") or module == "__torch__":
            if not all(p.isidentifier() for p in (*module.split("."), name)):
                raise pickle.UnpicklingError(f"odd class name {module}.{name}")
            return _script_class(f"{module}.{name}")
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str):
            raise pickle.UnpicklingError(f"unexpected storage {pid!r}")
        return self._archive.storage(key, kind.dtype, int(numel))


class TorchScriptArchive:
    """The module tree, constants and code text of a TorchScript file, read without torch.

    Parameters
    ----------
    path : path
        A ``torch.jit.save`` file.

    Raises
    ------
    TorchScriptError
        If the file is not a zip holding one ``data.pkl``, uses a global outside the
        allowed set, or its tensors do not fit their storages (the message names the file).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise TorchScriptError(f"{self.path}: not a TorchScript file ({exc})") from exc
        roots = [n[: -len("/data.pkl")] for n in self._zip.namelist() if n.endswith("/data.pkl")]
        if len(roots) != 1 or "/" in roots[0]:
            self._zip.close()
            raise TorchScriptError(f"{self.path}: not a TorchScript file (no single data.pkl)")
        self.root = roots[0]
        self._storages: dict[str, np.ndarray] = {}
        order = self._read("byteorder", optional=True) or b"little"
        if order.strip() not in (b"little", b"big"):
            raise TorchScriptError(f"{self.path}: unknown byteorder {order[:20]!r}")
        self._order: Literal["<", ">"] = "<" if order.strip() == b"little" else ">"
        self.module: ScriptObject = self._unpickle("data.pkl")
        if not isinstance(self.module, ScriptObject):
            raise TorchScriptError(f"{self.path}: data.pkl does not hold a module")
        consts = self._unpickle("constants.pkl") if self._has("constants.pkl") else ()
        self.constants: tuple[Any, ...] = tuple(consts)

    def close(self) -> None:
        """Close the zip file."""
        self._zip.close()

    def __enter__(self) -> TorchScriptArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _has(self, name: str) -> bool:
        try:
            self._zip.getinfo(f"{self.root}/{name}")
        except KeyError:
            return False
        return True

    def _read(self, name: str, *, optional: bool = False) -> bytes | None:
        try:
            return self._zip.read(f"{self.root}/{name}")
        except KeyError:
            if optional:
                return None
            raise TorchScriptError(f"{self.path}: {self.root}/{name} missing") from None
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise TorchScriptError(f"{self.path}: cannot read {name} ({exc})") from exc

    def _unpickle(self, name: str) -> Any:
        data = self._read(name)
        assert data is not None
        try:
            return _Unpickler(data, self).load()
        except TorchScriptError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
            raise TorchScriptError(f"{self.path}: {name} refused ({exc})") from exc

    def storage(self, key: str, dtype: np.dtype[Any], numel: int) -> np.ndarray:
        """Storage ``data/<key>`` as a 1-D array of `numel` elements (native byte order)."""
        found = self._storages.get(key)
        if found is not None:
            return found
        if not key.isdigit():
            raise pickle.UnpicklingError(f"storage key {key!r} is not a number")
        raw = self._read(f"data/{key}")
        assert raw is not None
        dt = dtype.newbyteorder(self._order) if dtype.itemsize > 1 else dtype
        if len(raw) < numel * dt.itemsize:
            raise pickle.UnpicklingError(
                f"storage {key}: {len(raw)} bytes for {numel} elements of {dtype}"
            )
        arr = np.frombuffer(raw, dt, count=numel).astype(dtype.newbyteorder("="))
        self._storages[key] = arr
        return arr

    def code(self, suffix: str) -> str:
        """Return the text of the code file ending in `suffix` (``"instanseg_loss.py"``)."""
        names = [
            n
            for n in self._zip.namelist()
            if n.startswith(f"{self.root}/code/") and n.endswith(suffix)
        ]
        if len(names) != 1:
            raise TorchScriptError(f"{self.path}: {len(names)} code files end with {suffix!r}")
        return self._zip.read(names[0]).decode("utf-8")


def state_dict(module: ScriptObject, prefix: str = "") -> dict[str, np.ndarray]:
    """Every tensor of the tree under `module`, named as torch's ``state_dict`` names them."""
    out: dict[str, np.ndarray] = {}
    for name, value in module.tensors():
        out[prefix + name] = value
    for name, child in module.children():
        out.update(state_dict(child, f"{prefix}{name}."))
    return out
