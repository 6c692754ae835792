"""workbench.tui"""
