"""``workbench diff A B``: what changed between two recorded sessions (see ``compare``)."""
