"""A segmenter adapter: a fluorescence segmenter run on one channel of multichannel tiles."""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_slidescope.segmenters.base import Segmenter, SegmenterBase, identity_of

__all__ = ["ChannelView"]


class ChannelView(SegmenterBase):
    """A fluorescence segmenter given one channel of multichannel tiles."""

    def __init__(self, segmenter: Segmenter, channel: int) -> None:
        super().__init__(target_mpp=segmenter.target_mpp, min_overlap_um=segmenter.min_overlap_um)
        self.inner, self.channel = segmenter, channel
        self.name, self.input = segmenter.name, segmenter.input
        self.parallel_predict = segmenter.parallel_predict

    def __getattr__(self, name: str) -> Any:
        # the model's own cells (runner.cell_outlines); what ran its network (the results)
        if name in ("cells_from_model", "postprocess_cells", "runtime"):
            return getattr(self.inner, name)
        raise AttributeError(name)

    def _view(self, x: np.ndarray) -> np.ndarray:  # every channel for a model's own cells
        every = getattr(self.inner, "all_channels", False)
        return x if every else x[..., self.channel : self.channel + 1]

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Prepare the segmenter on the channel."""
        self.inner.prepare(self._view(reference), mpp=mpp)

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Predict on the channel."""
        return self.inner.predict(self._view(tiles), mpp=mpp)

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Run the segmenter's own post-processing."""
        return self.inner.postprocess(raw, mpp=mpp)

    def identity(self) -> dict[str, Any]:
        """Return the wrapped segmenter's identity."""
        return identity_of(self.inner)
