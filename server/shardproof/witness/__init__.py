"""Numeric witnesses: every discrepancy is backed by real numbers that differ, or says why not.

`run` computes them (worker side: user code and torch); `describe` renders them (torch-free).
"""
