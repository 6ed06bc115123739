"""The ``slidescope batch`` flags of the analysis options, generated from the options model.

One flag per option field of the options class of each task of the task table
(:mod:`napari_slidescope.pipeline.task_table`: :class:`~napari_slidescope.options.TissueOptions`,
:class:`~napari_slidescope.options.NucleiOptions`): its help, unit, default and accepted
values come from the field's :class:`~napari_slidescope.options.OptionInfo`, and a bad
value gets the model's own message (``"{name}: expected ..., got ..."``) as a usage
error. The flag names that differ from the field's come from the table
(``TaskSpec.flag_names``, gathered in :data:`FLAG_NAMES`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from napari_slidescope.options import (
    NucleiOptions,
    OptionInfo,
    TilesOptions,
    TissueOptions,
    option_fields,
)
from napari_slidescope.pipeline.task_table import TASK_TABLE

__all__ = [
    "FLAG_NAMES",
    "add_option_flags",
    "option_flags",
    "options_from_args",
    "tiles_options_from_args",
]

#: Flag of each option field whose name alone would be ambiguous or unclear on the command
#: line (``(class name, field)`` -> flag); every other field's flag is its name with dashes.
FLAG_NAMES: dict[tuple[str, str], str] = {
    (spec.options.__name__, name): flag
    for spec in TASK_TABLE
    for name, flag in spec.flag_names.items()
}

_OptionsClass = type[TissueOptions] | type[NucleiOptions] | type[TilesOptions]
#: The tasks whose options get one flag per field (a task asked for by one flag with a
#: value, ``TaskSpec.cli_flag``, has its own).
_CLASSES: tuple[tuple[str, _OptionsClass], ...] = tuple(
    (spec.name, cast("_OptionsClass", spec.options)) for spec in TASK_TABLE if spec.cli_flag is None
)
_METAVARS = {"µm": "UM", "µm/px": "UM", "µm²": "UM2"}


def option_flags() -> Iterator[tuple[_OptionsClass, str, str, Any, OptionInfo]]:
    """Yield ``(options class, field, flag, default, info)`` of every documented option."""
    for _, cls in _CLASSES:
        for name, default, info in option_fields(cls):
            flag = FLAG_NAMES.get((cls.__name__, name), "--" + name.replace("_", "-"))
            yield cls, name, flag, default, info


def _dest(cls: _OptionsClass, name: str) -> str:
    return f"_{cls.__name__}__{name}"


def _parse(name: str, info: OptionInfo) -> Callable[[str], Any]:
    """Return argparse's ``type``: the text as the option's kind, checked by the model."""

    def parse(text: str) -> Any:
        value: Any = text
        if info.kind in ("float", "int"):
            try:
                value = float(text) if info.kind == "float" else int(text)
            except ValueError:
                pass  # the model says what was expected, about the text as given
        try:
            return info.check(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _help(cls: _OptionsClass, name: str, default: Any, info: OptionInfo) -> str:
    text = info.doc + (f" [{info.unit}]" if info.unit else "")
    if cls is NucleiOptions and name == "segmenter":
        from napari_slidescope.segmenters import registered_segmenters

        text += "; registered: " + ", ".join(registered_segmenters())
        return text + f" (default: {default}; the manifest records which ran)"
    if info.kind == "bool":
        return text + f" (default: {'on' if default else 'off'})"
    if default is None or default == "":  # the doc says what None (or no file) means
        return text
    return (
        text + f" (default: {default:g})"
        if info.kind == "float"
        else text + (f" (default: {default})")
    )


def _channel(text: str) -> int | str:
    """``--channel``: an index when the text is a whole number, else a channel name."""
    return int(text) if text.strip().isdigit() else text


def _mapping(text: str) -> dict[str, Any]:
    """``--segmenter-options``: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"segmenter_options: expected a JSON object, got {text!r}"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"segmenter_options: expected a JSON object, got {text!r}")
    return value


def add_option_flags(parser: argparse._ActionsContainer) -> None:
    """Add a flag for every field of the tissue and nuclei options to `parser` (or a group)."""
    for cls, name, flag, default, info in option_flags():
        kwargs: dict[str, Any] = {"dest": _dest(cls, name), "default": default}
        if info.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
            kwargs["help"] = _help(cls, name, default, info).replace("%", "%%")
        else:
            kwargs["type"] = _parse(name, info)
            if info.choices is not None:
                kwargs["metavar"] = "{" + ",".join(info.choices) + "}"
            elif cls is TilesOptions and name == "model":
                kwargs["metavar"] = "MODEL"
            elif info.kind == "str":
                kwargs["metavar"] = "NAME"
            else:
                kwargs["metavar"] = _METAVARS.get(info.unit or "", "X")
            kwargs["help"] = _help(cls, name, default, info).replace("%", "%%")
        parser.add_argument(flag, **kwargs)
    parser.add_argument(
        "--channel",
        dest=_dest(NucleiOptions, "channel"),
        type=_channel,
        default=NucleiOptions().channel,
        metavar="INDEX_OR_NAME",
        help="nuclear channel of a fluorescence slide, by index or name (default: automatic)",
    )
    parser.add_argument(
        "--segmenter-options",
        dest=_dest(NucleiOptions, "segmenter_options"),
        type=_mapping,
        default=None,
        metavar="JSON",
        help="keyword arguments of the segmenter's constructor, a JSON object (default: none)",
    )


def options_from_args(args: argparse.Namespace) -> tuple[TissueOptions, NucleiOptions]:
    """Build the options the flags of `args` give.

    Raises
    ------
    ValueError
        The model's message, when the options do not go together.
    """
    return _build(TissueOptions, args), _build(NucleiOptions, args)


def tiles_options_from_args(args: argparse.Namespace) -> TilesOptions:
    """Build the tiles options the flags of `args` give (the model file is hashed).

    Raises
    ------
    ValueError
        The model's message, when the options do not go together.
    FileNotFoundError
        If ``--embed`` names no file.
    """
    return _build(TilesOptions, args)


_T = TypeVar("_T", TissueOptions, NucleiOptions, TilesOptions)


def _build(cls: type[_T], args: argparse.Namespace) -> _T:
    prefix = _dest(cls, "")
    values = {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix)}
    if values.get("segmenter_options", 0) is None:
        values.pop("segmenter_options")
    return cls.from_mapping(values, where="slidescope batch")
