"""Atomic checkpoints: model + optimizer + RNG + memory + data position.

A checkpoint is a folder `ckpt-00001234/` holding `state.safetensors` (all
tensors), `state.json` (step, data position, configs) and, written last,
`manifest.json` (the sha256 and size of the two others). It is written
under a temporary name and renamed into place, then `latest.json` is
replaced atomically: a run killed at any moment leaves either the previous
checkpoint or the new one, never a half-written one under a final name.

Renames do not protect against a disk that flips or loses bytes later:
`read()` checks every file against the manifest (and the weights for
NaN/Inf) and raises `CheckpointError` naming the damaged file;
`CheckpointManager.restore_candidates()` lets the trainer fall back to the
newest intact checkpoint. Only the last `keep` checkpoints are kept. No
pickle anywhere.
"""

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile

import numpy as np

from keras_txl.checks import WEIGHT_DTYPES
from keras_txl.folders import model_weights_file
from keras_txl.folders import sha256_tree
from keras_txl.folders import verify_manifest
from keras_txl.io import atomic_write_bytes
from keras_txl.io import sha256_file
from keras_txl.limits import check_config
from keras_txl.safe_files import default_mode
from keras_txl.safe_files import open_regular_file
from keras_txl.safe_files import remove_path

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{8})$")
MANIFEST = "manifest.json"
STATE = "state.json"
TENSORS = "state.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""

    def __init__(self, message, path):
        super().__init__(message)
        self.path = path


def _write_synced(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def non_finite_tensors(tensors, prefix="model/"):
    """Names of the float tensors under `prefix` holding NaN or Inf."""
    return sorted(
        name for name, value in tensors.items()
        if name.startswith(prefix) and np.issubdtype(value.dtype, np.floating)
        and not np.all(np.isfinite(value))
    )


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(path, json.dumps(data, indent=2, sort_keys=True).encode())


def rng_variables(model):
    """Variables of the model that are neither weights nor memory: the
    dropout seed generators (saved so a resumed run draws the same masks)."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def optimizer_parts(optimizer):
    """`(inner optimizer, {key: loss-scale variable})` of a training optimizer.

    A `keras.optimizers.LossScaleOptimizer` (mixed_float16) holds its own
    variables (the dynamic scale, its good-step counter) besides those of
    the optimizer it wraps: they are saved under `loss_scale/<name>`, the
    wrapped optimizer's under `optimizer/<index>` as without loss scaling,
    so the weights' optimizer state reads the same in both.
    """
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return optimizer, {}
    wrapped = {id(v) for v in inner.variables}
    own = {f"loss_scale/{v.name}": v for v in optimizer.variables
           if id(v) not in wrapped}
    return inner, own


def collect_tensors(model, optimizer):
    tensors = {}
    for w in model.model_weights():
        tensors[f"model/{w.path}"] = np.asarray(w.numpy())
    for i, v in enumerate(rng_variables(model)):
        tensors[f"rng/{i:04d}"] = np.asarray(v.numpy())
    if optimizer is not None:
        inner, loss_scale = optimizer_parts(optimizer)
        for i, v in enumerate(inner.variables):
            tensors[f"optimizer/{i:04d}"] = np.asarray(v.numpy())
        for key, v in loss_scale.items():
            tensors[key] = np.asarray(v.numpy())
    return tensors


def assign_tensors(tensors, model, optimizer, source="checkpoint"):
    def put(variable, key):
        if key not in tensors:
            raise ValueError(
                f"{source}: missing {key!r}; the checkpoint comes from another "
                "model or optimizer configuration."
            )
        value = tensors[key]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"{source}: {key!r} has shape {tuple(value.shape)}, the model "
                f"needs {tuple(variable.shape)}: a checkpoint from another config?"
            )
        variable.assign(value)

    for w in model.model_weights():
        put(w, f"model/{w.path}")
    for i, v in enumerate(rng_variables(model)):
        put(v, f"rng/{i:04d}")
    if optimizer is not None:
        inner, loss_scale = optimizer_parts(optimizer)
        for i, v in enumerate(inner.variables):
            put(v, f"optimizer/{i:04d}")
        saved = sorted(k for k in tensors if k.startswith("loss_scale/"))
        if loss_scale and not saved:
            logger.warning(
                "%s was written without loss scaling (not mixed_float16): the "
                "loss scale starts from its initial value.", source)
        elif saved and not loss_scale:
            logger.warning(
                "%s was written with loss scaling (mixed_float16); this run has "
                "none, so its loss scale is not used.", source)
        elif loss_scale:
            for key, v in loss_scale.items():
                put(v, key)


def _written_with_manifest(tensors_path):
    """True when a checkpoint's tensors file says its checkpoint was
    written with a manifest (its safetensors metadata, since the
    twenty-first session; earlier checkpoints carry no such mark)."""
    import struct

    try:
        with open_regular_file(tensors_path, "checkpoint file") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return False
            (size,) = struct.unpack("<Q", prefix)
            if size > 100 << 20:
                return False
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return False
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(metadata, dict) and metadata.get("manifest") == "required"


class CheckpointManager:
    """Writes, lists, prunes and restores checkpoints in `directory`."""

    def __init__(self, directory, keep=3):
        self.directory = directory
        self.keep = keep
        os.makedirs(directory, exist_ok=True)

    def checkpoints(self):
        """Complete checkpoints, oldest first."""
        found = []
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            path = os.path.join(self.directory, name)
            if match and os.path.exists(os.path.join(path, "state.json")):
                found.append((int(match.group(1)), path))
        return [p for _, p in sorted(found)]

    def latest(self):
        """Path of the newest complete checkpoint (the highest step), or
        None. `latest.json` names it too, but it is written after the
        checkpoint's rename: a kill in between leaves it naming the one
        before, so the folders decide."""
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, step, model, optimizer, memory, state):
        """Writes checkpoint `step`. `memory` is a numpy array or None."""
        from safetensors.numpy import save as to_bytes

        tensors = collect_tensors(model, optimizer)
        if memory is not None:
            tensors["memory"] = np.ascontiguousarray(memory, dtype=np.float32)
        poisoned = non_finite_tensors(tensors, prefix="")
        if poisoned:
            # Never write a checkpoint a later resume would call good (`read`
            # refuses the same tensors).
            raise FloatingPointError(
                f"Not writing checkpoint {step}: the weights, the optimizer's "
                f"state or the memory hold NaN/Inf ({poisoned[:3]}...); the "
                "previous checkpoints are kept."
            )
        name = f"ckpt-{step:08d}"
        final = os.path.join(self.directory, name)
        tmp = None
        try:
            # Inside the try: a full disk or a read-only folder fails here
            # already (was a bare "[Errno 28] No space left on device").
            tmp = tempfile.mkdtemp(dir=self.directory, prefix=f".{name}.tmp-")
            os.chmod(tmp, default_mode(directory=True))
            files = {
                TENSORS: _write_synced(
                    os.path.join(tmp, TENSORS),
                    to_bytes(tensors, metadata={"format": "keras-txl-ckpt",
                                                "manifest": "required"}),
                ),
                STATE: _write_synced(
                    os.path.join(tmp, STATE),
                    json.dumps({**state, "step": step}, indent=2,
                               sort_keys=True).encode(),
                ),
            }
            # The manifest last: the checksums the reader verifies.
            _write_synced(
                os.path.join(tmp, MANIFEST),
                json.dumps({"format": "keras-txl-ckpt/2", "step": step,
                            "files": files}, indent=2, sort_keys=True).encode(),
            )
            if os.path.lexists(final):  # a damaged one of this step
                if os.path.islink(final) or not os.path.isdir(final):
                    # A file or a link put there: rmtree failed on it, and
                    # every later save of this step with it.
                    logger.warning("%s is not a checkpoint folder: replacing it.", final)
                remove_path(final)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        except OSError as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(
                f"Writing checkpoint {final} failed ({e}); the previous "
                "checkpoint is intact."
            ) from e
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        write_json_atomic(
            os.path.join(self.directory, "latest.json"), {"name": name, "step": step}
        )
        self._prune()
        return final

    def _prune(self):
        for path in self.checkpoints()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        # Leftovers of killed writes (the workdir's lock keeps other writers
        # out): checkpoint folders and `latest.json`'s temporary files.
        for name in os.listdir(self.directory):
            if name.startswith(".ckpt-") or name.startswith(".tmp-"):
                remove_path(os.path.join(self.directory, name))

    def restore_candidates(self):
        """Checkpoints to try when resuming, newest (highest step) first."""
        return self.checkpoints()[::-1]

    def newest_intact(self, warn=True):
        """(path, tensors, state) of the newest checkpoint that verifies,
        or None when there is none. Damaged newer ones are skipped with a
        warning naming the file; if every checkpoint is damaged, the
        newest one's `CheckpointError` is raised."""
        errors = []
        for path in self.restore_candidates():
            try:
                tensors, state = self.read(path)
            except CheckpointError as e:
                errors.append(e)
                continue
            if errors and warn:
                logger.warning(
                    "Skipping damaged checkpoint(s): %s. Falling back to %s "
                    "(step %d).", " | ".join(str(e) for e in errors), path,
                    int(state["step"]),
                )
            return path, tensors, state
        if errors:
            raise errors[0]
        return None

    @staticmethod
    def verify(path):
        """Checks the files of checkpoint `path` against its manifest.

        Raises `CheckpointError` naming the damaged or missing file.
        Checkpoints written before manifests existed are accepted with a
        warning (nothing to verify them against).
        """
        manifest_path = os.path.join(path, MANIFEST)
        if not os.path.exists(manifest_path):
            if _written_with_manifest(os.path.join(path, TENSORS)):
                # Deleting the manifest must not turn verification off.
                raise CheckpointError(
                    f"Checkpoint {path} has no {MANIFEST}, which it was written with "
                    f"(its {TENSORS} says so): its files cannot be verified.",
                    manifest_path,
                )
            if os.path.exists(os.path.join(path, STATE)):
                logger.warning("%s has no %s (an older checkpoint): its files "
                               "cannot be verified.", path, MANIFEST)
                return
            raise CheckpointError(
                f"Checkpoint {path} is incomplete: no {MANIFEST} or {STATE}.",
                manifest_path,
            )
        try:
            # (A FIFO would block the read forever, a device never end.)
            with open_regular_file(manifest_path, "checkpoint manifest") as f:
                manifest = json.loads(f.read())
            files = manifest["files"]
            if not isinstance(files, dict) or not all(
                    isinstance(entry, dict) for entry in files.values()):
                raise ValueError("'files' must map file names to objects")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"Checkpoint manifest {manifest_path} is not valid ({e}).",
                manifest_path,
            ) from None
        for name in (TENSORS, STATE):
            file = os.path.join(path, name)
            if name not in files:
                raise CheckpointError(
                    f"Checkpoint manifest {manifest_path} lists no {name}.",
                    manifest_path,
                )
            if not os.path.exists(file):
                raise CheckpointError(f"Checkpoint file {file} is missing.", file)
            try:
                open_regular_file(file, "checkpoint file").close()
            except ValueError as e:
                raise CheckpointError(str(e), file) from None
            size = os.path.getsize(file)
            if size != files[name].get("bytes", size):
                raise CheckpointError(
                    f"Checkpoint file {file} is truncated or damaged: "
                    f"{size} bytes, the manifest says {files[name]['bytes']}.",
                    file,
                )
            if sha256_file(file) != files[name].get("sha256"):
                raise CheckpointError(
                    f"Checkpoint file {file} is corrupted: its sha256 does not "
                    f"match {manifest_path}.", file,
                )

    @staticmethod
    def read(path):
        """(tensors, state) of the checkpoint at `path`, verified.

        Raises:
            CheckpointError: a missing, truncated, corrupted or unreadable
                file, or NaN/Inf weights; the message names the file.
        """
        from keras_txl.weights_file import read_safetensors

        CheckpointManager.verify(path)
        state_path = os.path.join(path, STATE)
        try:
            with open_regular_file(state_path, "checkpoint file") as f:
                state = json.loads(f.read())
            int(state["step"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"Checkpoint file {state_path} is not valid JSON with a step "
                f"({e}).", state_path,
            ) from None
        tensors_path = os.path.join(path, TENSORS)
        try:
            tensors = read_safetensors(tensors_path)
        except ValueError as e:
            raise CheckpointError(str(e), tensors_path) from None
        # Weights, the optimizer's state and the memory alike: a resume from
        # any of them poisoned would diverge at once and blame the step.
        poisoned = non_finite_tensors(tensors, prefix="")
        if poisoned:
            raise CheckpointError(
                f"Checkpoint file {tensors_path} holds NaN/Inf values "
                f"({poisoned[:3]}): not a good checkpoint.", tensors_path,
            )
        wrong = [f"{name} ({value.dtype.name})" for name, value in sorted(tensors.items())
                 if (name.startswith("model/") or name == "memory")
                 and value.dtype.name not in WEIGHT_DTYPES]
        if wrong:
            raise CheckpointError(
                f"Checkpoint file {tensors_path}: {', '.join(wrong[:3])}: weights "
                f"and memory must be one of {', '.join(WEIGHT_DTYPES)}.", tensors_path,
            )
        return tensors, state


# --- a model from a workdir's checkpoints (eval, generate, export) -------
def find_checkpoint(workdir, checkpoint):
    """The checkpoint folder `--checkpoint` names: a path, a folder name in
    WORKDIR/checkpoints (`ckpt-00001800`), or a step number (`1800`)."""
    directory = os.path.join(workdir, "checkpoints")
    text = str(checkpoint)
    if not text.strip():  # os.path.join(directory, "") is the folder itself
        raise ValueError("--checkpoint is empty: pass a checkpoint folder, a name such "
                         "as ckpt-00001800, or a step.")
    candidates = [text, os.path.join(directory, text)]
    if text.isdigit():
        candidates.append(os.path.join(directory, f"ckpt-{int(text):08d}"))
    for path in candidates:
        if os.path.isdir(path):
            return path
    available = CheckpointManager(directory).checkpoints() if os.path.isdir(
        directory) else []
    raise ValueError(
        f"--checkpoint {text!r}: no such checkpoint (a folder, a name in "
        f"{directory}, or a step). Available: "
        f"{[os.path.basename(p) for p in available] or 'none'}."
    )


def workdir_model_source(workdir, checkpoint=None):
    """Where `txl eval/generate/export --workdir` read the model from.

    Returns ("model", WORKDIR/model) when the model folder is there and not
    older than the newest checkpoint, else ("checkpoint", path) for the
    chosen (`checkpoint`) or newest intact checkpoint.

    Raises:
        ValueError: no model folder and no (intact) checkpoint.
    """
    if checkpoint is not None:
        path = find_checkpoint(workdir, checkpoint)
        CheckpointManager.verify(path)
        return "checkpoint", path
    model_dir = os.path.join(workdir, "model")
    directory = os.path.join(workdir, "checkpoints")
    newest = None
    if os.path.isdir(directory):
        found = CheckpointManager(directory).newest_intact()
        newest = found[0] if found else None
    try:
        weights = model_weights_file(model_dir)
    except ValueError as error:  # a FIFO, a device: damaged, not missing
        if newest is None:
            raise
        logger.warning("The model folder is damaged (%s); using the newest "
                       "intact checkpoint %s instead.", error, newest)
        return "checkpoint", newest
    if weights is not None:
        if newest is None or os.path.getmtime(weights) >= os.path.getmtime(
            os.path.join(newest, STATE)
        ):
            try:
                verify_manifest(model_dir)
            except ValueError as error:
                if newest is None:
                    raise
                # The checkpoint is verified too, and the model folder is a
                # copy of one: use the newest intact checkpoint, said loudly.
                logger.warning("The model folder is damaged (%s); using the newest "
                               "intact checkpoint %s instead.", error, newest)
                return "checkpoint", newest
            return "model", model_dir
        logger.info("%s is newer than %s: using the checkpoint.", newest, model_dir)
    if newest is not None:
        return "checkpoint", newest
    _refuse_model_folder(workdir)
    raise ValueError(
        f"No model in {model_dir}/ and no checkpoint in {directory}/: train "
        "first (`txl train --workdir ...`)."
    )


def _refuse_model_folder(workdir):
    """A ValueError when `--workdir` names a model folder itself (a run's
    WORKDIR/model, or a saved preset) rather than a training workdir."""
    try:
        weights = model_weights_file(workdir)
    except ValueError:
        return
    if weights is None or not os.path.isfile(os.path.join(workdir, "config.json")):
        return
    parent = os.path.dirname(os.path.abspath(workdir))
    if os.path.basename(os.path.abspath(workdir)) == "model" and any(
            os.path.lexists(os.path.join(parent, name))
            for name in ("checkpoints", "train_config.json")):
        parent = os.path.dirname(workdir.rstrip(os.sep)) or "."
        advice = f"pass the workdir that holds it, --workdir {parent!r}."
    else:
        advice = ("`txl eval/generate/export/attention --workdir` read a training run's "
                  "WORKDIR/model/; "
                  f"pass this folder as --from-preset {workdir!r} instead.")
    raise ValueError(
        f"--workdir {workdir!r} is a model folder, not a training workdir: {advice}")


def model_from_checkpoint(path):
    """A `TransformerXLCausalLM` with the weights of checkpoint `path`."""
    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig

    tensors, state = CheckpointManager.read(path)
    if "model_config" not in state:
        raise CheckpointError(
            f"Checkpoint file {os.path.join(path, STATE)} has no model_config.",
            os.path.join(path, STATE),
        )
    state_path = os.path.join(path, STATE)
    try:
        config = TransformerXLConfig.from_dict(state["model_config"])
        check_config(config, source=state_path)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{state_path}: model_config: {e}", state_path) from None
    model = TransformerXLCausalLM(config)
    for w in model.model_weights():
        key = f"model/{w.path}"
        if key not in tensors:
            raise CheckpointError(f"{path}: missing {key!r}.", path)
        if tuple(tensors[key].shape) != tuple(w.shape):
            raise CheckpointError(
                f"{path}: {key!r} has shape {tuple(tensors[key].shape)}, but the "
                f"model_config in {state_path} needs {tuple(w.shape)}.", path)
        w.assign(tensors[key])
    logger.info("Model from checkpoint %s (step %d).", path, int(state["step"]))
    return model


def tokenizer_record(tokenizer):
    """What a checkpoint's state records of the tokenizer it was trained
    with: `{"tokenizer_sha256": ...}` of a tokenizer folder, else {}."""
    if isinstance(tokenizer, (str, os.PathLike)) and os.path.isdir(tokenizer):
        return {"tokenizer_sha256": sha256_tree(tokenizer)}
    return {}


def check_checkpoint_tokenizer(path, workdir, remedy=None):
    """A checkpoint holds no tokenizer: eval, generate and export read it
    with WORKDIR/tokenizer. Refuses that tokenizer when it is not the one
    the checkpoint was trained with (its ids would be read as other
    tokens, in silence): by the tokenizer sha256 the checkpoint records,
    or, for checkpoints written before that, by the train shards' key it
    records against the workdir's train shards now (prepared again
    since: possibly with another tokenizer)."""
    from keras_txl.training import shards

    tokenizer_dir = os.path.join(workdir, "tokenizer")
    try:
        with open_regular_file(os.path.join(path, STATE), "checkpoint file") as f:
            state = json.loads(f.read())
    except (OSError, ValueError):
        return  # `read` names a damaged state.json
    if not isinstance(state, dict):
        return
    remedy = remedy or (f"Use the model folder written with it (which holds its "
                        f"tokenizer), or restore {tokenizer_dir} as it was.")
    recorded = state.get("tokenizer_sha256")
    if recorded:
        now = sha256_tree(tokenizer_dir) if os.path.isdir(tokenizer_dir) else None
        if now != recorded:
            raise ValueError(
                f"{path} was trained with another tokenizer than {tokenizer_dir} "
                f"({'missing' if now is None else 'changed'} since: the checkpoint "
                "records its sha256). A checkpoint holds no tokenizer of its own, so "
                f"its ids would be read as other tokens. {remedy}")
        return
    data = state.get("data")
    trained_on = data.get("shards_key") if isinstance(data, dict) else None
    train_folder = os.path.join(workdir, "data", "train")
    if trained_on and shards.is_complete(train_folder):
        tokens = shards.ShardedTokens(train_folder)
        try:
            key = tokens.key
        finally:
            tokens.close()
        if key != trained_on:
            raise ValueError(
                f"{path} was trained on other tokens than {train_folder} holds now "
                f"(key {trained_on}, now {key}): the workdir's data was prepared again "
                "since, possibly with another tokenizer, and this checkpoint does not "
                f"record its own. {remedy}")


def materialize_model_folder(workdir, checkpoint=None, out=None):
    """A model folder for `workdir`: WORKDIR/model, or one written from a
    checkpoint to `out` (default: a new temporary folder) with the
    workdir's tokenizer. Returns its path."""
    from keras_txl.io import save_preset

    kind, path = workdir_model_source(workdir, checkpoint)
    if kind == "model":
        return path
    check_checkpoint_tokenizer(path, workdir)
    out = out or tempfile.mkdtemp(prefix="txl-ckpt-model-")
    tokenizer = os.path.join(workdir, "tokenizer")
    save_preset(model_from_checkpoint(path), out,
                tokenizer=tokenizer if os.path.isdir(tokenizer) else None)
    return out
