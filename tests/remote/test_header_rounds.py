"""Header reads of a remote TIFF: tag values the IFD walk finds join its next round."""

from __future__ import annotations

from napari_slidescope.slide.remote import BLOCK_BYTES, HEAD_BYTES, RemoteFile
from napari_slidescope.slide.source import resolve


def test_wanted_ranges_come_with_the_next_missed_read(web, served):
    name = "TCGA-CR-7395-01A-01-TS1.svs"
    size = (served / name).stat().st_size
    assert size > HEAD_BYTES + 4 * BLOCK_BYTES
    data = (served / name).read_bytes()
    remote = RemoteFile(resolve(web.url(name)))
    try:
        wanted = (HEAD_BYTES + 10, 3000)  # a tile offset table past the head, say
        remote.want(*wanted)
        far = HEAD_BYTES + 3 * BLOCK_BYTES + 5
        assert remote.pread(far, 100) == data[far : far + 100]  # one round: both blocks
        before = remote.requests
        assert remote.pread(*wanted) == data[wanted[0] : wanted[0] + wanted[1]]
        assert remote.requests == before  # already there: no request of its own
    finally:
        remote.close()
