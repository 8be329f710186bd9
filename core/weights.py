"""Reading an embedding matrix, and the training counts of its rows, from the files models are saved in.

:func:`open_source` opens a ``.pt`` / ``.pth`` / ``.bin`` torch file (a tensor, or a state dict: a dict of tensors, or
one under ``model`` / ``state_dict`` / ``module``), a ``.safetensors`` file, a local Hugging Face model folder
(``config.json`` with ``model.safetensors`` or ``pytorch_model.bin``, or their sharded ``*.index.json``; read
directly, without ``transformers``) or a run folder of the ledger (``result.json`` and the weights its final metrics
name first). Tensors are read on demand. :func:`pick_matrix` chooses the matrix (a key, else the output embedding by
its usual names, else the input embedding) and says why; :func:`read_counts` reads one count per row id. Every
malformed file is a :class:`~repdegen.core.errors.UserError` that names it and what was expected.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from repdegen.core.errors import CorruptFile, DataError, UserError

OUTPUT_KEYS = ("output_embedding", "output_embedding.weight", "output_weight", "lm_head.weight", "decoder.weight",
               "embed_out.weight", "generator.weight")
INPUT_KEYS = ("embedding.weight", "wte.weight", "embed_tokens.weight", "word_embeddings.weight", "embeddings.weight",
              "tok_embeddings.weight", "encoder.weight")
FLAT_NAMES = ("model", "state_dict", "module")
RUN_WEIGHTS = ("averaged.pt", "best.pt", "last.pt")


# ---- the matrix ----------------------------------------------------------------------------------------------------
class Tensors:
    """The tensors of a file or folder by name, read on demand: ``shapes`` (name -> shape) and ``get(name)``."""

    def __init__(self, shapes: dict[str, tuple], get, kind: str):
        self.shapes, self.get, self.kind = shapes, get, kind


def _flatten(blob, prefix: str = "") -> dict:
    out = {}
    for k, x in blob.items():
        if isinstance(x, torch.Tensor):
            out[prefix + str(k)] = x
        elif isinstance(x, dict) and (prefix or str(k) in FLAT_NAMES):
            out.update(_flatten(x, prefix + (str(k) + "." if prefix else "")))
    return out


def _torch_file(path: Path) -> dict:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - pickle, zip and EOF errors of a damaged or foreign file
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise CorruptFile(path, f"{path} cannot be read as a torch file of tensors ({type(err).__name__}: {why}); "
                                f"expected a tensor or a dict of tensors saved with torch.save") from None
    if isinstance(blob, torch.Tensor):
        return {"(tensor)": blob}
    if isinstance(blob, dict):
        tensors = _flatten(blob)
        if tensors:
            return tensors
    raise DataError(f"{path} holds a {type(blob).__name__} with no tensors; expected a tensor or a state dict")


def _from_dict(tensors: dict, kind: str) -> Tensors:
    return Tensors({k: tuple(x.shape) for k, x in tensors.items()}, tensors.__getitem__, kind)


def _safetensors_files(files: list[Path], kind: str) -> Tensors:
    try:
        from safetensors import safe_open
    except ImportError:
        raise UserError(f"{files[0]} is a safetensors file and the safetensors package is not installed: "
                        f"pip install safetensors") from None
    where, shapes = {}, {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    where[k], shapes[k] = f, tuple(st.get_slice(k).get_shape())
        except Exception as err:  # noqa: BLE001 - a damaged or foreign file
            raise CorruptFile(f, f"{f} cannot be read as safetensors ({type(err).__name__}: {str(err)[:160]})") from None

    def get(key):
        with safe_open(str(where[key]), framework="pt") as st:
            return st.get_tensor(key)

    return Tensors(shapes, get, kind)


def _sharded(folder: Path, index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptFile(index, f"{index} is not a weights index (no 'weight_map': {err})") from None
    return [folder / name for name in dict.fromkeys(weight_map.values())]


def open_source(path: Path) -> tuple[Tensors, dict]:
    """The tensors of ``path`` and what it is: {"kind", "run_dir"?, "record"?, "weights"?, "tokenizer"?}."""
    if not path.exists():
        raise UserError(f"{path} does not exist; give a .pt or .safetensors file, a Hugging Face model folder or a "
                        f"run folder (outputs/runs/<hash>)")
    if path.is_dir():
        if (path / "result.json").is_file():
            return _run_folder(path)
        if (path / "config.json").is_file():
            info = {"kind": "Hugging Face model folder"}
            if (path / "tokenizer.json").is_file():
                info["tokenizer"] = path / "tokenizer.json"
            for name, index in (("model.safetensors", "model.safetensors.index.json"),
                                ("pytorch_model.bin", "pytorch_model.bin.index.json")):
                files = [path / name] if (path / name).is_file() else (
                    _sharded(path, path / index) if (path / index).is_file() else [])
                if files and name.endswith(".safetensors"):
                    return _safetensors_files(files, info["kind"]), info
                if files:
                    tensors = {}
                    for f in files:
                        tensors.update(_torch_file(f))
                    return _from_dict(tensors, info["kind"]), info
            raise UserError(f"{path} has config.json but no model.safetensors or pytorch_model.bin (nor their "
                            f".index.json); download the model's weights into it")
        raise UserError(f"{path} is a folder that is neither a Hugging Face model folder (config.json) nor a run folder "
                        f"(result.json); give one of those, or a .pt / .safetensors file")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return _safetensors_files([path], "safetensors file"), {"kind": "safetensors file"}
    if suffix in (".pt", ".pth", ".bin"):
        return _from_dict(_torch_file(path), "torch file"), {"kind": "torch file"}
    raise UserError(f"{path}: unknown file type {suffix or '(no suffix)'!r}; expected a .pt/.pth/.bin torch file, a "
                    f".safetensors file, a Hugging Face model folder or a run folder")


def _run_folder(run_dir: Path) -> tuple[Tensors, dict]:
    from repdegen.core.loaders import load_run_record

    record = load_run_record(run_dir / "result.json", "restore it from a copy, or train the run again")
    final = (record.get("metrics") or {}).get("final") or {}
    names = [final["weights"]] if isinstance(final.get("weights"), str) else []
    names += [n for n in RUN_WEIGHTS if n not in names]
    weights = next((run_dir / n for n in names if (run_dir / n).is_file()), None)
    if weights is None:
        raise UserError(f"{run_dir} holds no weights ({', '.join(names)}); has the run finished an epoch?")
    info = {"kind": "run folder", "run_dir": run_dir, "record": record, "weights": weights.name,
            "final": final if final.get("weights") == weights.name else {}}
    return _from_dict(_torch_file(weights), f"run folder ({weights.name})"), info


def _matches(key: str, names: tuple[str, ...]) -> bool:
    return key in names or any(key.endswith("." + n) for n in names)


def pick_matrix(tensors: Tensors, key: str | None, path: Path) -> tuple[str, str, list[str]]:
    """(the key, why it was chosen, the other 2-D keys)."""
    two_d = [k for k, s in tensors.shapes.items() if len(s) == 2]
    listing = ", ".join(f"{k} {tuple(tensors.shapes[k])}" for k in two_d[:20]) + (" ..." if len(two_d) > 20 else "")
    if key is not None:
        if key not in tensors.shapes:
            raise UserError(f"{path} has no tensor {key!r}; its 2-D tensors: {listing or 'none'}")
        why = "chosen with --key"
    elif len(tensors.shapes) == 1:
        key, why = next(iter(tensors.shapes)), "the only tensor"
    else:
        out = [k for k in two_d if _matches(k, OUTPUT_KEYS)]
        inp = [k for k in two_d if _matches(k, INPUT_KEYS)]
        if out:
            key, why = out[0], "the output embedding (softmax weights)"
        elif inp:
            key, why = inp[0], "the input embedding (no output embedding found: tied or absent)"
        else:
            raise UserError(f"{path}: no embedding matrix found by name; pick one with --key, its 2-D tensors: "
                            f"{listing or 'none'}")
    shape = tensors.shapes[key]
    if len(shape) != 2:
        raise DataError(f"{path}: {key!r} is {len(shape)}-D (shape {tuple(shape)}); an embedding matrix is 2-D "
                        f"(rows x dimensions){'; its 2-D tensors: ' + listing if listing else ''}")
    return key, why, [k for k in two_d if k != key]


def check_finite(w: torch.Tensor, key: str) -> None:
    bad = (~torch.isfinite(w)).any(dim=1).nonzero().reshape(-1)
    if bad.numel():
        first = ", ".join(str(int(i)) for i in bad[:10])
        raise DataError(f"{key!r} has {bad.numel():,} of {w.shape[0]:,} rows with NaN or inf values (first ids: "
                        f"{first}); the geometry is undefined: fix or drop those rows, or pass another matrix")


# ---- the counts ----------------------------------------------------------------------------------------------------
INTEGER_LINE = re.compile(r"^\s*\d+\s*$")


def _counts_from_list(values, path: Path) -> torch.Tensor:
    try:
        t = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        t = None
    if t is None or not bool(torch.isfinite(t).all()) or bool((t < 0).any()) or bool((t != t.round()).any()):
        raise DataError(f"{path}: expected non-negative integer counts, one per row id")
    return t.long()


def counts_tensor(path: Path, label: Path) -> torch.Tensor:
    """The counts a 1-D tensor file holds (a run's ``vocab_counts.pt``): non-negative integers, one per row id."""
    return _counts_from_list(_torch_file(path).popitem()[1], label)


def read_counts(path: Path, v: int, counts_as: str, count_corpus) -> tuple[torch.Tensor, str]:
    """(counts of each of the v rows, how they were read). ``counts_as``: "auto" (a .json list, a .pt tensor, a text
    file of one integer a line, else a text corpus), "counts" or "text"; a text corpus is counted by
    ``count_corpus(lines, path) -> (counts, how)``, which knows the matrix's tokenizer."""
    if not path.is_file():
        raise UserError(f"--counts {path}: no such file")
    suffix = path.suffix.lower()
    if counts_as != "text" and suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except ValueError as err:
            raise DataError(f"{path}: not valid JSON ({err}); expected a list of counts, one per row id") from None
        c, how = _counts_from_list(data.get("counts") if isinstance(data, dict) else data, path), "a JSON list of counts"
    elif counts_as != "text" and suffix in (".pt", ".pth"):
        c, how = counts_tensor(path, path), "a tensor of counts"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: not UTF-8 text ({err})") from None
        lines = [line for line in text.splitlines() if line.strip()]
        if counts_as == "counts" or (counts_as == "auto" and lines and all(INTEGER_LINE.match(x) for x in lines)):
            c, how = _counts_from_list([int(x) for x in lines], path), "one count per row id (one integer a line)"
        else:
            c, how = count_corpus(lines, path)
    if c.numel() != v:
        raise DataError(f"--counts {path}: {c.numel():,} counts for a matrix of {v:,} rows (another vocabulary?); "
                        f"expected one count per row id")
    return c, f"`{path}`, {how}"
