"""``python -m napari_slidescope.batch batch ...``: the ``slidescope`` command."""

import sys

from napari_slidescope.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())
