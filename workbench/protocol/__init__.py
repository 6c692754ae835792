"""Protocol concepts shared by the decoder's users (imports, analysis, client, simulator).

``matching``: which client message answers which server message (docs/protocol.md §4).
"""
