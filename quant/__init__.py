"""MX formats (OCP Microscaling v1.0), GGUF requantization and quantization quality reports.

`python -m quant convert IN.gguf OUT.gguf --to FORMAT` and `python -m quant report ...`;
see quant/mx.py, quant/convert.py and quant/report.py.
"""
