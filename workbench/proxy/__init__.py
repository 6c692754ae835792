"""workbench.proxy"""
