"""Gradio UI: `launch(args)` for `python app.py`, `build_app()` + `start()` for tests and embedding."""

from edgespec.apps.ui.app import build_app, launch, start
from edgespec.apps.ui.context import Defaults

__all__ = ["Defaults", "build_app", "launch", "start"]
