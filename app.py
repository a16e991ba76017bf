#!/usr/bin/env python
"""EdgeSpec: python app.py (web UI) | python app.py --headless ... | python app.py bench ..."""

import sys

from edgespec.apps.cli import main

if __name__ == "__main__":
    sys.exit(main())
