"""The learned drafter's format, owned here and nowhere else: what `distill` writes and what the
ONNX drafter reads.

A drafter is a folder: ONNX_FILE (inputs FEATURE and EMBEDDING [B, n_embd]; outputs NEXT_FEATURE
[B, n_embd] and LOGITS [B, n_subset]) and MANIFEST, a `Manifest` in JSON (format and version, the
target's fingerprint, the vocabulary subset, the design, the training data, held-out figures).
Drafters live in a store (`store_dir`) where `--draft learned:NAME` finds them by name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from edgespec.models.gguf_tensors import FINGERPRINT_KEYS, target_fingerprint
from edgespec.runtime import env
from edgespec.runtime.errors import EdgeSpecError

FORMAT = "edgespec-learned-drafter"
VERSION = 1
ONNX_FILE = "drafter.onnx"
MANIFEST = "manifest.json"

# The ONNX graph's inputs and outputs, by name.
FEATURE = "feature"  # [B, n_embd] the target's final hidden state (or the drafter's own prediction)
EMBEDDING = "embedding"  # [B, n_embd] the target's input embedding of the token that state produced
NEXT_FEATURE = "next_feature"  # [B, n_embd] the predicted next hidden state
LOGITS = "logits"  # [B, n_subset] over the manifest's vocab_subset
INPUTS = (FEATURE, EMBEDDING)
OUTPUTS = (NEXT_FEATURE, LOGITS)

MAKE_ONE = "make one with: python app.py distill"


def store_dir() -> Path:
    """Where `distill` puts drafters by default and where `--draft learned:NAME` finds them."""
    return env.path("EDGESPEC_DRAFTER_STORE") or env.cache_dir() / "drafters"


def resolve(spec: str) -> Path:
    """A drafter folder (or its drafter.onnx / manifest.json), or a name in the drafter store."""
    p = Path(spec).expanduser()
    if p.is_file() and p.name in (ONNX_FILE, MANIFEST):
        p = p.parent
    if p.is_dir():
        return p
    named = store_dir() / spec
    if "/" not in spec and named.is_dir():
        return named
    known = sorted(d.name for d in store_dir().glob("*") if (d / MANIFEST).is_file()) if store_dir().is_dir() else []
    hint = f" (drafters in {store_dir()}: {', '.join(known)})" if known else f" ({MAKE_ONE})"
    raise EdgeSpecError(f"no learned drafter at {spec!r}{hint}")


def is_drafter_folder(folder: Path) -> bool:
    """True when `folder` holds a manifest that says it is one of our drafters (its own "format"
    field, any version): a folder `distill` may write a new drafter into."""
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("format") == FORMAT


@dataclass(kw_only=True)
class Heldout:
    """Figures measured on held-out text at the end of `distill` (None: too little text for it)."""

    sequences: int = 0
    tokens: int = 0
    top1_agreement: float | None = None  # depth-1 argmax agreement with the target
    subset_coverage: float | None = None  # share of the target's tokens inside the vocabulary subset
    chain_acceptance: list[float | None] = field(default_factory=list)  # greedy acceptance at depth 1, 2, ...

    def best_acceptance(self) -> float | None:
        """The best greedy acceptance over draft depths, None when none was measured."""
        chain = [a for a in self.chain_acceptance if a is not None]
        return max(chain) if chain else None


@dataclass(kw_only=True)
class Manifest:
    """manifest.json: what a drafter was made for and how (the JSON keys are these field names,
    after "format" and "version")."""

    onnx: str = ONNX_FILE  # the graph's file name in the folder
    target_file: str | None = None
    target: dict  # the target's fingerprint (gguf_tensors.FINGERPRINT_KEYS)
    n_embd: int
    n_vocab: int | None = None
    vocab_subset: list[int]
    design: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    heldout: Heldout = field(default_factory=Heldout)
    weights: dict | None = None  # how the graph's weights are stored (int8 or float32)

    REQUIRED = ("target", "vocab_subset", "n_embd")

    def to_json(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, **asdict(self)}
        if d["weights"] is None:
            del d["weights"]
        return d

    def write(self, folder: Path) -> Path:
        path = folder / MANIFEST
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """The manifest in `folder`; anything else is a one-line error naming what is wrong."""
        path = folder / MANIFEST
        if not path.is_file():
            raise EdgeSpecError(f"{folder} has no {MANIFEST}: not a learned drafter ({MAKE_ONE})")
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise EdgeSpecError(f"{path} is not readable JSON: {exc}") from None
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise EdgeSpecError(f"{path} is not an EdgeSpec learned-drafter manifest")
        if m.get("version") != VERSION:
            raise EdgeSpecError(f"{path} has format version {m.get('version')}; this EdgeSpec reads version {VERSION}")
        for key in cls.REQUIRED:
            if key not in m:
                raise EdgeSpecError(f"{path} lacks {key!r}")
        known = {f.name for f in fields(cls)}
        args = {k: v for k, v in m.items() if k in known}
        held = m.get("heldout") or {}
        args["heldout"] = Heldout(**{f.name: held[f.name] for f in fields(Heldout) if held.get(f.name) is not None})
        return cls(**args)

    def check_target(self, target_path: str, folder: Path) -> None:
        """One line naming the first mismatch between the drafter's target and this one."""
        have = target_fingerprint(target_path)
        for key in FINGERPRINT_KEYS:
            if self.target.get(key) != have.get(key):
                raise EdgeSpecError(
                    f"the learned drafter {folder.name} was made for {self.target_file or 'another model'}, "
                    f"not {Path(target_path).name}: {key} is {self.target.get(key)} there and {have.get(key)} here"
                )
