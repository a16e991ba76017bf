"""Export: an ONNX graph built with the onnx package (input normalisation folded into the first
layer), checked against the NumPy model in ONNX Runtime, 8-bit weights where they agree, and the
manifest; written to a temporary folder and moved into place, so an interrupted run leaves nothing
half-done."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import numpy as np

from edgespec.apps.distill.train import Dataset, Trainer
from edgespec.core import learned_format as fmt
from edgespec.core.drafters.onnx import open_session
from edgespec.runtime.errors import EdgeSpecError, one_line


def build_onnx(params: dict[str, np.ndarray], head: np.ndarray):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_embd = head.shape[1]
    inits = [numpy_helper.from_array(np.ascontiguousarray(v), name=k) for k, v in params.items()]
    inits.append(numpy_helper.from_array(np.ascontiguousarray(head.T.astype(np.float32)), name="head_T"))
    nodes = [
        helper.make_node("Concat", list(fmt.INPUTS), ["z"], axis=1),
        helper.make_node("MatMul", ["z", "W1"], ["a0"]),
        helper.make_node("Add", ["a0", "b1"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["sig"]),
        helper.make_node("Mul", ["a", "sig"], ["s"]),
        helper.make_node("MatMul", ["s", "W2"], ["f0"]),
        helper.make_node("MatMul", ["z", "A"], ["skip"]),
        helper.make_node("Add", ["f0", "skip"], ["f1"]),
        helper.make_node("Add", ["f1", "b2"], [fmt.NEXT_FEATURE]),
        helper.make_node("MatMul", [fmt.NEXT_FEATURE, "head_T"], [fmt.LOGITS]),
    ]
    graph = helper.make_graph(
        nodes, "edgespec_learned_drafter",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", n_embd]) for name in fmt.INPUTS],
        [helper.make_tensor_value_info(fmt.NEXT_FEATURE, TensorProto.FLOAT, ["batch", n_embd]),
         helper.make_tensor_value_info(fmt.LOGITS, TensorProto.FLOAT, ["batch", head.shape[0]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgespec-distill")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def quantize_weights(model, block_size: int = 32):
    """8-bit weight-only quantization of every MatMul (ONNX Runtime's MatMulNBits, symmetric blocks
    of 32, int8 compute): the drafter reads ~4x fewer bytes per token, which is its cost on a CPU.
    Measured on the Gemma drafter: 0.65 ms per pass instead of 2.6 ms, same argmax."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    # the quantizer's module turns on INFO logging for the whole process when imported (a line per
    # MatMul on stderr, under the progress bar); its own loggers only need to say warnings
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)
    cfg = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4, bits=8,
                                       quant_format=QuantFormat.QOperator)
    q = MatMulNBitsQuantizer(model, algo_config=cfg)
    q.process()
    return q.model.model


def check_out(out: Path) -> Path:
    """The resolved output folder, checked before any work: a folder whose parent can be created and
    written (a probe folder is made and removed there), and that is new, empty or an older drafter,
    so that the export at the end of the budget cannot fail or replace someone else's files."""
    out = out.expanduser().resolve()
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise EdgeSpecError(f"--out {out} is an existing file, not a drafter folder; name a new folder")
        try:
            empty = not any(out.iterdir())
        except OSError as exc:
            raise EdgeSpecError(f"cannot read the folder --out {out} ({exc.strerror or one_line(exc)}); "
                                "choose another --out") from None
        if not empty and not (out / fmt.MANIFEST).is_file():
            raise EdgeSpecError(f"--out {out} is a folder with other files and no drafter ({fmt.MANIFEST}) in it; "
                                "name a new folder")
        if not empty and not fmt.is_drafter_folder(out):
            # a manifest.json of something else (a browser extension, a web app): not ours to replace
            raise EdgeSpecError(f"--out {out} is a folder with other files and its {fmt.MANIFEST} is not an EdgeSpec "
                                "learned drafter's; name a new folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeSpecError(f"cannot create the folder {out.parent} for the drafter ({exc.strerror or one_line(exc)}); "
                            "choose another --out") from None
    try:
        Path(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent)).rmdir()
    except OSError as exc:
        raise EdgeSpecError(f"cannot write the drafter to {out}: {out.parent} takes no new folders "
                            f"({exc.strerror or one_line(exc)}); choose another --out") from None
    return out


def export(out: Path, trainer: Trainer, subset: np.ndarray, manifest: fmt.Manifest,
           heldout: Dataset | None = None) -> Path:
    """Write drafter.onnx + manifest.json into a temporary sibling folder, check the graph against
    the numpy model in ONNX Runtime, then move it into place: a new folder is renamed into place; in
    an existing one (empty, or an older drafter) only those two files are replaced, so nothing else
    in it is deleted and the folder keeps its permissions."""
    import onnx

    out = check_out(out)
    tmp = _new_folder(out.parent, f".{out.name}.part-")
    try:
        model = build_onnx(trainer.export_params(), trainer.head)
        onnx.save(model, str(tmp / fmt.ONNX_FILE))
        manifest.write(tmp)
        sess = open_session(tmp / fmt.ONNX_FILE)
        d = trainer.data
        j = np.arange(min(8, len(d.h)))
        h, e = d.h[j], trainer.emb_of(d.e_tok[j])
        got_f, got_l = sess.run(fmt.OUTPUTS, dict(zip(fmt.INPUTS, (h, e), strict=True)))
        want_f = trainer.predict(h, e)
        err = float(np.abs(got_f - want_f).max() / (np.abs(want_f).max() + 1e-9))
        if err > 1e-3:
            raise EdgeSpecError(f"the exported ONNX graph disagrees with the trained model (relative error {err:.2e})")
        # 8-bit weights, kept only if they pick the same draft token as float32 on held-out data
        check = heldout if heldout is not None and len(heldout.h) else d
        k = np.arange(min(512, len(check.h)))
        h, e = check.h[k], trainer.emb_of(check.e_tok[k])
        feed = dict(zip(fmt.INPUTS, (h, e), strict=True))
        want = sess.run((fmt.LOGITS,), feed)[0].argmax(1)
        onnx.save(quantize_weights(model), str(tmp / "int8.onnx"))
        got = open_session(tmp / "int8.onnx").run((fmt.LOGITS,), feed)[0].argmax(1)
        agree = float((got == want).mean())
        manifest.weights = {"format": "int8 MatMulNBits, block 32" if agree >= 0.98 else "float32",
                            "int8_argmax_agreement": round(agree, 4)}
        if agree >= 0.98:
            (tmp / "int8.onnx").replace(tmp / fmt.ONNX_FILE)
        else:
            (tmp / "int8.onnx").unlink()
        manifest.write(tmp)
        if out.exists():
            for name in (fmt.ONNX_FILE, fmt.MANIFEST):  # the manifest last: it names the graph it goes with
                os.replace(tmp / name, out / name)
            tmp.rmdir()
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new, uniquely named folder in `parent` with the permissions the umask gives (tempfile's
    mkdtemp makes 0700 folders, and this one becomes the user's drafter folder)."""
    path = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
    path.mkdir()
    return path
