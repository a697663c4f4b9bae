"""Package marker: keeps this folder's conftest from shadowing tests/conftest.py as module `conftest`."""
