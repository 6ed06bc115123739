"""The project's warning category (tests turn it into errors unless expected)."""


class SlidescopeWarning(UserWarning):
    """A recoverable oddity in a slide or in analysis input (e.g. missing calibration)."""
