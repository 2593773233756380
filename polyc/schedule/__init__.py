"""Scheduling: isl schedule constraints, fusion, tiling, parallel and SIMD marks."""
