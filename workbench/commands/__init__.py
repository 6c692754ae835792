"""Subcommand implementations."""
