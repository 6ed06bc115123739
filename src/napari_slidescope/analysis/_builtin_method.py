"""What the two built-in nuclei methods share: parameters, a threshold, a working resolution."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class _MethodParams(Protocol):
    @property
    def target_mpp(self) -> float: ...

    @property
    def threshold(self) -> float | None: ...


P = TypeVar("P", bound=_MethodParams)


class BuiltinMethod(Generic[P]):
    """Base of the built-in segmenters (H&E and fluorescence).

    Parameters
    ----------
    params : parameter dataclass
        Frozen parameters with at least ``target_mpp`` and ``threshold``.

    Attributes
    ----------
    threshold : float or None
        ``params.threshold``; when None, ``prepare`` fixes it for the slide.
    parallel_predict : bool
        True: ``predict`` is CPU numpy work that only reads what ``prepare`` set, so the
        staged runner gives it ``workers`` threads instead of one model thread.
    """

    parallel_predict = True

    def __init__(self, params: P) -> None:
        self.params = params
        self.threshold: float | None = params.threshold

    @property
    def target_mpp(self) -> float:
        """Working resolution in µm/px."""
        return self.params.target_mpp
