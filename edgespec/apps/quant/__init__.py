"""MX formats (OCP Microscaling v1.0), GGUF requantization and quantization quality reports.

`python -m edgespec.apps.quant convert IN.gguf OUT.gguf --to FORMAT` and `python -m edgespec.apps.quant report ...`;
see edgespec/apps/quant/mx.py, edgespec/apps/quant/convert.py and edgespec/apps/quant/report.py.
"""
