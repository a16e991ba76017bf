"""`python app.py distill`: learn a tiny drafter from the target itself and export it to ONNX.

  1. collect  (collect.py) the target reads a corpus (the long documents of the training prompts,
              and offline text with --corpus: corpus.py) and its own greedy answers to training
              prompts; every position gives (token, final hidden state, the target's argmax), with
              hidden states returned beside the logits by llama.cpp.
  2. subset   (vocab.py) FR-Spec: the most frequent target tokens in that data (ties and the rest by
              token id, a proxy for BPE merge order) form the drafter's output vocabulary.
  3. train    (train.py) numpy, Adam: an MLP maps (hidden state h_t, input embedding of x_{t+1}) to
              h_{t+1}; loss = cross-entropy against the target's distribution over the subset (the
              target's own output rows applied to h_{t+1}) + a small feature-regression term. Half
              the inputs are the drafter's own predicted feature instead of h_t, as at draft depth >= 2.
  4. export   (onnx_export.py) an ONNX graph built with the onnx package (input normalisation folded
              into the first layer), checked against the numpy model in ONNX Runtime, and a manifest;
              written to a temporary folder and renamed into place, so an interrupted run leaves
              nothing half-done.

cli.py holds the command: its flags (config.py: DistillConfig, every default), the run within the
budget, and the summary in words.

Prompts used for evaluation are never trained on: by default the first `--holdout` prompts of each
category of each suite are excluded (the bench's `--per-category N` takes the first N), and the
manifest lists the question ids used.
"""

from edgespec.apps.distill.cli import add_args, main, run, run_args, summary
from edgespec.apps.distill.collect import Record
from edgespec.apps.distill.config import DEFAULT_SUITE, DistillConfig
from edgespec.apps.distill.onnx_export import export
from edgespec.apps.distill.train import Dataset, Trainer, build_dataset

__all__ = ["DEFAULT_SUITE", "Dataset", "DistillConfig", "Record", "Trainer", "add_args", "build_dataset", "export",
           "main", "run", "run_args", "summary"]
