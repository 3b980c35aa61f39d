"""``python -m smartnsq``: the command line (needs ``pip install 'smartnsq[cli]'``)."""

from smartnsq.cli import main

if __name__ == "__main__":
    main()
