"""``python -m expstore``: the same as the ``expstore`` command."""

from .cli import main

if __name__ == "__main__":
    main()
