"""Views of whole sessions: the self-contained HTML report (``workbench report``) and what it and
``workbench diff`` share (``session``: reading a session redacted; ``shape``: heartbeat runs, the
stall, exec lifecycles)."""
