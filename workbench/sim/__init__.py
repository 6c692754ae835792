"""workbench.sim"""
