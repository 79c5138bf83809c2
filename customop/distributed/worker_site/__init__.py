"""The folder the launcher puts first on its workers' PYTHONPATH (see sitecustomize.py)."""
