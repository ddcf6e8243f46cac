"""The bundled sample traces (package data: ``importlib.resources.files("kvtrace.samples")``); README.md describes each."""
