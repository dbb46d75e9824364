"""The package's version, in a module of its own so that modules inside the package
read it without importing the package (whose __init__ imports the front)."""

__version__ = "0.1.0"
