"""workbench: capture, decode, diagnose and replay Cursor agent traffic."""

__version__ = "0.1.0"
