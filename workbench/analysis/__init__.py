"""workbench.analysis"""
