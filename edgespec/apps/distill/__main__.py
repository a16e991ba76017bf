"""`python -m edgespec.apps.distill ...`, the same command as `python app.py distill ...`."""

import sys

from edgespec.apps.distill.cli import main

sys.exit(main())
