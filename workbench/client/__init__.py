"""workbench.client"""
