"""Metadata XML, parsed safely: the one place the slide package turns XML text into a tree.

OME, QPTIFF, Leica SCN and Ventana BIF slides describe themselves in XML. A file is
untrusted input, so DTDs and entities are refused (defusedxml) whatever the runtime's XML
library would allow; a leaf of its own so every format's reader can use it.
"""

from __future__ import annotations

import warnings
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as _defused_fromstring

from napari_slidescope.errors import SlidescopeWarning


def parse_xml(text: str | bytes, path: str) -> Element | None:
    """Parse metadata XML with DTDs, entities and external references refused.

    Returns None when the text is not well-formed XML; warns (naming the file) and returns
    None when it declares a DTD or entities, which are never expanded or fetched,
    whatever the XML library of the runtime would allow.
    """
    try:
        root: Element = _defused_fromstring(text, forbid_dtd=True)
        return root
    except DefusedXmlException as exc:
        warnings.warn(
            f"{path}: metadata XML ignored: it declares a DTD or entities ({type(exc).__name__})",
            SlidescopeWarning,
            stacklevel=3,
        )
        return None
    except (ParseError, ValueError, TypeError):
        return None
