"""workbench.capture"""
