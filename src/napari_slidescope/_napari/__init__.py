"""napari glue: reader, sample data, dock widget and launcher (the only GUI-aware package)."""
