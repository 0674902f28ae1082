"""The directory `install` puts first on PYTHONPATH: its `sitecustomize` guards Python children."""
