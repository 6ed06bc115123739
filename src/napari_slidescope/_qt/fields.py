"""Widgets generated from the options model: one field per documented option.

:func:`option_widgets` makes a spin box, menu or check box for each option of
:func:`~napari_slidescope.options.option_fields`: its label, its unit as the spin box's
suffix, its documentation as the tooltip, its bounds and its choices come from the model,
so nothing is written twice. What only a screen needs (a spin box's step, a finite upper
bound where the model has none, the word shown for "automatic") is in :data:`HINTS`; a
hint may narrow the model's range, never widen it.

An optional number (None: automatic) shows its lowest value as a word (``auto``):
:func:`field_value` reads that back as None.
"""

from __future__ import annotations

from collections.abc import Sequence

from magicgui.widgets import CheckBox, ComboBox, FloatSpinBox, SpinBox
from magicgui.widgets.bases import ValueWidget

from napari_slidescope._qt.task_fields import Hint, dock_task_of, hints
from napari_slidescope.options import NucleiOptions, OptionInfo, TissueOptions, option_fields

__all__ = ["HINTS", "Hint", "field_value", "option_widgets", "set_field_value", "spin_range"]

#: Largest value of a spin box whose option has no upper bound.
_UNBOUNDED = 1e12


#: Screen-only details, by ``"<task>.<option>"``: each task's ``hints`` in the dock's task
#: table (:mod:`napari_slidescope._qt.task_fields`).
HINTS: dict[str, Hint] = hints()


def spin_range(key: str, info: OptionInfo) -> tuple[float, float]:
    """Return the spin box's ``(min, max)``: the model's bounds, narrowed by the hint.

    An optional option's minimum stands for None (shown as the hint's word), so it lies at
    the lower bound of the set values (0 when the model only asks for a positive number).
    """
    hint = HINTS.get(key, Hint())
    low = info.low if info.low is not None else 0.0
    high = info.high if info.high is not None else _UNBOUNDED
    if hint.low is not None:
        low = max(low, hint.low)
    if hint.high is not None:
        high = min(high, hint.high)
    return low, high


def _label(info: OptionInfo, name: str) -> str:
    return info.label or name.replace("_", " ").capitalize()


def _tooltip(info: OptionInfo) -> str:
    return info.doc[:1].upper() + info.doc[1:] + (f" ({info.unit})" if info.unit else "")


def make_field(
    key: str, default: object, info: OptionInfo, *, choices: Sequence[str] | None = None
) -> ValueWidget:
    """Return the widget of one option (`choices` for a text option the model leaves open)."""
    name = key.split(".", 1)[1]
    label = _label(info, name)
    widget: ValueWidget
    if info.kind == "bool":
        widget = CheckBox(text=label, value=bool(default))
    elif info.kind == "str":
        options = list(info.choices or choices or [str(default)])
        widget = ComboBox(label=label, choices=options, value=default)
    else:
        low, high = spin_range(key, info)
        hint = HINTS.get(key, Hint())
        start = low if default is None else float(str(default))
        if info.kind == "int":
            widget = SpinBox(label=label, value=int(start), min=int(low), max=int(high))
        else:
            widget = FloatSpinBox(label=label, value=start, min=low, max=high, step=hint.step)
        if info.unit:
            widget.native.setSuffix(f" {info.unit}")
        if info.optional:
            widget.native.setSpecialValueText(hint.none_text)
    widget.tooltip = _tooltip(info)
    return widget


def option_widgets(
    cls: type[TissueOptions] | type[NucleiOptions],
    *,
    choices: dict[str, Sequence[str]] | None = None,
) -> dict[str, ValueWidget]:
    """One widget per documented option of `cls`, by option name, showing its default."""
    prefix = dock_task_of(cls).name
    return {
        name: make_field(f"{prefix}.{name}", default, info, choices=(choices or {}).get(name))
        for name, default, info in option_fields(cls)
    }


def field_value(widget: ValueWidget, info: OptionInfo) -> float | int | bool | str | None:
    """Return the option value a widget shows (None: an optional number at its minimum)."""
    value = widget.value
    lowest = getattr(widget, "min", None)
    if info.kind in ("float", "int") and info.optional and value == lowest:
        return None
    if info.kind == "float":
        return float(value)
    if info.kind == "int":
        return int(value)
    if info.kind == "bool":
        return bool(value)
    return value


def set_field_value(widget: ValueWidget, info: OptionInfo, value: object) -> None:
    """Show an option value (None: an optional number's lowest value, its word)."""
    if value is None and info.kind in ("float", "int"):
        value = getattr(widget, "min")  # noqa: B009 - spin boxes only
    widget.value = value
