"""Bulk exports of a capture database (Parquet) for engines beyond one DuckDB file."""
