"""workbench.ingest"""
