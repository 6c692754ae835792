"""The page ``workbench web`` serves, made to fetch nothing from outside this machine.

textual-serve's page template links its terminal font from a web-font service on the internet.
Offline that request hangs or fails, and online it tells a third party that someone opened the UI
(the server's Content-Security-Policy makes the browser skip it, so the page falls back to a
system font either way). textual-serve ships the same font (Roboto Mono) in its own static files,
so the template is read through ``OfflineLoader``, which drops every stylesheet, script or font
link to another host and declares the font from the server's own ``/static/fonts`` instead. The
template itself stays textual-serve's (nothing copied), so an upgrade keeps its page; the browser
test (tests/web) checks that no request leaves 127.0.0.1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import jinja2

# <link ... href="http(s)://..." ...> and <script src="http(s)://..."></script>: anything the page
# would load from another host (protocol-relative ``//host`` too)
_REMOTE = re.compile(
    r"""<link\b[^>]*\bhref\s*=\s*["']?(?:https?:)?//[^>]*>"""
    r"""|<script\b[^>]*\bsrc\s*=\s*["']?(?:https?:)?//[^>]*>\s*</script>""",
    re.IGNORECASE)

# The fonts textual-serve ships in its static folder (``static/fonts``), under the family name its
# page and xterm.js ask for.
FONT_FACES = """<style>
      @font-face { font-family: "Roboto Mono"; font-style: normal; font-weight: 100 700;
        src: url("{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf") format("truetype"); }
      @font-face { font-family: "Roboto Mono"; font-style: italic; font-weight: 100 700;
        src: url("{{ config.static.url }}fonts/RobotoMono-Italic-VariableFont_wght.ttf") format("truetype"); }
    </style>"""


def offline_page(source: str) -> str:
    """``source`` (a page template) without links to other hosts, with the local font declared."""
    source = _REMOTE.sub("", source)
    head = re.search(r"<head\b[^>]*>", source, re.IGNORECASE)
    at = head.end() if head else 0
    return source[:at] + "\n    " + FONT_FACES + source[at:]


class OfflineLoader(jinja2.FileSystemLoader):
    """A template loader whose pages load nothing from another host (``offline_page``)."""

    def get_source(self, environment: jinja2.Environment,
                   template: str) -> tuple[str, str, Callable[[], bool]]:
        source, filename, uptodate = super().get_source(environment, template)
        if template.endswith(".html"):
            source = offline_page(source)
        return source, filename, uptodate


def offline_loader(templates: str | Path) -> OfflineLoader:
    return OfflineLoader(str(templates))
